"""The real consumers of what the project produces, run offline: Helm (from the pinned kubectl layer
package), the Helm chart cache, Kubernetes' own schemas, and cfn-guard with Control Tower's rules.

CDK-free: the binaries come out of the pinned packages' files; nothing here imports CDK or jsii.
"""
