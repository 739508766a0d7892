"""What KubeRay derives from a RayService spec, mirrored for tests to check the manifest against:
the resources ``ray start`` is given for a group (``ray-operator/controllers/ray/common/pod.go``)
and the hash that decides whether a spec change brings up a new RayCluster
(``rayservice_controller.go``, ``utils/util.go``), both at ``kuberay.MIRRORED_VERSION``.
"""

from __future__ import annotations

import re
from typing import Any

from kuberay.apimachinery import parse_quantity, quantity_value
from kuberay.rules import ray_container

# --- pod.go: what `ray start` is told ------------------------------------------------------------


def _is_gpu_resource_key(key: str) -> bool:
    """``utils/resources.go`` ``IsGPUResourceKey``."""
    return key.endswith("gpu") or re.search(r"nvidia\.com/mig-\d+g\.\d+gb$", key) is not None


def ray_start_resources(group: dict) -> dict[str, Any]:
    """The resources a group's Ray node advertises: ``num-cpus``, ``num-gpus``, ``memory`` (bytes) and
    the custom ``resources``, as ``updateRayStartParamsResources`` then ``generateRayStartCommand`` and
    ``addWellKnownAcceleratorResources`` fill them from the group's resources and the container limits."""
    import json

    params = dict(group.get("rayStartParams") or {})
    custom: dict[str, float] = {}
    for name, quantity in (group.get("resources") or {}).items():
        normalized = name.lower()
        if normalized == "cpu":
            params["num-cpus"] = str(quantity_value(quantity))
        elif normalized == "memory":
            params["memory"] = str(quantity_value(quantity))
        elif _is_gpu_resource_key(normalized):
            params["num-gpus"] = str(quantity_value(quantity))
        else:
            custom[name] = float(parse_quantity(quantity))
    if custom:
        params["resources"] = "'" + json.dumps(custom, separators=(",", ":")) + "'"
    container_resources = ray_container(group).get("resources") or {}
    limits, requests = container_resources.get("limits") or {}, container_resources.get("requests") or {}
    if "num-cpus" not in params:
        for source in (limits, requests):
            if source.get("cpu") and parse_quantity(source["cpu"]) != 0:
                params["num-cpus"] = str(quantity_value(source["cpu"]))
                break
    if "memory" not in params and limits.get("memory") and parse_quantity(limits["memory"]) != 0:
        params["memory"] = str(quantity_value(limits["memory"]))
    if "num-gpus" not in params:
        for key in sorted(limits):
            if _is_gpu_resource_key(key) and parse_quantity(limits[key]) != 0:
                params["num-gpus"] = str(quantity_value(limits[key]))
    resources_text = params.get("resources", "").strip("'")
    return {
        "num-cpus": int(params["num-cpus"]) if "num-cpus" in params else None,
        "num-gpus": int(params["num-gpus"]) if "num-gpus" in params else None,
        "memory": int(params["memory"]) if "memory" in params else None,
        "resources": json.loads(resources_text) if resources_text else {},
    }


# --- rayservice_controller.go / util.go: when a RayService gets a new RayCluster -------------------


def cluster_spec_hash(ray_cluster_config: dict) -> str:
    """``GenerateHashWithoutReplicasAndWorkersToDelete`` (``utils/util.go``) on ``rayClusterSpecForHashing``
    (``rayservice_controller.go``): the cluster spec without what KubeRay leaves out (worker replicas,
    min/max replicas, workers to delete, tolerations and scheduling gates of every pod template, the
    cluster's upgradeStrategy, suspend). A different hash makes a NewCluster upgrade; RayService
    annotations and serveConfigV2 are not part of it. (KubeRay hashes Go's JSON of the typed struct;
    equal and different specs hash alike here, which is what the comparison needs.)"""
    import copy
    import hashlib
    import json

    spec = copy.deepcopy(ray_cluster_config)
    spec.pop("suspend", None)
    spec.pop("upgradeStrategy", None)
    head_pod = spec.get("headGroupSpec", {}).get("template", {}).get("spec", {})
    head_pod.pop("tolerations", None)
    head_pod.pop("schedulingGates", None)
    for group in spec.get("workerGroupSpecs") or []:
        for key in ("replicas", "minReplicas", "maxReplicas"):
            group.pop(key, None)
        group.get("scaleStrategy", {}).pop("workersToDelete", None)
        pod = group.get("template", {}).get("spec", {})
        pod.pop("tolerations", None)
        pod.pop("schedulingGates", None)
    return hashlib.sha1(json.dumps(spec, sort_keys=True, separators=(",", ":")).encode()).hexdigest()


def pod_restart_policy(ray_cluster_config: dict, group: dict) -> str:
    """The restartPolicy KubeRay 1.7.0 gives a group's pods (common/pod.go, DefaultHeadPodTemplate and
    DefaultWorkerPodTemplate): Never with in-tree autoscaling v2, else the template's, else
    Kubernetes' default, Always."""
    spec = ray_cluster_config
    v2 = (spec.get("autoscalerOptions") or {}).get("version") == "v2"
    if spec.get("enableInTreeAutoscaling") and v2:
        return "Never"
    return (group.get("template", {}).get("spec", {}) or {}).get("restartPolicy") or "Always"


# --- common/pod.go: what GCS fault tolerance adds to the pods --------------------------------------

RAY_GCS_RPC_SERVER_RECONNECT_TIMEOUT_S = "RAY_gcs_rpc_server_reconnect_timeout_s"
DEFAULT_WORKER_RAY_GCS_RECONNECT_TIMEOUT_S = "600"  # utils/constant.go
RAY_EXTERNAL_STORAGE_NS = "RAY_external_storage_namespace"


def gcs_fault_tolerance_pod(ray_cluster_config: dict, group: dict, *, head: bool, cluster_uid: str) -> dict[str, Any]:
    """What ``configureGCSFaultTolerance`` and ``configureRedisFT`` (``common/pod.go``, redis backend)
    add to a group's Ray container when ``gcsFaultToleranceOptions`` is set: ``env`` (name -> the
    EnvVar without its name), the head's extra ``rayStartParams``, and the pod annotations.

    On the head: ``RAY_external_storage_namespace`` (``externalStorageNamespace``, else the
    RayCluster's UID), ``RAY_REDIS_ADDRESS`` (``redisAddress`` verbatim), ``REDIS_PASSWORD`` from
    ``redisPassword`` (``value`` or ``valueFrom``) with ``redis-password: $REDIS_PASSWORD`` in
    ``rayStartParams``, and the same for ``redisUsername``. On a worker: the raylet waits
    ``RAY_gcs_rpc_server_reconnect_timeout_s`` = 600 s for a restarted GCS unless the pod sets it.
    Without the options (and without the ``ray.io/ft-enabled`` annotation) nothing is added.
    """
    options = ray_cluster_config.get("gcsFaultToleranceOptions")
    out: dict[str, Any] = {"env": {}, "rayStartParams": {}, "annotations": {}}
    if head:
        out["annotations"]["ray.io/ft-enabled"] = str(options is not None).lower()
    if options is None:
        return out
    container = ray_container(group)
    present = {e.get("name") for e in container.get("env") or []}
    if not head:
        if RAY_GCS_RPC_SERVER_RECONNECT_TIMEOUT_S not in present:
            out["env"][RAY_GCS_RPC_SERVER_RECONNECT_TIMEOUT_S] = {"value": DEFAULT_WORKER_RAY_GCS_RECONNECT_TIMEOUT_S}
        return out
    namespace = options.get("externalStorageNamespace") or cluster_uid
    out["annotations"]["ray.io/external-storage-namespace"] = namespace
    if RAY_EXTERNAL_STORAGE_NS not in present:
        out["env"][RAY_EXTERNAL_STORAGE_NS] = {"value": namespace}
    out["env"]["RAY_REDIS_ADDRESS"] = {"value": options.get("redisAddress", "")}
    for field, env_name, param in (
        ("redisUsername", "REDIS_USERNAME", "redis-username"),
        ("redisPassword", "REDIS_PASSWORD", "redis-password"),
    ):
        credential = options.get(field)
        if credential is not None:
            out["rayStartParams"][param] = f"${env_name}"
            out["env"][env_name] = {k: v for k, v in credential.items() if k in ("value", "valueFrom")}
    return out


# --- raycluster_controller.go: the Redis cleanup Job of a deleted RayCluster ----------------------

REDIS_CLEANUP_NODE_TYPE = "redis-cleanup"  # apis/ray/v1/raycluster_types.go, RedisCleanupNode
WAIT_FOR_TLS_IP_SAN = "wait-for-tls-ip-san"
REDIS_CLEANUP_RESOURCES = {"cpu": "200m", "memory": "256Mi"}


def redis_cleanup_pod(ray_cluster_config: dict, *, cluster_uid: str = "", cluster_name: str = "") -> dict[str, Any]:
    """The pod spec of the Job that KubeRay starts to clean the store when a RayCluster with GCS fault
    tolerance (redis backend) is deleted, before it takes ``ray.io/gcs-ft-redis-cleanup-finalizer`` off
    (``buildRedisCleanupJob``, raycluster_controller.go:1807-1899 at v1.7.0).

    It is the head's pod (``buildHeadPod``): its service account, volumes, nodeSelector and tolerations
    unchanged, so it needs what the head needs to start, on the head's nodes; only the Ray container
    is kept, with the head's env plus what ``configureRedisFT`` gives the head (``RAY_REDIS_ADDRESS``,
    ``REDIS_PASSWORD``), no probes, 200m CPU and 256Mi, and restartPolicy Never. With in-tree
    autoscaling a head template that names no service account runs as the RayCluster's name
    (``DefaultHeadPodTemplate``, common/pod.go, with ``GetHeadGroupServiceAccountName``): pass
    ``cluster_name`` to have it.
    """
    import copy

    head = ray_cluster_config["headGroupSpec"]
    spec = copy.deepcopy(head.get("template", {}).get("spec", {}))
    container = spec["containers"][0]  # RayContainerIndex
    fault_tolerance = gcs_fault_tolerance_pod(ray_cluster_config, head, head=True, cluster_uid=cluster_uid)
    added = fault_tolerance["env"]
    container["env"] = [
        *(e for e in container.get("env") or [] if e.get("name") not in added),
        *({"name": name, **value} for name, value in added.items()),
        {"name": "RAY_redis_db_connect_retries", "value": "120"},
        {"name": "RAY_redis_db_connect_wait_milliseconds", "value": "500"},
    ]
    container.pop("livenessProbe", None)
    container.pop("readinessProbe", None)
    container["resources"] = {"limits": dict(REDIS_CLEANUP_RESOURCES), "requests": dict(REDIS_CLEANUP_RESOURCES)}
    spec["containers"] = [container]
    init = [c for c in spec.get("initContainers") or [] if c.get("name") != WAIT_FOR_TLS_IP_SAN]
    if init:
        spec["initContainers"] = init
    else:
        spec.pop("initContainers", None)
    spec["restartPolicy"] = "Never"
    if ray_cluster_config.get("enableInTreeAutoscaling") and cluster_name:
        spec["serviceAccountName"] = spec.get("serviceAccountName") or cluster_name
    return spec
