"""Every Kubernetes object the stack applies, as data: no CDK here, so that tests, `make verify`,
`make mirror-model` and KubeRay's mirrored rules take the very objects the constructs apply.
``manifests.contract`` names what all of them share."""
