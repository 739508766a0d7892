"""Rollouts: with rollout new_cluster a change of serve_app or of the serving spec changes the
RayCluster spec the way that makes KubeRay 1.7.0 start a new cluster; with in_place it does not.

KubeRay decides by ``GenerateHashWithoutReplicasAndWorkersToDelete`` over the cluster spec
(mirrored in ``kuberay.oracle.cluster_spec_hash``); every RayService synthesized here
also passes KubeRay's controller rules (the construct applies them at synth).
"""

from __future__ import annotations

import copy
import shutil

import pytest
import yaml

from cdk_constructs import ray_service as ray_service_construct
from config.loader import ConfigError, parse_config
from kuberay.oracle import cluster_spec_hash
from kuberay.rules import validate_ray_service
from tests.conftest import CONFIG_DIR, rendered_ray_service, synth_variant


def data_with(rollout: str) -> dict:
    data = yaml.safe_load((CONFIG_DIR / "dev.yaml").read_text())
    data["ray_service"]["rollout"] = rollout
    return data


def cluster_hash(stack) -> str:
    manifest = stack.serving.manifest_body
    validate_ray_service(manifest)
    return cluster_spec_hash(manifest["spec"]["rayClusterConfig"])


@pytest.fixture
def changed_serve_app(tmp_path, monkeypatch):
    """serve_app with one changed line, as the next `make deploy` would package it."""
    copy_dir = tmp_path / "serve_app"
    shutil.copytree(ray_service_construct.SERVE_APP_DIR, copy_dir, ignore=shutil.ignore_patterns("__pycache__"))
    (copy_dir / "app.py").write_text((copy_dir / "app.py").read_text() + "\n# a code change\n")
    return lambda: monkeypatch.setattr(ray_service_construct, "SERVE_APP_DIR", copy_dir)


@pytest.mark.parametrize(("rollout", "new_cluster"), [("new_cluster", True), ("in_place", False)])
def test_a_serve_app_change_starts_a_new_cluster_only_with_new_cluster(
    tmp_path, changed_serve_app, rollout, new_cluster
):
    before, _ = synth_variant(tmp_path, data_with(rollout), "before")
    changed_serve_app()
    after, _ = synth_variant(tmp_path, data_with(rollout), "after")
    assert before.serving.code.asset_hash != after.serving.code.asset_hash
    assert (cluster_hash(before) != cluster_hash(after)) is new_cluster


@pytest.mark.parametrize(("rollout", "new_cluster"), [("new_cluster", True), ("in_place", False)])
def test_a_serving_spec_change_starts_a_new_cluster_only_with_new_cluster(rollout, new_cluster):
    data = data_with(rollout)
    before = rendered_ray_service(parse_config(data))
    data["serving"]["gpu_memory_utilization"] = 0.85
    after = rendered_ray_service(parse_config(data))
    for manifest in (before, after):
        validate_ray_service(manifest)
    assert before["spec"]["serveConfigV2"] != after["spec"]["serveConfigV2"]
    changed = cluster_spec_hash(before["spec"]["rayClusterConfig"]) != cluster_spec_hash(
        after["spec"]["rayClusterConfig"]
    )
    assert changed is new_cluster


def test_the_revision_is_on_every_pod_template_and_nowhere_kuberay_ignores():
    manifest = rendered_ray_service(parse_config(data_with("new_cluster")))
    cluster = manifest["spec"]["rayClusterConfig"]
    revisions = {
        g["template"]["metadata"]["annotations"]["pd-serving/serving-revision"]
        for g in [cluster["headGroupSpec"], *cluster["workerGroupSpecs"]]
    }
    assert len(revisions) == 1
    assert "annotations" not in manifest["metadata"]  # RayService annotations are not hashed
    in_place = rendered_ray_service(parse_config(data_with("in_place")))["spec"]["rayClusterConfig"]
    assert "pd-serving/serving-revision" not in str(in_place)


def test_the_hash_mirror_leaves_out_what_kuberay_leaves_out():
    cluster = rendered_ray_service(parse_config(data_with("in_place")))["spec"]["rayClusterConfig"]
    base = cluster_spec_hash(cluster)
    ignored = copy.deepcopy(cluster)
    for group in ignored["workerGroupSpecs"]:
        group.update(replicas=5, minReplicas=0, maxReplicas=9)
        group["template"]["spec"]["tolerations"] = []
        group["template"]["spec"]["schedulingGates"] = [{"name": "kueue"}]
    ignored["upgradeStrategy"] = {"type": "Recreate"}
    assert cluster_spec_hash(ignored) == base
    counted = copy.deepcopy(cluster)
    counted["workerGroupSpecs"][0]["template"]["spec"]["containers"][0]["image"] = "registry/ray:2.60.0"
    assert cluster_spec_hash(counted) != base


def test_max_surge_is_refused_with_the_images_ray_2_58():
    data = data_with("in_place")
    data["serving"]["decode"]["max_surge_percent"] = 100
    with pytest.raises(ConfigError) as caught:
        parse_config(data, source="dev.yaml")
    assert "serving.decode.max_surge_percent needs Ray 2.60 or newer" in str(caught.value)
    assert "ray_service.ray_version is 2.58.0" in str(caught.value)


@pytest.mark.serving
def test_max_surge_reaches_serve_with_a_ray_2_60_image():
    from ray.serve.schema import ServeDeploySchema

    from serve_app.serve_config import serve_config

    data = data_with("in_place")
    data["ray_service"].update(
        image="registry.example.com/ray-llm:2.60.0",
        ray_version="2.60.0",
        # An image config/versions.py does not list states what the stack must know of it.
        image_python_version="3.13",
        image_ca_bundle="/etc/pki/tls/certs/ca-bundle.crt",
        image_wheel_platform="manylinux_2_34_x86_64",
    )
    data["serving"]["decode"]["max_surge_percent"] = 100
    config = parse_config(data)
    deployment = config.serving.llm_config("decode")["deployment_config"]
    assert deployment["max_surge_percent"] == 100
    # Ray 2.60's DeploymentConfig has the field (ray/serve/_private/config.py, max_surge_percent); the
    # image's Ray 2.58, which the tests run, has not: the premise of surge_needs_ray_2_60, shown here.
    # Its Serve schema still takes the config, the key ignored.
    from ray.serve._private.config import DeploymentConfig

    assert "max_surge_percent" not in DeploymentConfig.model_fields
    ServeDeploySchema.model_validate(serve_config(config.serving, working_dir="s3://b/c.zip"))


def test_a_new_cluster_starts_at_the_replicas_that_serve_and_the_count_starts_no_upgrade():
    """`make deploy` reads each phase's worker replicas in the serving cluster (Ray's autoscaler grew
    decode to 3): the RayService's groups carry them, within min..max, so KubeRay's NewCluster
    upgrade builds the new cluster at that size; KubeRay's hash leaves replicas out, so the count
    alone never starts an upgrade."""
    from config.loader import load_config
    from kuberay.oracle import cluster_spec_hash
    from manifests.contract import RAY_HEAD_SERVICE_ACCOUNT, RAY_WORKER_SERVICE_ACCOUNT
    from manifests.ray_service import ray_service
    from serve_app.serve_config import serve_config_yaml
    from tests.conftest import CONFIG_DIR

    config = load_config(CONFIG_DIR / "prod.yaml")
    serve = serve_config_yaml(config.serving, working_dir="s3://bucket/code.zip")

    def rendered(replicas):
        manifest = ray_service(
            config,
            serve_config_v2=serve,
            head_service_account=RAY_HEAD_SERVICE_ACCOUNT,
            worker_service_account=RAY_WORKER_SERVICE_ACCOUNT,
            gcs_store_host="master.pd-prod-gcs.example.cache.amazonaws.com",
            serving_replicas=replicas,
        )
        return manifest["spec"]["rayClusterConfig"]

    plain, grown, beyond = rendered(None), rendered({"decode": 3, "prefill": 1}), rendered({"decode": 99})
    by_group = lambda cluster: {g["groupName"]: g["replicas"] for g in cluster["workerGroupSpecs"]}  # noqa: E731
    groups = config.cluster.gpu_node_groups
    assert by_group(plain) == {"prefill-gpu": groups.prefill.desired_size, "decode-gpu": groups.decode.desired_size}
    assert by_group(grown) == {"prefill-gpu": 1, "decode-gpu": 3}
    assert by_group(beyond)["decode-gpu"] == groups.decode.max_size
    assert cluster_spec_hash(plain) == cluster_spec_hash(grown) == cluster_spec_hash(beyond)


@pytest.mark.parametrize("rollout", ["new_cluster", "in_place"])
def test_raising_the_auth_token_generation_rotates_the_token_by_a_new_cluster(rollout):
    """KubeRay makes the token per RayCluster; a new cluster is a new token, whatever the rollout."""
    data = data_with(rollout)
    before = rendered_ray_service(parse_config(data))
    data["ray_service"]["auth_token_generation"] = 2
    after = rendered_ray_service(parse_config(data))
    validate_ray_service(after)
    assert cluster_spec_hash(before["spec"]["rayClusterConfig"]) != cluster_spec_hash(after["spec"]["rayClusterConfig"])


def test_turning_token_authentication_on_for_a_deployed_cluster_is_a_new_cluster():
    """The RayService that 2b5a230 deployed (before authOptions) against today's: KubeRay builds a
    second cluster with authentication on and switches to it while the old one serves; a cluster is
    never switched to token authentication in place."""
    import json

    from preview.serving import ray_service_of
    from tests.conftest import ROOT

    template = json.loads(
        (ROOT / "tests" / "fixtures" / "deployed" / "pd-dev-two-admins-2b5a230.template.json").read_text()
    )
    deployed = ray_service_of(template)["spec"]["rayClusterConfig"]
    assert "authOptions" not in deployed
    today = rendered_ray_service(parse_config(data_with("in_place")))["spec"]["rayClusterConfig"]
    assert today["authOptions"] == {"mode": "token"}
    assert cluster_spec_hash(deployed) != cluster_spec_hash(today)
    # Today's spec without authOptions and the generation hashes otherwise: they alone start the upgrade.
    stripped = copy.deepcopy(today)
    del stripped["authOptions"]
    for group in [stripped["headGroupSpec"], *stripped["workerGroupSpecs"]]:
        del group["template"]["metadata"]["annotations"]["pd-serving/ray-auth-token-generation"]
    assert cluster_spec_hash(stripped) != cluster_spec_hash(today)
