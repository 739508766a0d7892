"""KubeRay's controller-side rules for a RayService (release ``kuberay.MIRRORED_VERSION``).

The CRD schema is not the whole contract: after the API server accepts a RayService, KubeRay's
controller validates it again and, on a failure, only marks it ``ValidationFailed`` and never
creates a RayCluster. Nothing at ``kubectl apply`` time says so. Every rule below cites the Go
function it mirrors in ray-project/kuberay at tag v1.7.0, and keeps its error message:

- ``ray-operator/controllers/ray/utils/validation.go``: ``ValidateRayServiceMetadata``,
  ``ValidateRayServiceSpec``, ``ValidateRayClusterSpec``, ``ValidateRayClusterMetadata``,
  ``ValidateRayClusterUpgradeOptions``, ``validateRayGroupResources``, ``validateRayGroupLabels``,
  ``validateWorkerGroupIdleTimeout``, ``validateWorkerGroupPriority``, ``ValidateClusterUpgradeOptions``;
- ``ray-operator/controllers/ray/utils/constant.go`` (name limits, annotation and env names);
- ``k8s.io/apimachinery/pkg/util/validation`` (``IsDNS1035Label``, ``IsQualifiedName``,
  ``IsValidLabelValue``) for the name and label syntax those functions call.

Feature gates are taken at their v1.7.0 defaults (``pkg/features/features.go``): on for
``RayJobDeletionPolicy`` and ``RayServiceIncrementalUpgrade``; off for ``RayClusterNetworkPolicy``,
``RayClusterMTLS``, ``RayClusterHistoryServer`` and ``GCSFaultToleranceEmbeddedStorage``.
"""

from __future__ import annotations

import re
from typing import Any

from kuberay import KubeRayRejection
from kuberay.apimachinery import dns1035_label_errors, label_value_errors, qualified_name_errors

# constant.go: 63 - len("-serve-svc") == 53; GenerateRayClusterName appends "-" + 5 random characters.
MAX_RAY_CLUSTER_NAME_LENGTH = 53
MAX_RAY_SERVICE_NAME_LENGTH = MAX_RAY_CLUSTER_NAME_LENGTH - 6
GENERATED_CLUSTER_SUFFIX = "-abcde"

RAY_FT_ENABLED_ANNOTATION = "ray.io/ft-enabled"
RAY_EXTERNAL_STORAGE_NS_ANNOTATION = "ray.io/external-storage-namespace"
RAY_SERVICE_INITIALIZING_TIMEOUT_ANNOTATION = "ray.io/initializing-timeout"
RAY_ORIGINATED_FROM_CRD_LABEL = "ray.io/originated-from-crd"
RAY_REDIS_ADDRESS = "RAY_REDIS_ADDRESS"
REDIS_PASSWORD = "REDIS_PASSWORD"
REDIS_USERNAME = "REDIS_USERNAME"
RAY_ENABLE_AUTOSCALER_V2 = "RAY_enable_autoscaler_v2"
KUBERAY_GEN_AUTOSCALER_START_CMD = "KUBERAY_GEN_AUTOSCALER_START_CMD"
RAY_SERVICE_UPGRADE_TYPES = ("NewClusterWithIncrementalUpgrade", "NewCluster", "None")
RAY_CLUSTER_UPGRADE_TYPES = ("Recreate", "None")


def _pod_spec(group: dict[str, Any]) -> dict[str, Any]:
    return group.get("template", {}).get("spec", {})


def ray_container(group: dict[str, Any]) -> dict[str, Any]:
    containers = _pod_spec(group).get("containers") or [{}]
    return containers[0]  # RayContainerIndex = 0


def _env(container: dict[str, Any], name: str) -> dict[str, Any] | None:
    for entry in container.get("env") or []:
        if entry.get("name") == name:
            return entry
    return None


def validate_ray_group_resources(group_name: str, ray_start_params: dict, resources: dict) -> None:
    """``validateRayGroupResources``."""
    has_ray_start_resources = any(
        ray_start_params.get(k, "") != "" for k in ("num-cpus", "num-gpus", "memory", "resources")
    )
    if has_ray_start_resources and resources:
        raise KubeRayRejection(
            f"resource fields should not be set in both rayStartParams and Resources for {group_name} group; "
            "please use only one"
        )


def validate_ray_group_labels(group_name: str, ray_start_params: dict, labels: dict) -> None:
    """``validateRayGroupLabels``."""
    if "labels" in ray_start_params:
        raise KubeRayRejection(
            f"rayStartParams['labels'] is not supported for {group_name} group; please use the top-level Labels field instead"
        )
    errors = []
    for key, value in labels.items():
        errors += [f"invalid label key for {group_name} group: '{key}', error: {e}" for e in qualified_name_errors(key)]
        errors += [
            f"invalid label value for key '{key}' in {group_name} group: '{value}', error: {e}"
            for e in label_value_errors(str(value))
        ]
    if errors:
        raise KubeRayRejection("; ".join(errors))


def is_autoscaling_enabled(spec: dict) -> bool:
    """``IsAutoscalingEnabled``: only ``enableInTreeAutoscaling: true`` turns it on."""
    return spec.get("enableInTreeAutoscaling") is True


def is_autoscaling_v2_enabled(spec: dict) -> bool:
    return (spec.get("autoscalerOptions") or {}).get("version") == "v2"


def _autoscaler_v2_env(spec: dict) -> bool:
    entry = _env(ray_container(spec["headGroupSpec"]), RAY_ENABLE_AUTOSCALER_V2)
    return entry is not None and entry.get("value") in ("1", "true")


def _parse_version(text: str) -> tuple[int, ...]:
    match = re.match(r"^v?(\d+)\.(\d+)(?:\.(\d+))?", text or "")
    if not match:
        raise ValueError(text)
    return tuple(int(p or 0) for p in match.groups())


def validate_worker_group_idle_timeout(group: dict, spec: dict) -> None:
    """``validateWorkerGroupIdleTimeout``."""
    timeout = group.get("idleTimeoutSeconds")
    if timeout is None:
        return
    name = group.get("groupName")
    if timeout < 0:
        raise KubeRayRejection(f"worker group {name}: idleTimeoutSeconds must be non-negative, got {timeout}")
    if is_autoscaling_v2_enabled(spec) or _autoscaler_v2_env(spec):
        return
    raise KubeRayRejection(
        f"worker group {name}: idleTimeoutSeconds is set, but autoscaler v2 is not enabled. Please set "
        ".spec.autoscalerOptions.version to 'v2' (or set RAY_enable_autoscaler_v2 environment variable to "
        "'true' in the head pod if using KubeRay < 1.4.0)"
    )


def validate_worker_group_priority(group: dict, spec: dict) -> None:
    """``validateWorkerGroupPriority``: priority needs Ray >= 2.56.0 and autoscaler v2."""
    priority = group.get("priority")
    if not priority:
        return
    name = group.get("groupName")
    ray_version = spec.get("rayVersion", "")
    if not ray_version:
        raise KubeRayRejection(
            f"worker group {name}: priority is set, but RayVersion was not specified. Ray version 2.56.0 or later is required"
        )
    try:
        parsed = _parse_version(ray_version)
    except ValueError:
        raise KubeRayRejection(
            f"worker group {name}: priority is set, but RayVersion format is invalid: {ray_version}"
        ) from None
    if parsed < (2, 56, 0):
        raise KubeRayRejection(
            f"worker group {name}: priority is set, but minimum Ray version is 2.56.0, got {ray_version}"
        )
    if is_autoscaling_v2_enabled(spec) or _autoscaler_v2_env(spec):
        return
    raise KubeRayRejection(
        f"worker group {name}: priority is set to {priority}, but autoscaler v2 is not enabled. Priority is only "
        "supported with autoscaler v2 enabled"
    )


def validate_ray_cluster_spec(spec: dict, annotations: dict) -> None:
    """``ValidateRayClusterSpec`` (the rules a RayService's cluster config can break)."""
    head = spec.get("headGroupSpec") or {}
    if not _pod_spec(head).get("containers"):
        raise KubeRayRejection("headGroupSpec should have at least one container")
    validate_ray_group_resources("Head", head.get("rayStartParams") or {}, head.get("resources") or {})
    validate_ray_group_labels("Head", head.get("rayStartParams") or {}, head.get("labels") or {})
    autoscaling = is_autoscaling_enabled(spec)
    for group in spec.get("workerGroupSpecs") or []:
        name = group.get("groupName")
        if not _pod_spec(group).get("containers"):
            raise KubeRayRejection("workerGroupSpec should have at least one container")
        low, high = group.get("minReplicas"), group.get("maxReplicas")
        if not autoscaling and (low is None or high is None):
            raise KubeRayRejection(
                f"worker group {name} must set both minReplicas and maxReplicas when autoscaling is disabled"
            )
        if low is not None and low < 0:
            raise KubeRayRejection(f"worker group {name} has negative minReplicas {low}")
        if high is not None and high < 0:
            raise KubeRayRejection(f"worker group {name} has negative maxReplicas {high}")
        if low is not None and high is not None and low > high:
            raise KubeRayRejection(f"worker group {name} has minReplicas {low} greater than maxReplicas {high}")
        validate_ray_group_resources(name, group.get("rayStartParams") or {}, group.get("resources") or {})
        validate_ray_group_labels(name, group.get("rayStartParams") or {}, group.get("labels") or {})
        validate_worker_group_idle_timeout(group, spec)
        validate_worker_group_priority(group, spec)

    ft_options = spec.get("gcsFaultToleranceOptions")
    if annotations.get(RAY_FT_ENABLED_ANNOTATION, "") != "" and ft_options is not None:
        raise KubeRayRejection(
            f"{RAY_FT_ENABLED_ANNOTATION} annotation and GcsFaultToleranceOptions are both set. "
            "Please use only GcsFaultToleranceOptions to configure GCS fault tolerance"
        )
    head_container = ray_container(head)
    ft_enabled = annotations.get(RAY_FT_ENABLED_ANNOTATION, "").lower() == "true" or ft_options is not None
    if not ft_enabled and _env(head_container, RAY_REDIS_ADDRESS):
        raise KubeRayRejection(
            f"{RAY_REDIS_ADDRESS} is set which implicitly enables GCS fault tolerance, but "
            "GcsFaultToleranceOptions is not set. Please set GcsFaultToleranceOptions to enable GCS fault tolerance"
        )
    if ft_options is not None:
        head_params = head.get("rayStartParams") or {}
        if head_params.get("redis-password"):
            raise KubeRayRejection(
                "cannot set `redis-password` in rayStartParams when GcsFaultToleranceOptions is enabled - use "
                "GcsFaultToleranceOptions.RedisPassword instead"
            )
        for env_name, field in ((REDIS_PASSWORD, "RedisPassword"), (RAY_REDIS_ADDRESS, "RedisAddress")):
            if _env(head_container, env_name):
                raise KubeRayRejection(
                    f"cannot set `{env_name}` env var in head Pod when GcsFaultToleranceOptions is enabled - use "
                    f"GcsFaultToleranceOptions.{field} instead"
                )
        if annotations.get(RAY_EXTERNAL_STORAGE_NS_ANNOTATION):
            raise KubeRayRejection(
                "cannot set `ray.io/external-storage-namespace` annotation when GcsFaultToleranceOptions is enabled "
                "- use GcsFaultToleranceOptions.ExternalStorageNamespace instead"
            )
        if ft_options.get("backend") == "rocksdb":
            raise KubeRayRejection(
                "the embedded RocksDB GCS fault tolerance backend (GcsFaultToleranceOptions.Backend: 'rocksdb') "
                "requires the GCSFaultToleranceEmbeddedStorage feature gate to be enabled"
            )
        if ft_options.get("storage") is not None:
            raise KubeRayRejection(
                "cannot set GcsFaultToleranceOptions.Storage when backend is 'redis' - it only applies to the "
                "'rocksdb' backend"
            )
    if (head.get("rayStartParams") or {}).get("redis-username") or _env(head_container, REDIS_USERNAME):
        raise KubeRayRejection(
            "cannot set redis username in rayStartParams or environment variables - use "
            "GcsFaultToleranceOptions.RedisUsername instead"
        )

    if not autoscaling:
        entry = _env(head_container, RAY_ENABLE_AUTOSCALER_V2)
        if entry and entry.get("value") in ("1", "true"):
            raise KubeRayRejection(
                f"environment variable {RAY_ENABLE_AUTOSCALER_V2} cannot be set to '{entry['value']}' when "
                "enableInTreeAutoscaling is false. Please set enableInTreeAutoscaling: true to use autoscaler v2"
            )
    options = spec.get("autoscalerOptions") or {}
    if autoscaling:
        for group in spec.get("workerGroupSpecs") or []:
            if group.get("suspend"):
                raise KubeRayRejection(
                    f"worker group {group.get('groupName')} cannot be suspended with Autoscaler enabled"
                )
        if options.get("version") is not None and _env(head_container, RAY_ENABLE_AUTOSCALER_V2):
            raise KubeRayRejection(
                f"both .spec.autoscalerOptions.version and head Pod env var {RAY_ENABLE_AUTOSCALER_V2} are set, "
                "please only use the former"
            )
        if is_autoscaling_v2_enabled(spec):
            if _pod_spec(head).get("restartPolicy", "") not in ("", "Never"):
                raise KubeRayRejection("restartPolicy for head Pod should be Never or unset when using autoscaler V2")
            for group in spec.get("workerGroupSpecs") or []:
                if _pod_spec(group).get("restartPolicy", "") not in ("", "Never"):
                    raise KubeRayRejection(
                        f"restartPolicy for worker group {group.get('groupName')} should be Never or unset when "
                        "using autoscaler V2"
                    )
    idle = options.get("idleTimeoutSeconds")
    if idle is not None and idle < 0:
        raise KubeRayRejection(f"autoscalerOptions.idleTimeoutSeconds must be non-negative, got {idle}")
    if any(e.get("name") == KUBERAY_GEN_AUTOSCALER_START_CMD for e in options.get("env") or []):
        raise KubeRayRejection(
            f"autoscalerOptions.env must not contain {KUBERAY_GEN_AUTOSCALER_START_CMD}: it is managed by KubeRay "
            "and injected automatically into the autoscaler container"
        )
    if spec.get("historyServerOptions") is not None:
        raise KubeRayRejection("RayClusterHistoryServer feature gate is not enabled")
    auth = spec.get("authOptions") or {}
    k8s_auth = auth.get("enableK8sTokenAuth") is True
    if auth.get("mode") == "token":
        ray_version = spec.get("rayVersion", "")
        if not ray_version:
            raise KubeRayRejection(
                "authOptions.mode is 'token' but RayVersion was not specified. Ray version 2.52.0 or later is required"
            )
        if _parse_version(ray_version) < (2, 52, 0):
            raise KubeRayRejection(f"authOptions.mode is 'token' but minimum Ray version is 2.52.0, got {ray_version}")
    elif k8s_auth:
        raise KubeRayRejection("authOptions.enableK8sTokenAuth is enabled but authOptions.mode not set to 'token'")
    if spec.get("networkPolicy") is not None:
        raise KubeRayRejection("spec.networkPolicy requires the RayClusterNetworkPolicy feature gate to be enabled")
    if spec.get("tlsOptions") is not None:
        raise KubeRayRejection("spec.tlsOptions requires the RayClusterMTLS feature gate to be enabled")


def validate_ray_service_metadata(metadata: dict) -> None:
    """``ValidateRayServiceMetadata``."""
    name = metadata.get("name", "")
    if len(name) > MAX_RAY_SERVICE_NAME_LENGTH:
        raise KubeRayRejection(
            "The RayService metadata is invalid: RayService name should be no more than "
            f"{MAX_RAY_SERVICE_NAME_LENGTH} characters"
        )
    errors = dns1035_label_errors(name)
    if errors:
        raise KubeRayRejection(
            f"The RayService metadata is invalid: RayService name should be a valid DNS1035 label: {errors}"
        )
    timeout = (metadata.get("annotations") or {}).get(RAY_SERVICE_INITIALIZING_TIMEOUT_ANNOTATION, "")
    problem = _initializing_timeout_problem(timeout) if timeout else None
    if problem:
        raise KubeRayRejection(f"The RayService metadata is invalid: RayService annotations is invalid: {problem}")


def _initializing_timeout_problem(text: str) -> str | None:
    """``validateInitializingTimeout``: a positive Go duration or positive integer seconds."""
    key = RAY_SERVICE_INITIALIZING_TIMEOUT_ANNOTATION
    seconds = _go_duration_seconds(text)
    if seconds is not None:
        return None if seconds > 0 else f"annotation {key} must be a positive duration, got: {text}"
    if re.fullmatch(r"[+-]?\d+", text):
        return None if int(text) > 0 else f"annotation {key} must be a positive integer (seconds), got: {text}"
    return (
        f"annotation {key} has invalid format: {text}. Expected Go duration format (e.g., '5m', '1h') or "
        "positive integer seconds"
    )


def _go_duration_seconds(text: str) -> float | None:
    """``time.ParseDuration`` for the units KubeRay's examples use; None when it is not a duration."""
    units = {"ns": 1e-9, "us": 1e-6, "µs": 1e-6, "ms": 1e-3, "s": 1, "m": 60, "h": 3600}
    if text in ("0", "+0", "-0"):
        return 0.0
    parts = re.findall(r"([0-9.]+)(ns|us|µs|ms|s|m|h)", text)
    if not parts or "".join(n + u for n, u in parts) != text.lstrip("+-"):
        return None
    total = sum(float(n) * units[u] for n, u in parts)
    return -total if text.startswith("-") else total


def validate_ray_service_spec(manifest: dict) -> None:
    """``ValidateRayServiceSpec``."""
    spec = manifest.get("spec") or {}
    cluster = spec.get("rayClusterConfig") or {}
    annotations = (manifest.get("metadata") or {}).get("annotations") or {}
    if (cluster.get("authOptions") or {}).get("enableK8sTokenAuth") is True:
        raise KubeRayRejection(
            "The RayService spec is invalid: K8s token auth mode is currently not supported for RayService"
        )
    try:
        validate_ray_cluster_spec(cluster, annotations)
    except KubeRayRejection as exc:
        raise KubeRayRejection(f"The RayService spec is invalid: {exc}") from None
    head_service = (cluster.get("headGroupSpec") or {}).get("headService") or {}
    if (head_service.get("metadata") or {}).get("name"):
        raise KubeRayRejection(
            "The RayService spec is invalid: spec.rayClusterConfig.headGroupSpec.headService.metadata.name "
            "should not be set"
        )
    upgrade_type = (spec.get("upgradeStrategy") or {}).get("type")
    if upgrade_type is not None and upgrade_type not in RAY_SERVICE_UPGRADE_TYPES:
        raise KubeRayRejection(
            f"The RayService spec is invalid: Spec.UpgradeStrategy.Type value {upgrade_type} is invalid, valid "
            "options are NewClusterWithIncrementalUpgrade, NewCluster, or None"
        )
    delay = spec.get("rayClusterDeletionDelaySeconds")
    if delay is not None and delay < 0:
        raise KubeRayRejection(
            "The RayService spec is invalid: Spec.RayClusterDeletionDelaySeconds should be a non-negative "
            f"integer, got {delay}"
        )
    if upgrade_type == "NewClusterWithIncrementalUpgrade":
        try:
            validate_cluster_upgrade_options(spec)
        except KubeRayRejection as exc:
            raise KubeRayRejection(f"The RayService spec is invalid: {exc}") from None


def validate_cluster_upgrade_options(spec: dict) -> None:
    """``ValidateClusterUpgradeOptions`` (NewClusterWithIncrementalUpgrade only)."""
    if not is_autoscaling_enabled(spec.get("rayClusterConfig") or {}):
        raise KubeRayRejection("Ray Autoscaler is required for NewClusterWithIncrementalUpgrade")
    options = (spec.get("upgradeStrategy") or {}).get("clusterUpgradeOptions")
    if options is None:
        raise KubeRayRejection("ClusterUpgradeOptions are required for NewClusterWithIncrementalUpgrade")
    surge = options.get("maxSurgePercent", 100)
    if not 0 <= surge <= 100:
        raise KubeRayRejection("maxSurgePercent must be between 0 and 100")
    step = options.get("stepSizePercent")
    if step is None or not 0 <= step <= 100:
        raise KubeRayRejection("stepSizePercent must be between 0 and 100")
    if step > surge:
        raise KubeRayRejection("stepSizePercent must be less than or equal to maxSurgePercent")
    interval = options.get("intervalSeconds")
    if interval is None or interval <= 0:
        raise KubeRayRejection("intervalSeconds must be greater than 0")
    if not options.get("gatewayClassName"):
        raise KubeRayRejection("gatewayClassName is required for NewClusterWithIncrementalUpgrade")


def validate_generated_ray_cluster(manifest: dict) -> None:
    """The RayCluster controller's checks on the cluster a RayService creates (``raycluster_controller.go``):
    ``ValidateRayClusterMetadata`` on ``<rayservice>-<5 random characters>`` (``GenerateRayClusterName``),
    ``ValidateRayClusterSpec`` with the RayService's annotations (``constructRayClusterForRayService``
    copies them) and ``ValidateRayClusterUpgradeOptions`` with the ``ray.io/originated-from-crd`` label.
    """
    metadata = manifest.get("metadata") or {}
    name = metadata.get("name", "") + GENERATED_CLUSTER_SUFFIX
    if len(name) > MAX_RAY_CLUSTER_NAME_LENGTH:
        raise KubeRayRejection(f"RayCluster name should be no more than {MAX_RAY_CLUSTER_NAME_LENGTH} characters")
    errors = dns1035_label_errors(name)
    if errors:
        raise KubeRayRejection(f"RayCluster name should be a valid DNS1035 label: {errors}")
    cluster = (manifest.get("spec") or {}).get("rayClusterConfig") or {}
    validate_ray_cluster_spec(cluster, metadata.get("annotations") or {})
    upgrade_type = (cluster.get("upgradeStrategy") or {}).get("type")
    if upgrade_type is not None:
        if upgrade_type not in RAY_CLUSTER_UPGRADE_TYPES:
            raise KubeRayRejection(
                f"The RayCluster spec is invalid: Spec.UpgradeStrategy.Type value {upgrade_type} is invalid, "
                "valid options are Recreate or None"
            )
        raise KubeRayRejection("upgradeStrategy cannot be set when RayCluster is created by RayService")


def validate_ray_service(manifest: dict) -> None:
    """Everything KubeRay 1.7.0 checks before it creates a RayService's RayCluster, then on that cluster.

    Mirrors ``RayServiceReconciler.validateRayService`` (``rayservice_controller.go``):
    ``ValidateRayServiceMetadata`` then ``ValidateRayServiceSpec``; then the RayCluster controller's
    checks on the RayCluster built from it. Raises :class:`KubeRayRejection` with KubeRay's message.
    """
    if manifest.get("apiVersion") != "ray.io/v1" or manifest.get("kind") != "RayService":
        raise KubeRayRejection(f"not a ray.io/v1 RayService: {manifest.get('apiVersion')}/{manifest.get('kind')}")
    validate_ray_service_metadata(manifest.get("metadata") or {})
    validate_ray_service_spec(manifest)
    validate_generated_ray_cluster(manifest)
