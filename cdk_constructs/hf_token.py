"""A gated model's Hugging Face token, from AWS Secrets Manager to every GPU worker by reference.

The Secrets Store CSI driver with AWS's provider (ASCP) mounts the secret as a file in each GPU
worker pod, read with the workers' own EKS Pod Identity role, and ``HF_TOKEN_PATH`` points
``huggingface_hub`` at it. The value is in no template, Serve config, runtime_env or environment
variable: Ray Serve LLM copies ``HF_TOKEN``/``HUGGING_FACE_HUB_TOKEN`` from a replica's
environment into the runtime_env of the tasks it starts (GCS, dashboard), but not a file path.
A pod started after a rotation mounts the new value; running pods see it within the driver's
rotation poll interval. The driver and the provider need Kubernetes RBAC only (their charts
install it); AWS access is the mounting pod's.
"""

from __future__ import annotations

from aws_cdk import Stack
from aws_cdk import aws_eks_v2 as eks
from aws_cdk import aws_iam as iam
from aws_cdk import aws_secretsmanager as secretsmanager
from constructs import Construct

from cdk_constructs.addons import HelmAddon
from config.versions import SECRETS_STORE_CSI_DRIVER, SECRETS_STORE_CSI_PROVIDER_AWS
from manifests.contract import CSI_DRIVER_RELEASE, CSI_NAMESPACE, CSI_PROVIDER_RELEASE
from manifests.hf_token import driver_values, provider_values, secret_provider_class


def imported_secret(scope: Construct, id_: str, name_or_arn: str) -> secretsmanager.ISecret:
    """The token's secret, named as the config names it: a complete ARN, or a name in the stack's region."""
    if name_or_arn.startswith("arn:"):
        return secretsmanager.Secret.from_secret_complete_arn(scope, id_, name_or_arn)
    return secretsmanager.Secret.from_secret_name_v2(scope, id_, name_or_arn)


def grant_token_key(scope: Construct, grantee: iam.IGrantable, key_arn: str) -> None:
    """``kms:Decrypt`` on the customer-managed key the token secret is encrypted with, and only through
    Secrets Manager in the stack's region. An imported secret's ``grant_read`` adds none, and without
    it Secrets Manager cannot decrypt the value for the mounting pod's role (the CSI mount fails).
    ``key_arn`` is what `make deploy`'s guard resolved (``DeployFacts.hf_token_kms_key_arn``)."""
    grantee.grant_principal.add_to_principal_policy(
        iam.PolicyStatement(
            actions=["kms:Decrypt"],
            resources=[key_arn],
            conditions={"StringEquals": {"kms:ViaService": f"secretsmanager.{Stack.of(scope).region}.amazonaws.com"}},
        )
    )


class HuggingFaceToken(Construct):
    """The CSI driver, AWS's provider and the SecretProviderClass of the configured token secret.

    Without a token secret (``secret`` None) it installs only the driver and the provider, for GCS
    fault tolerance's Secret sync (``sync_secrets``); the construct keeps its id either way, so that
    turning fault tolerance on never replaces a deployed driver's Helm release.

    Args:
        cluster: the EKS cluster.
        namespace: the RayService's namespace (the SecretProviderClass lives beside its pods).
        secret: the configured secret's name or ARN (``serving.model.hf_token_secret``), or None.
        driver_version: chart version of the Secrets Store CSI driver.
        provider_version: chart version of AWS's provider.
        namespace_manifest: the namespace's manifest, which must exist first.
        sync_secrets: let the driver create Kubernetes Secrets from ``secretObjects`` (GCS fault tolerance).

    Whoever wires the stack makes ``driver`` depend on the node groups: its chart's pre-install
    hook Job needs a node within Helm's timeout.
    """

    def __init__(
        self,
        scope: Construct,
        id_: str,
        *,
        cluster: eks.Cluster,
        namespace: str,
        secret: str | None,
        driver_version: str,
        provider_version: str,
        namespace_manifest: Construct,
        sync_secrets: bool = False,
    ) -> None:
        super().__init__(scope, id_)
        region = Stack.of(self).region
        self.driver = HelmAddon(
            self,
            "Driver",
            cluster=cluster,
            pin=SECRETS_STORE_CSI_DRIVER,
            version=driver_version,
            namespace=CSI_NAMESPACE,
            release=CSI_DRIVER_RELEASE,
            values=driver_values(sync_secrets=sync_secrets),
        )
        self.provider = HelmAddon(
            self,
            "Provider",
            cluster=cluster,
            pin=SECRETS_STORE_CSI_PROVIDER_AWS,
            version=provider_version,
            namespace=CSI_NAMESPACE,
            release=CSI_PROVIDER_RELEASE,
            values=provider_values(region),
        )
        self.provider.node.add_dependency(self.driver)
        self.manifest_body = None
        self.provider_class = None
        if secret:
            self.manifest_body = secret_provider_class(namespace=namespace, secret=secret, region=region)
            self.provider_class = cluster.add_manifest("SecretProviderClass", self.manifest_body)
            # The SecretProviderClass kind comes with the driver's CRDs.
            self.provider_class.node.add_dependency(self.driver, namespace_manifest)
        # Teardown runs in reverse: the namespace, which waits for its pods (and KubeRay's Redis cleanup
        # Job, which mounts the store's token), goes before the driver and the provider that their
        # volumes are mounted and unmounted through.
        namespace_manifest.node.add_dependency(self.driver, self.provider)
