"""`make destroy` leaves nothing behind and cannot hang: deletion order and policies, as synthesized."""

from __future__ import annotations

import json

import pytest
import yaml

from tests.conftest import CONFIG_DIR, SHIPPED_ENVIRONMENTS, synth_variant


def _rayservice_id(resources: dict) -> str:
    (found,) = [
        k for k, r in resources.items()
        if r["Type"] == "Custom::AWSCDK-EKS-KubernetesResource"
        and '"kind":"RayService"' in json.dumps(r["Properties"]["Manifest"]).replace(" ", "").replace("\\\\", "").replace('\\"', '"')
    ]
    return found


@pytest.mark.parametrize("env", SHIPPED_ENVIRONMENTS)
def test_nothing_is_retained(synthesized, env):
    _, _, template, _, _ = synthesized(env)
    for logical_id, resource in template.to_json()["Resources"].items():
        assert resource.get("DeletionPolicy", "Delete") == "Delete", logical_id
        assert resource.get("UpdateReplacePolicy", "Delete") == "Delete", logical_id


@pytest.mark.parametrize("env", SHIPPED_ENVIRONMENTS)
def test_rayservice_is_deleted_before_nodes_and_operator(synthesized, env):
    _, _, template, _, _ = synthesized(env)
    resources = template.to_json()["Resources"]
    depends = set(resources[_rayservice_id(resources)]["DependsOn"])
    nodegroups = {k for k, r in resources.items() if r["Type"] == "AWS::EKS::Nodegroup"}
    assert nodegroups <= depends
    kuberay = {
        k for k, r in resources.items()
        if r["Type"] == "Custom::AWSCDK-EKS-HelmChart" and r["Properties"]["Chart"] == "kuberay-operator"
    }
    assert kuberay <= depends


def test_load_balancer_is_removed_by_its_controller_before_the_vpc(tmp_path):
    data = yaml.safe_load((CONFIG_DIR / "dev.yaml").read_text())
    data["ray_service"] = {"endpoint": {"internal_nlb": True, "allowed_cidrs": ["10.40.0.0/16"]}}
    _, template = synth_variant(tmp_path, data, "nlb")
    resources = template.to_json()["Resources"]
    depends = set(resources[_rayservice_id(resources)]["DependsOn"])
    controller = {
        k for k, r in resources.items()
        if r["Type"] == "Custom::AWSCDK-EKS-HelmChart" and r["Properties"]["Chart"] == "aws-load-balancer-controller"
    }
    assert controller and controller <= depends
    (chart,) = [resources[k] for k in controller]
    # The controller itself goes only after the nodes that run it are no longer needed by it.
    assert chart["Properties"]["Namespace"] == "kube-system"


def test_kms_key_is_scheduled_for_deletion(synthesized):
    _, _, template, _, _ = synthesized("dev")
    template.has_resource("AWS::KMS::Key", {"DeletionPolicy": "Delete", "Properties": {"PendingWindowInDays": 7, "EnableKeyRotation": True}})
