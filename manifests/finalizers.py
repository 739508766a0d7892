"""The finalizers that the cluster's controllers put on the objects this stack applies, who takes each
off, and what that owner needs to do it, as data.

`make destroy` is CloudFormation deleting the stack's resources in reverse dependency order, and the
kubectl handler's ``kubectl delete`` waits until an object is gone: until its finalizers are off, and,
for a Namespace, until everything in it is gone (its own ``kubernetes`` finalizer). An object that
carries a finalizer is deleted by the resource that applies it, or by the resource that applies its
Namespace; both are its carriers. Whatever its owner needs to act (the controller's chart and the
nodes its pod runs on, the pods it starts, their identity, volumes and store) must be deleted after
every carrier, or the wait outlasts the handler's 15 minutes and the stack is DELETE_FAILED on every
retry. tests/stacks/test_destroy_order.py checks it on the synthesized templates of dev, prod and
their variants; the stack wires the namespace after those needs (``stacks.pd_serving_stack``).

One exception: a pod the owner starts in the carrier's namespace cannot be created once that
Namespace is Terminating (the API server's NamespaceLifecycle admission refuses every create in it:
k8s.io/apiserver, plugin/namespace/lifecycle/admission.go, ``Admit``), and the Namespace's deletion
deletes the objects in it itself, so the needs that are objects in that namespace (the service
account, the SecretProviderClass) are deleted after the objects' own carriers, not after the Namespace.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from config.versions import (
    AWS_LOAD_BALANCER_CONTROLLER_CHART,
    KUBERAY_OPERATOR,
    SECRETS_STORE_CSI_DRIVER,
    SECRETS_STORE_CSI_PROVIDER_AWS,
)
from kuberay.oracle import redis_cleanup_pod
from manifests.hf_token import CSI_DRIVER

# What every pod needs from the cluster to start and to reach anything: an address (the VPC CNI),
# the ClusterIP Services, the API server's `kubernetes` Service among them (kube-proxy's rules), and
# names, the store's endpoint among them (CoreDNS). EKS add-on names.
POD_NETWORK_ADDONS = ("vpc-cni", "kube-proxy", "coredns")
# What a pod whose service account has an EKS Pod Identity association needs for its credentials.
POD_IDENTITY_AGENT_ADDON = "eks-pod-identity-agent"
# The charts that serve a pod's CSI volume: the driver, by its name, and the Secrets Store's
# providers, by a SecretProviderClass's ``spec.provider``.
CSI_DRIVER_CHARTS = {CSI_DRIVER: SECRETS_STORE_CSI_DRIVER.chart}
SECRETS_STORE_PROVIDER_CHARTS = {"aws": SECRETS_STORE_CSI_PROVIDER_AWS.chart}


@dataclass(frozen=True)
class Owner:
    """Who takes a finalizer off: a controller that a Helm chart runs, or (``chart`` None) the control
    plane, which EKS runs as long as the cluster exists."""

    name: str
    chart: str | None


KUBERAY = Owner("the KubeRay operator", KUBERAY_OPERATOR.chart)
LOAD_BALANCER_CONTROLLER = Owner("the AWS Load Balancer Controller", AWS_LOAD_BALANCER_CONTROLLER_CHART.chart)
CONTROL_PLANE = Owner("kube-controller-manager", None)


def chart_pod(values: dict[str, Any]) -> dict[str, Any]:
    """What a controller chart's values say of its pod: where it runs and, when the chart does not
    create it, the service account it runs as. Both controller charts read the same keys
    (kuberay-helm kuberay-operator 1.7.0 and eks-charts aws-load-balancer-controller 3.2.2,
    values.yaml: ``nodeSelector``, ``tolerations``, ``serviceAccount.create`` / ``.name``)."""
    account = values.get("serviceAccount") or {}
    pod: dict[str, Any] = {
        "nodeSelector": dict(values.get("nodeSelector") or {}),
        "tolerations": list(values.get("tolerations") or []),
    }
    if account.get("create", True) is False and account.get("name"):
        pod["serviceAccountName"] = account["name"]
    return pod


def _always(_: dict[str, Any]) -> bool:
    return True


def _no_pods(_: dict[str, Any]) -> list[dict[str, Any]]:
    return []


def _gcs_ft_redis(ray_service: dict[str, Any]) -> bool:
    """KubeRay puts the cleanup finalizer on a RayCluster with GCS fault tolerance on (options set, or
    the ``ray.io/ft-enabled`` annotation, which a RayService passes on to its clusters) and a Redis
    backend (``IsGCSFaultToleranceEnabled``, ``IsGCSFaultToleranceEmbedded``, utils/util.go:765-782;
    rayservice_controller.go:1511-1512). The operator's ``ENABLE_GCS_FT_REDIS_CLEANUP=false`` would
    turn it off; the chart's values here leave it on."""
    options = ray_service.get("spec", {}).get("rayClusterConfig", {}).get("gcsFaultToleranceOptions")
    annotations = ray_service.get("metadata", {}).get("annotations") or {}
    enabled = options is not None or str(annotations.get("ray.io/ft-enabled", "")).lower() == "true"
    return enabled and (options or {}).get("backend") != "rocksdb"


def _redis_cleanup_job(ray_service: dict[str, Any]) -> list[dict[str, Any]]:
    return [redis_cleanup_pod(ray_service["spec"]["rayClusterConfig"])]


def _load_balancer_controllers(service: dict[str, Any]) -> bool:
    """The controller provisions (and finalizes) a Service of its load balancer class, or one annotated
    ``aws-load-balancer-type: nlb-ip``, or ``external`` with an ``ip`` or ``instance`` target type
    (``IsServiceSupported``, pkg/service/service_utils.go:47-77 at v3.2.2; the default class is
    ``service.k8s.aws/nlb``, pkg/config/service_config.go:7)."""
    spec = service.get("spec", {})
    if spec.get("type") != "LoadBalancer":
        return False
    if spec.get("loadBalancerClass") is not None:
        return bool(spec["loadBalancerClass"] == "service.k8s.aws/nlb")
    annotations = service.get("metadata", {}).get("annotations") or {}
    kind = annotations.get("service.beta.kubernetes.io/aws-load-balancer-type")
    target = annotations.get("service.beta.kubernetes.io/aws-load-balancer-nlb-target-type")
    return kind == "nlb-ip" or (kind == "external" and target in ("ip", "instance"))


@dataclass(frozen=True)
class Finalizer:
    """One finalizer: the object that carries it (``carried_by``), made from an object of kind
    ``applied_as`` that the stack applies when ``put_when`` says so of it; its ``owner``; the pods the
    owner starts to take it off (``acts_through``, from the applied object); and where it is put and
    taken off (``source``)."""

    name: str
    carried_by: str
    applied_as: str
    owner: Owner
    source: str
    put_when: Callable[[dict[str, Any]], bool] = _always
    acts_through: Callable[[dict[str, Any]], list[dict[str, Any]]] = field(default=_no_pods)


KUBERAY_SOURCE = "ray-project/kuberay v1.7.0, ray-operator/controllers/ray/"
LOAD_BALANCER_CONTROLLER_SOURCE = "kubernetes-sigs/aws-load-balancer-controller v3.2.2, "

FINALIZERS: tuple[Finalizer, ...] = (
    Finalizer(
        name="ray.io/rayservice-finalizer",
        carried_by="RayService",
        applied_as="RayService",
        owner=KUBERAY,
        source=(
            f"{KUBERAY_SOURCE}rayservice_controller.go:146-148 (put on), :132-136 (taken off once "
            "cleanUpRayClusterInstance, :1256-1310, finds none of its RayClusters left, so `kubectl "
            "delete` of the RayService waits for theirs too)"
        ),
    ),
    Finalizer(
        name="ray.io/gcs-ft-redis-cleanup-finalizer",
        carried_by="RayCluster",
        applied_as="RayService",
        owner=KUBERAY,
        put_when=_gcs_ft_redis,
        acts_through=_redis_cleanup_job,
        source=(
            f"{KUBERAY_SOURCE}raycluster_controller.go:248-260 (put on), :265-349 (taken off once the "
            "head pod is gone and the Redis cleanup Job has finished, or forced 300 s after the "
            "deletion: :295-302, utils/constant.go:259); the Job: buildRedisCleanupJob, :1807-1899"
        ),
    ),
    Finalizer(
        name="service.k8s.aws/resources",
        carried_by="Service",
        applied_as="Service",
        owner=LOAD_BALANCER_CONTROLLER,
        put_when=_load_balancer_controllers,
        source=(
            f"{LOAD_BALANCER_CONTROLLER_SOURCE}controllers/service/service_controller.go:178 (put on), "
            ":223-237 (taken off once the NLB, its target groups and security groups are deleted); "
            "pkg/shared_constants/finalizers.go:11"
        ),
    ),
    Finalizer(
        name="elbv2.k8s.aws/resources",
        carried_by="TargetGroupBinding",
        applied_as="Service",
        owner=LOAD_BALANCER_CONTROLLER,
        put_when=_load_balancer_controllers,
        source=(
            f"{LOAD_BALANCER_CONTROLLER_SOURCE}controllers/elbv2/targetgroupbinding_controller.go:52, "
            ":130 (put on the binding the controller makes in the Service's namespace), :171-179 "
            "(taken off once the targets are deregistered)"
        ),
    ),
    Finalizer(
        name="kubernetes",
        carried_by="Namespace",
        applied_as="Namespace",
        owner=CONTROL_PLANE,
        source=(
            "k8s.io/api core/v1 types.go, FinalizerKubernetes (spec.finalizers; the namespace "
            "controller takes it off once every object in the namespace is gone)"
        ),
    ),
)
