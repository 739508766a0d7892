"""Cluster add-ons installed with Helm: device plugins on the GPU nodes, KubeRay on the system nodes.

Each add-on pins its chart in ``config.versions`` and takes the version from the environment's
config, so that every chart version is visible in one place and overridable per environment.
"""

from __future__ import annotations

from typing import Any

from aws_cdk import Duration
from aws_cdk import aws_eks_v2 as eks
from constructs import Construct

from config.versions import (
    EFA_DEVICE_PLUGIN,
    KUBERAY_OPERATOR,
    NVIDIA_DEVICE_PLUGIN,
    HelmChartPin,
)
from manifests.contract import (
    EFA_DEVICE_PLUGIN_RELEASE,
    GPU_NODE_SELECTOR,
    KUBE_SYSTEM,
    KUBERAY_NAMESPACE,
    KUBERAY_RELEASE,
    NVIDIA_DEVICE_PLUGIN_RELEASE,
    SYSTEM_NODE_SELECTOR,
    gpu_tolerations,
)


class HelmAddon(Construct):
    """One pinned Helm chart installed into the cluster.

    Args:
        cluster: the EKS cluster (with a kubectl provider).
        pin: chart name and repository.
        version: the chart version to install.
        namespace: where the release lives.
        release: the Helm release name.
        values: chart values.
    """

    def __init__(
        self,
        scope: Construct,
        id_: str,
        *,
        cluster: eks.Cluster,
        pin: HelmChartPin,
        version: str,
        namespace: str,
        release: str,
        values: dict[str, Any],
    ) -> None:
        super().__init__(scope, id_)
        if not version:
            raise ValueError(f"charts: no version given for {pin.chart}; pin one")
        self.namespace = namespace
        self.chart = eks.HelmChart(
            self,
            "Chart",
            cluster=cluster,
            chart=pin.chart,
            repository=pin.repository,
            version=version,
            namespace=namespace,
            release=release,
            values=values,
            create_namespace=namespace != KUBE_SYSTEM,
            timeout=Duration.minutes(10),
        )


def nvidia_device_plugin(scope: Construct, *, cluster: eks.Cluster, version: str) -> HelmAddon:
    """Advertises ``nvidia.com/gpu`` on the GPU nodes (the AL2023 NVIDIA AMI does not)."""
    return HelmAddon(
        scope,
        "NvidiaDevicePlugin",
        cluster=cluster,
        pin=NVIDIA_DEVICE_PLUGIN,
        version=version,
        namespace=KUBE_SYSTEM,
        release=NVIDIA_DEVICE_PLUGIN_RELEASE,
        values={"nodeSelector": GPU_NODE_SELECTOR, "tolerations": gpu_tolerations()},
    )


def efa_device_plugin(scope: Construct, *, cluster: eks.Cluster, version: str) -> HelmAddon:
    """Advertises ``vpc.amazonaws.com/efa``; it tolerates no taint unless told, and must not run
    on nodes without EFA (it reports no devices there)."""
    return HelmAddon(
        scope,
        "EfaDevicePlugin",
        cluster=cluster,
        pin=EFA_DEVICE_PLUGIN,
        version=version,
        namespace=KUBE_SYSTEM,
        release=EFA_DEVICE_PLUGIN_RELEASE,
        values={"nodeSelector": GPU_NODE_SELECTOR, "tolerations": gpu_tolerations()},
    )


def kuberay_operator(scope: Construct, *, cluster: eks.Cluster, version: str) -> HelmAddon:
    """The KubeRay operator (and its CRDs), on the system nodes."""
    return HelmAddon(
        scope,
        "KubeRayOperator",
        cluster=cluster,
        pin=KUBERAY_OPERATOR,
        version=version,
        namespace=KUBERAY_NAMESPACE,
        release=KUBERAY_RELEASE,
        values={"nodeSelector": SYSTEM_NODE_SELECTOR},
    )
