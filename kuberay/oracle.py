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
