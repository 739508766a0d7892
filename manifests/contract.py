"""The names every part of the deployment shares: labels, taints, tolerations, worker groups, ports,
containers, service accounts, Helm releases and namespaces.

The node groups set these labels and taints, the RayService selects and tolerates them, the charts
are installed under these releases, and `make verify` and the mirror Job look things up by them.
Each name is written here once; everything else imports it.
"""

from __future__ import annotations

# The phases, the custom Ray resource of each and Serve's port belong to the serving app; they are
# part of the contract too.
from serve_app.serve_config import SERVE_PORT as SERVE_PORT
from serve_app.spec import PHASE_RESOURCE as PHASE_RESOURCE
from serve_app.spec import PHASES as PHASES

# --- node labels and taints ----------------------------------------------------------------------
ROLE_LABEL = "role"
SYSTEM_ROLE = "system"
GPU_ROLE = "gpu"
PHASE_LABEL = "pd-serving/phase"
GPU_TAINT_KEY = "nvidia.com/gpu"
EFA_TAINT_KEY = "aws.amazon.com/efa"
# NVIDIA's device plugin chart (0.20.0) keeps a default node affinity on top of any nodeSelector:
# it runs only where NFD's PCI labels or this label say "NVIDIA GPU". EKS's AL2023 NVIDIA nodes
# carry it only from Kubernetes 1.35, so the GPU groups set it for every version the config accepts.
NVIDIA_GPU_PRESENT_LABEL = "nvidia.com/gpu.present"
# Cluster Autoscaler's AWS provider (GPULabel, cluster-autoscaler-1.36.1
# cloudprovider/aws/aws_cloud_provider.go): a node with it but no GPU allocatable yet is "GPU not
# ready", not a node that failed to fit the pending pods, so no second scale-up starts while the
# device plugin registers. Its value is the GPU type (config.catalog, ``autoscaler_gpu_type``).
AUTOSCALER_GPU_LABEL = "k8s.amazonaws.com/accelerator"

SYSTEM_NODE_SELECTOR = {ROLE_LABEL: SYSTEM_ROLE}
GPU_NODE_SELECTOR = {ROLE_LABEL: GPU_ROLE}

# --- extended resources the device plugins advertise ---------------------------------------------
GPU_RESOURCE = "nvidia.com/gpu"
EFA_RESOURCE = "vpc.amazonaws.com/efa"


def gpu_tolerations() -> list[dict[str, str]]:
    """What a pod needs to run on a GPU node: both of its taints."""
    return [
        {"key": GPU_TAINT_KEY, "operator": "Exists", "effect": "NoSchedule"},
        {"key": EFA_TAINT_KEY, "operator": "Exists", "effect": "NoSchedule"},
    ]


# --- Ray worker groups: one per phase --------------------------------------------------------------
WORKER_GROUP_SUFFIX = "-gpu"


def worker_group_name(phase: str) -> str:
    return f"{phase}{WORKER_GROUP_SUFFIX}"


# KubeRay's ray.io/group label of a worker pod -> the phase it serves.
WORKER_GROUPS: dict[str, str] = {worker_group_name(phase): phase for phase in PHASES}
# The same, as a regular expression whose first group is the phase (Prometheus relabelling).
WORKER_GROUP_PHASE_REGEX = "(" + "|".join(PHASES) + ")" + WORKER_GROUP_SUFFIX

# --- Ray pods ---------------------------------------------------------------------------------------
HEAD_CONTAINER = "ray-head"
WORKER_CONTAINER = "ray-worker"
# The labels KubeRay 1.7.0 puts on every pod of a RayCluster (controllers/ray/utils/constant.go):
# ray.io/is-ray-node=yes, ray.io/node-type head|worker, ray.io/group headgroup|<worker group name>.
# ray.io/cluster changes with every NewCluster upgrade (a new RayCluster name), so nothing selects on it.
RAY_NODE_LABEL = "ray.io/is-ray-node"
RAY_NODE_TYPE_LABEL = "ray.io/node-type"
RAY_GROUP_LABEL = "ray.io/group"
RAY_PODS_SELECTOR = f"{RAY_NODE_LABEL}=yes"
GCS_PORT = 6379
DASHBOARD_PORT = 8265
CLIENT_PORT = 10001
METRICS_PORT = 8080
# Every Ray pod exports its node's metrics on the container port of this name; the scrapers keep it.
METRICS_PORT_NAME = "metrics"
# The head and the GPU workers run as service accounts of their own, each with a Pod Identity role
# that reads only what its pods mount or fetch. The head's keeps the name of the one account that
# head and workers shared before: a deployed stack keeps it (and its role) through the NewCluster
# upgrade the split starts, so the old cluster's head, its autoscaler's RoleBinding and its Redis
# cleanup Job (built from the head's pod: raycluster_controller.go, buildRedisCleanupJob) keep theirs.
RAY_HEAD_SERVICE_ACCOUNT = "ray-serve"
RAY_WORKER_SERVICE_ACCOUNT = "ray-gpu-worker"
# Where `make mirror-model` puts the model streamer's wheels in the mirror bucket, beside the models'
# prefixes, and where the streaming GPU workers fetch them from.
STREAMER_WHEELS_PREFIX = "_wheels/model-streamer"
MIRROR_SERVICE_ACCOUNT = "model-mirror"

# --- Helm releases and their namespaces -------------------------------------------------------------
KUBE_SYSTEM = "kube-system"
KUBERAY_NAMESPACE = "kuberay-system"
KUBERAY_RELEASE = "kuberay-operator"
# The operator pod's labels in the chart (kuberay-operator 1.7.0, templates/deployment.yaml):
# app.kubernetes.io/name is the chart's name; Ray pods carry app.kubernetes.io/created-by=kuberay-operator,
# so only the name tells the operator apart.
KUBERAY_OPERATOR_LABELS = {"app.kubernetes.io/name": "kuberay-operator", "app.kubernetes.io/instance": KUBERAY_RELEASE}
NVIDIA_DEVICE_PLUGIN_RELEASE = "nvidia-device-plugin"
EFA_DEVICE_PLUGIN_RELEASE = "aws-efa-k8s-device-plugin"
AUTOSCALER_NAMESPACE = KUBE_SYSTEM
# The chart's fullnameOverride: the Deployment, its status ConfigMap's prefix and its service account.
AUTOSCALER_NAME = "cluster-autoscaler"
AUTOSCALER_RELEASE = AUTOSCALER_NAME
AUTOSCALER_SERVICE_ACCOUNT = AUTOSCALER_NAME
# The autoscaler's default status ConfigMap (--status-config-map-name), which `make verify` reads.
AUTOSCALER_STATUS_CONFIGMAP = "cluster-autoscaler-status"
CSI_NAMESPACE = KUBE_SYSTEM
CSI_DRIVER_RELEASE = "secrets-store-csi-driver"
CSI_PROVIDER_RELEASE = "secrets-store-csi-driver-provider-aws"
