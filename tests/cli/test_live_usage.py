"""What a deploy keeps "for one deploy" is removed only when the live cluster says nothing uses it
(cli/deploy.py ``with_live_usage``): the RayClusters and pods kubectl lists, replayed from recordings."""

from __future__ import annotations

import json

import pytest

from cli.deploy import with_live_usage
from config.schema import DeployedGcsStore, DeployFacts
from tests.cli.test_deploy_guard import config_data
from verify.kube import RecordedKube, slug

# The deployed template after fault tolerance and the last secret went off: the store and the CSI
# driver are still in it, and its RayService uses neither, so the template alone would remove both.
DEPLOYED = {
    "Resources": {
        "GcsStoreReplicationGroup": {"Type": "AWS::ElastiCache::ReplicationGroup", "Properties": {}},
        "Driver": {"Type": "Custom::AWSCDK-EKS-HelmChart", "Properties": {"Chart": "secrets-store-csi-driver"}},
    }
}
UNUSED_STORE = DeployedGcsStore(node_type="cache.t4g.small", nodes=1, failover=False, in_use=False)
CSI_VOLUME = {"name": "gcs-token", "csi": {"driver": "secrets-store.csi.k8s.io", "readOnly": True}}


def raycluster(name: str, *, ft: bool = False, csi: bool = False) -> dict:
    head = {"template": {"spec": {"containers": [{"name": "ray-head"}], "volumes": [CSI_VOLUME] if csi else []}}}
    spec: dict = {"headGroupSpec": head, "workerGroupSpecs": []}
    if ft:
        spec["gcsFaultToleranceOptions"] = {"redisAddress": "rediss://store:6379"}
    return {"apiVersion": "ray.io/v1", "kind": "RayCluster", "metadata": {"name": name}, "spec": spec}


def pod(name: str, *, csi: bool) -> dict:
    return {"kind": "Pod", "metadata": {"name": name}, "spec": {"volumes": [CSI_VOLUME] if csi else []}}


def recorded(tmp_path, clusters: list[dict], pods: list[dict]) -> RecordedKube:
    for args, items in ((["get", "rayclusters", "-n", "llm"], clusters), (["get", "pods", "-n", "llm"], pods)):
        (tmp_path / f"{slug(args)}.json").write_text(json.dumps({"kind": "List", "items": items}))
    return RecordedKube(tmp_path)


@pytest.fixture
def config():
    from config.loader import parse_config

    return parse_config(config_data(), source="dev.yaml")


def facts() -> DeployFacts:
    return DeployFacts(gcs_store=UNUSED_STORE, secrets_store_in_use=False)


def test_an_old_raycluster_still_listed_keeps_the_store_and_the_driver(tmp_path, config, capsys):
    """A NewCluster rollout that has not switched: the old cluster serves from the store, its head mounts
    the store's token through the driver."""
    kube = recorded(tmp_path, [raycluster("pd-llm-old", ft=True, csi=True), raycluster("pd-llm-new")], [])
    kept = with_live_usage(config, facts(), DEPLOYED, kube)
    assert kept.gcs_store is not None and kept.gcs_store.in_use and kept.secrets_store_in_use
    out = capsys.readouterr().out
    assert "kept for this deploy: the GCS store, used by RayCluster pd-llm-old" in out
    assert "kept for this deploy: the Secrets Store CSI driver, mounted by RayCluster pd-llm-old" in out


def test_a_pod_still_terminating_keeps_the_driver_it_unmounts_through(tmp_path, config, capsys):
    kube = recorded(tmp_path, [raycluster("pd-llm-new")], [pod("pd-llm-old-head-7x2k", csi=True)])
    kept = with_live_usage(config, facts(), DEPLOYED, kube)
    assert kept.secrets_store_in_use and kept.gcs_store == UNUSED_STORE
    assert "mounted by pod pd-llm-old-head-7x2k" in capsys.readouterr().out


def test_when_nothing_uses_them_the_template_decides(tmp_path, config, capsys):
    kube = recorded(tmp_path, [raycluster("pd-llm-new")], [pod("pd-llm-new-head-9q", csi=False)])
    assert with_live_usage(config, facts(), DEPLOYED, kube) == facts()
    assert capsys.readouterr().out == ""


@pytest.mark.parametrize("ask", ["offline", "kubectl fails"])
def test_a_cluster_that_cannot_be_asked_keeps_both_and_says_why(tmp_path, config, capsys, ask):
    kube = None if ask == "offline" else RecordedKube(tmp_path)  # an empty recording: every read fails
    kept = with_live_usage(config, facts(), DEPLOYED, kube)
    assert kept.gcs_store is not None and kept.gcs_store.in_use and kept.secrets_store_in_use
    out = capsys.readouterr().out
    why = "offline (TEMPLATE=): the cluster is not asked" if ask == "offline" else "cannot ask the cluster (no recorded"
    assert f"kept for this deploy: the GCS store, {why}" in out
