"""The RayService through KubeRay 1.7.0's controller rules, not only its CRD schema.

The rules are mirrored in ``kuberay/`` (``rules.py``, ``oracle.py``) from ray-project/kuberay v1.7.0
(``ray-operator/controllers/ray/utils/validation.go``: ``ValidateRayServiceMetadata``,
``ValidateRayServiceSpec``, ``ValidateRayClusterSpec``, ``validateRayGroupResources``,
``validateRayGroupLabels``, ``ValidateRayClusterMetadata``, ``ValidateRayClusterUpgradeOptions``;
``common/pod.go``: ``updateRayStartParamsResources``, ``generateRayStartCommand``). Every
RayService the tests render, shipped or variant, goes through them; the construct applies them at
synth too.
"""

from __future__ import annotations

import re

import pytest
import yaml

from config import catalog
from config.loader import ConfigError, load_config, parse_config
from kuberay import KubeRayRejection
from kuberay.oracle import ray_start_resources
from kuberay.rules import validate_ray_service
from tests.conftest import CONFIG_DIR, SHIPPED_ENVIRONMENTS, rendered_ray_service, with_changes


def dev_manifest() -> dict:
    return rendered_ray_service(load_config(CONFIG_DIR / "dev.yaml"))


def group(manifest: dict, name: str) -> dict:
    (found,) = [g for g in manifest["spec"]["rayClusterConfig"]["workerGroupSpecs"] if g["groupName"] == name]
    return found


@pytest.mark.parametrize("env", SHIPPED_ENVIRONMENTS)
def test_every_shipped_rayservice_passes_the_controller(env):
    config = load_config(CONFIG_DIR / f"{env}.yaml")
    validate_ray_service(rendered_ray_service(config))


VARIANTS = {
    "colocated": {"serving.mode": "colocated"},
    "internal-nlb": {
        "ray_service.endpoint": {"internal_nlb": True, "allowed_cidrs": ["10.0.0.0/8"], "open_to_vpc_without_key": True}
    },
    "scale-to-zero-prefill": {"cluster.gpu_node_groups.prefill.min_size": 0},
    "longest-name": {"ray_service.name": "a" * 47},
    "gated": {
        "serving.model": {
            "model_id": "llama-3.1-8b",
            "source": "meta-llama/Llama-3.1-8B-Instruct",
            "gated": True,
            "hf_token_secret": "pd-serving/hf-token",
        }
    },
}


@pytest.mark.parametrize("variant", sorted(VARIANTS))
@pytest.mark.parametrize("env", SHIPPED_ENVIRONMENTS)
def test_config_variants_pass_the_controller(env, variant):
    data = with_changes(yaml.safe_load((CONFIG_DIR / f"{env}.yaml").read_text()), VARIANTS[variant])
    validate_ray_service(rendered_ray_service(parse_config(data)))


@pytest.mark.parametrize("phase", ["prefill", "decode"])
def test_ray_sees_the_phase_gpus_cpus_and_its_own_resource(phase):
    """pod.go: group resources become --num-cpus/--num-gpus/--resources; memory from the limits."""
    config = load_config(CONFIG_DIR / "dev.yaml")
    facts = catalog.INSTANCES[config.cluster.gpu_node_groups.prefill.instance_type]
    worker = group(rendered_ray_service(config), f"{phase}-gpu")
    seen = ray_start_resources(worker)
    assert seen["num-gpus"] == facts.gpu_count
    assert seen["num-cpus"] == facts.vcpus - 4
    assert seen["resources"] == {f"pd_{phase}": 1.0}
    limit = worker["template"]["spec"]["containers"][0]["resources"]["limits"]["memory"]
    assert seen["memory"] == int(limit.removesuffix("Gi")) * 2**30
    # Only one of KubeRay's two places carries resources (validateRayGroupResources).
    assert not {"num-cpus", "num-gpus", "memory", "resources"} & set(worker["rayStartParams"])


def test_head_advertises_no_cpus_or_gpus():
    head = dev_manifest()["spec"]["rayClusterConfig"]["headGroupSpec"]
    seen = ray_start_resources(head)
    assert (seen["num-cpus"], seen["num-gpus"], seen["resources"]) == (0, 0, {})


def _both_places(m):
    group(m, "prefill-gpu")["rayStartParams"]["num-gpus"] = "1"


def _labels_in_start_params(m):
    group(m, "decode-gpu")["rayStartParams"]["labels"] = "phase=decode"


def _bad_label(m):
    group(m, "decode-gpu")["labels"] = {"pd phase": "decode"}


def _min_above_max(m):
    group(m, "decode-gpu").update(minReplicas=3, maxReplicas=2)


def _head_service_name(m):
    m["spec"]["rayClusterConfig"]["headGroupSpec"]["headService"] = {"metadata": {"name": "head"}}


def _cluster_upgrade_strategy(m):
    m["spec"]["rayClusterConfig"]["upgradeStrategy"] = {"type": "Recreate"}


def _idle_timeout_without_v2(m):
    m["spec"]["rayClusterConfig"]["autoscalerOptions"].pop("version")
    group(m, "prefill-gpu")["idleTimeoutSeconds"] = 300


def _restart_always_with_v2(m):
    group(m, "decode-gpu")["template"]["spec"]["restartPolicy"] = "Always"


def _v2_in_both_places(m):
    head = m["spec"]["rayClusterConfig"]["headGroupSpec"]["template"]["spec"]["containers"][0]
    head["env"].append({"name": "RAY_enable_autoscaler_v2", "value": "1"})


REJECTIONS = [
    (_both_places, "resource fields should not be set in both rayStartParams and Resources for prefill-gpu group"),
    (_labels_in_start_params, "rayStartParams['labels'] is not supported for decode-gpu group"),
    (_bad_label, "invalid label key for decode-gpu group: 'pd phase'"),
    (_min_above_max, "worker group decode-gpu has minReplicas 3 greater than maxReplicas 2"),
    (_head_service_name, "headService.metadata.name should not be set"),
    (
        lambda m: m["spec"].update(upgradeStrategy={"type": "Recreate"}),
        "Spec.UpgradeStrategy.Type value Recreate is invalid",
    ),
    (
        lambda m: m["spec"].update(rayClusterDeletionDelaySeconds=-1),
        "RayClusterDeletionDelaySeconds should be a non-negative",
    ),
    (lambda m: m["metadata"].update(name="a" * 48), "RayService name should be no more than 47 characters"),
    (lambda m: m["metadata"].update(name="1-llm"), "RayService name should be a valid DNS1035 label"),
    (_cluster_upgrade_strategy, "upgradeStrategy cannot be set when RayCluster is created by RayService"),
    (_idle_timeout_without_v2, "idleTimeoutSeconds is set, but autoscaler v2 is not enabled"),
    (
        _restart_always_with_v2,
        "restartPolicy for worker group decode-gpu should be Never or unset when using autoscaler V2",
    ),
    (_v2_in_both_places, "both .spec.autoscalerOptions.version and head Pod env var RAY_enable_autoscaler_v2 are set"),
    (
        lambda m: m["spec"].update(upgradeStrategy={"type": "NewClusterWithIncrementalUpgrade"}),
        "ClusterUpgradeOptions are required for NewClusterWithIncrementalUpgrade",
    ),
]


@pytest.mark.parametrize(("breakage", "message"), REJECTIONS, ids=[m.split(":")[0][:40] for _, m in REJECTIONS])
def test_each_rule_refuses_what_kuberay_refuses(breakage, message):
    manifest = dev_manifest()
    validate_ray_service(manifest)
    breakage(manifest)
    with pytest.raises(KubeRayRejection, match=re.escape(message)):
        validate_ray_service(manifest)


@pytest.mark.parametrize(
    ("name", "fix"),
    [("a" * 48, "at most 47 characters"), ("1-llm", "starting with a letter"), ("pd_llm", "DNS-1035 label")],
)
def test_rayservice_name_kuberay_refuses_is_a_config_error(dev_data, name, fix):
    dev_data.setdefault("ray_service", {})["name"] = name
    with pytest.raises(ConfigError) as caught:
        parse_config(dev_data, source="dev.yaml")
    (line,) = caught.value.problems
    assert line.startswith("ray_service.name: ")
    assert fix in line


@pytest.mark.parametrize("env", ["dev", "prod"])
def test_kuberay_sets_every_pod_up_for_autoscaler_v2(env):
    """Ray 2.58 runs autoscaler v2; with the version said, KubeRay gives every pod restartPolicy
    Never, so a pod whose Ray died is replaced and the autoscaler can reclaim it."""
    from config.loader import load_config
    from kuberay.oracle import pod_restart_policy
    from tests.conftest import CONFIG_DIR, rendered_ray_service

    manifest = rendered_ray_service(load_config(CONFIG_DIR / f"{env}.yaml"))
    cluster = manifest["spec"]["rayClusterConfig"]
    assert cluster["autoscalerOptions"]["version"] == "v2"
    for group in [cluster["headGroupSpec"], *cluster["workerGroupSpecs"]]:
        assert pod_restart_policy(cluster, group) == "Never"
    validate_ray_service(manifest)
