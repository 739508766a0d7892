"""The values of the cluster-autoscaler chart: how Cluster Autoscaler finds and scales the node groups."""

from __future__ import annotations

from config.versions import CLUSTER_AUTOSCALER_IMAGE
from manifests.contract import AUTOSCALER_NAME, AUTOSCALER_SERVICE_ACCOUNT, SYSTEM_NODE_SELECTOR


def chart_values(*, cluster_name: str, region: str, image_tag: str, scale_down_idle_minutes: int) -> dict:
    """Values of the cluster-autoscaler chart (9.59.0 keys)."""
    return {
        # Named plainly (not <release>-aws-cluster-autoscaler), so `make verify` finds it.
        "fullnameOverride": AUTOSCALER_NAME,
        "cloudProvider": "aws",
        "awsRegion": region,
        "autoDiscovery": {"clusterName": cluster_name},
        "image": {"repository": CLUSTER_AUTOSCALER_IMAGE, "tag": image_tag},
        # The service account is created by the stack with its Pod Identity association.
        "rbac": {"serviceAccount": {"create": False, "name": AUTOSCALER_SERVICE_ACCOUNT}},
        "nodeSelector": SYSTEM_NODE_SELECTOR,
        "extraArgs": {
            "expander": "least-waste",
            # Prefill and decode groups look alike to the autoscaler; they must never be balanced.
            "balance-similar-node-groups": "false",
            "scale-down-unneeded-time": f"{scale_down_idle_minutes}m",
            "scale-down-delay-after-add": f"{scale_down_idle_minutes}m",
            # DaemonSets (device plugins, CNI) run on every node; they must not keep a GPU node alive.
            "skip-nodes-with-system-pods": "false",
        },
    }
