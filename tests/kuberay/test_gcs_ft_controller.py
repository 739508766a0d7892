"""GCS fault tolerance through KubeRay 1.7.0: its controller's rules, what it adds to the pods, and
the rollout that turning it on starts.

Mirrored from ray-project/kuberay v1.7.0: ``ray-operator/controllers/ray/utils/validation.go``
(``ValidateRayClusterSpec``, the GCS FT block, and ``validateGcsFaultToleranceBackend``) in
``kuberay/rules.py``; ``common/pod.go`` (``configureGCSFaultTolerance``, ``configureRedisFT``) in
``kuberay.oracle.gcs_fault_tolerance_pod``; ``rayservice_controller.go`` (``shouldPrepareNewCluster``,
``isClusterSpecHashEqual``) in ``kuberay.oracle.cluster_spec_hash``.
"""

from __future__ import annotations

import copy
import re

import pytest

from config.loader import load_config, parse_config
from kuberay import KubeRayRejection
from kuberay.oracle import cluster_spec_hash, gcs_fault_tolerance_pod
from kuberay.rules import validate_ray_service
from manifests import gcs_store
from tests.conftest import CONFIG_DIR, GCS_STORE_HOST, rendered_ray_service, with_changes

CLUSTER_UID = "5d1c2a6e-0000-4000-8000-000000000001"


def prod_manifest() -> dict:
    return rendered_ray_service(load_config(CONFIG_DIR / "prod.yaml"))


def cluster_of(manifest: dict) -> dict:
    return manifest["spec"]["rayClusterConfig"]


def head_of(manifest: dict) -> dict:
    return cluster_of(manifest)["headGroupSpec"]


def head_container(manifest: dict) -> dict:
    return head_of(manifest)["template"]["spec"]["containers"][0]


def dev_with_ft(dev_data: dict) -> dict:
    return rendered_ray_service(parse_config(with_changes(dev_data, {"ray_service.gcs_fault_tolerance.enabled": True})))


def test_prod_and_dev_with_fault_tolerance_pass_the_controller(dev_data):
    for manifest in (prod_manifest(), dev_with_ft(dev_data)):
        assert "gcsFaultToleranceOptions" in cluster_of(manifest)
        validate_ray_service(manifest)


def test_dev_has_no_fault_tolerance_by_default():
    manifest = rendered_ray_service(load_config(CONFIG_DIR / "dev.yaml"))
    assert "gcsFaultToleranceOptions" not in cluster_of(manifest)
    assert all(v["name"] != gcs_store.VOLUME for v in head_of(manifest)["template"]["spec"].get("volumes", []))
    validate_ray_service(manifest)


def _annotation_too(m):
    m["metadata"]["annotations"] = {"ray.io/ft-enabled": "true"}


def _redis_address_env_without_options(m):
    cluster_of(m).pop("gcsFaultToleranceOptions")
    head_container(m).setdefault("env", []).append({"name": "RAY_REDIS_ADDRESS", "value": "rediss://x:6379"})


def _password_in_start_params(m):
    head_of(m)["rayStartParams"]["redis-password"] = "literal"


def _password_env(m):
    head_container(m)["env"].append({"name": "REDIS_PASSWORD", "value": "literal"})


def _address_env(m):
    head_container(m)["env"].append({"name": "RAY_REDIS_ADDRESS", "value": "rediss://x:6379"})


def _storage_namespace_annotation(m):
    m["metadata"]["annotations"] = {"ray.io/external-storage-namespace": "shared"}


def _rocksdb(m):
    cluster_of(m)["gcsFaultToleranceOptions"]["backend"] = "rocksdb"


def _storage_with_redis(m):
    cluster_of(m)["gcsFaultToleranceOptions"]["storage"] = {"size": "1Gi"}


def _username_env(m):
    head_container(m)["env"].append({"name": "REDIS_USERNAME", "value": "default"})


# validation.go at v1.7.0, ValidateRayClusterSpec (lines 153-195) and validateGcsFaultToleranceBackend.
REJECTIONS = [
    (_annotation_too, "ray.io/ft-enabled annotation and GcsFaultToleranceOptions are both set"),
    (_redis_address_env_without_options, "RAY_REDIS_ADDRESS is set which implicitly enables GCS fault tolerance"),
    (_password_in_start_params, "cannot set `redis-password` in rayStartParams when GcsFaultToleranceOptions"),
    (_password_env, "cannot set `REDIS_PASSWORD` env var in head Pod when GcsFaultToleranceOptions is enabled"),
    (_address_env, "cannot set `RAY_REDIS_ADDRESS` env var in head Pod when GcsFaultToleranceOptions is enabled"),
    (_storage_namespace_annotation, "cannot set `ray.io/external-storage-namespace` annotation when"),
    (_rocksdb, "requires the GCSFaultToleranceEmbeddedStorage feature gate to be enabled"),
    (_storage_with_redis, "cannot set GcsFaultToleranceOptions.Storage when backend is 'redis'"),
    (_username_env, "cannot set redis username in rayStartParams or environment variables"),
]


@pytest.mark.parametrize(("breakage", "message"), REJECTIONS, ids=[m[:45] for _, m in REJECTIONS])
def test_each_fault_tolerance_rule_refuses_what_kuberay_refuses(breakage, message):
    manifest = prod_manifest()
    validate_ray_service(manifest)
    breakage(manifest)
    with pytest.raises(KubeRayRejection, match=re.escape(message)):
        validate_ray_service(manifest)


def test_kuberay_gives_the_head_the_token_by_reference_and_a_tls_address():
    """configureRedisFT: REDIS_PASSWORD from the synced Secret, ``--redis-password=$REDIS_PASSWORD``, and
    ``RAY_REDIS_ADDRESS`` as given: ``rediss://``, which turns TLS on in Ray's GCS (Ray 2.58.0
    ``ray/_private/services.py`` ``get_address``) and in KubeRay's Redis cleanup Job (``use_ssl``)."""
    manifest = prod_manifest()
    cluster = cluster_of(manifest)
    added = gcs_fault_tolerance_pod(cluster, head_of(manifest), head=True, cluster_uid=CLUSTER_UID)
    assert added["env"]["REDIS_PASSWORD"] == {
        "valueFrom": {"secretKeyRef": {"name": gcs_store.SECRET_NAME, "key": gcs_store.SECRET_KEY}}
    }
    assert added["rayStartParams"] == {"redis-password": "$REDIS_PASSWORD"}
    assert added["env"]["RAY_REDIS_ADDRESS"] == {"value": f"rediss://{GCS_STORE_HOST}:6379"}
    # No fixed namespace: each RayCluster of a NewCluster upgrade keeps its keys under its own UID.
    assert "externalStorageNamespace" not in cluster["gcsFaultToleranceOptions"]
    assert added["env"]["RAY_external_storage_namespace"] == {"value": CLUSTER_UID}
    assert added["annotations"]["ray.io/ft-enabled"] == "true"
    # The literal token is nowhere in the manifest: only the Secret's name and key.
    assert "value" not in cluster["gcsFaultToleranceOptions"]["redisPassword"]


def test_the_head_mounts_the_volume_that_makes_the_driver_sync_the_secret():
    manifest = prod_manifest()
    pod = head_of(manifest)["template"]["spec"]
    (volume,) = [v for v in pod["volumes"] if v["name"] == gcs_store.VOLUME]
    assert volume["csi"]["volumeAttributes"] == {"secretProviderClass": gcs_store.PROVIDER_CLASS}
    assert {"name": gcs_store.VOLUME, "mountPath": gcs_store.MOUNT_PATH, "readOnly": True} in pod["containers"][0][
        "volumeMounts"
    ]
    # Workers neither mount it nor read the token: only the GCS (on the head) talks to the store.
    for group in cluster_of(manifest)["workerGroupSpecs"]:
        assert all(v["name"] != gcs_store.VOLUME for v in group["template"]["spec"].get("volumes", []))


def test_kuberay_gives_workers_ten_minutes_to_wait_for_a_restarted_gcs():
    manifest = prod_manifest()
    cluster = cluster_of(manifest)
    for group in cluster["workerGroupSpecs"]:
        added = gcs_fault_tolerance_pod(cluster, group, head=False, cluster_uid=CLUSTER_UID)
        assert added["env"] == {"RAY_gcs_rpc_server_reconnect_timeout_s": {"value": "600"}}
        assert "REDIS_PASSWORD" not in added["env"]


def test_turning_fault_tolerance_on_starts_a_new_cluster_rollout(dev_data):
    """The options, the head's CSI volume and its CA bundle are in the cluster spec KubeRay hashes; with the same worker
    groups the hash differs in full and in part, so shouldPrepareNewCluster starts a NewCluster upgrade
    (a second head and second GPU workers until the switch), not an in-place update."""
    before = rendered_ray_service(parse_config(dev_data))
    after = dev_with_ft(dev_data)
    assert before["spec"]["upgradeStrategy"] == {"type": "NewCluster"}
    assert cluster_spec_hash(cluster_of(before)) != cluster_spec_hash(cluster_of(after))
    # Everything else equal: removing what fault tolerance adds gives the old hash back.
    stripped = copy.deepcopy(cluster_of(after))
    stripped.pop("gcsFaultToleranceOptions")
    head_pod = stripped["headGroupSpec"]["template"]["spec"]
    head_pod["volumes"] = [v for v in head_pod["volumes"] if v["name"] != gcs_store.VOLUME]
    if not head_pod["volumes"]:
        head_pod.pop("volumes")
    mounts = head_pod["containers"][0]["volumeMounts"]
    head_pod["containers"][0]["volumeMounts"] = [m for m in mounts if m["name"] != gcs_store.VOLUME]
    if not head_pod["containers"][0]["volumeMounts"]:
        head_pod["containers"][0].pop("volumeMounts")
    tls = gcs_store.tls_env(cluster_of(after)["gcsFaultToleranceOptions"]["redisAddress"])
    head_pod["containers"][0]["env"] = [e for e in head_pod["containers"][0]["env"] if e not in tls]
    assert cluster_spec_hash(stripped) == cluster_spec_hash(cluster_of(before))


def test_requests_never_reach_the_head():
    for manifest in (prod_manifest(), rendered_ray_service(load_config(CONFIG_DIR / "dev.yaml"))):
        assert manifest["spec"]["excludeHeadPodFromServeSvc"] is True
        assert head_of(manifest)["rayStartParams"]["num-cpus"] == "0"
