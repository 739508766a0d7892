"""Edits that are each fine alone and must not share a deploy, and edits that are not an update at all:
the preview refuses them in one line that says what to deploy first."""

from __future__ import annotations

import pytest
import yaml

from tests.conftest import CONFIG_DIR
from tests.preview.conftest import deployed_facts, edited

# Seconds per synth: make test-unit leaves this file to make test-consumers and make test.
pytestmark = pytest.mark.consumer


def prod() -> dict:
    return yaml.safe_load((CONFIG_DIR / "prod.yaml").read_text())


def bump_kuberay(data: dict) -> None:
    data.setdefault("charts", {})["kuberay_operator"] = "1.7.1"


def bigger_head(data: dict) -> None:
    data["ray_service"].setdefault("head", {})["cpu"] = "3"


def preview_of(tmp_path, before: dict, after: dict):
    from cli.deploy import facts_from_deployed
    from consumers.template_changes import changes
    from preview.serving import summarize
    from tests.conftest import synth_variant

    _, template = synth_variant(tmp_path, before, "deployed", deployed_facts(before))
    old = template.to_json()
    stack, template = synth_variant(tmp_path, after, "next", facts_from_deployed(deployed_facts(after), old))
    new = template.to_json()
    return summarize(old, new, changes(old, new), config=stack.config)


def test_a_kuberay_chart_bump_with_a_cluster_spec_change_is_two_deploys(tmp_path):
    summary = preview_of(tmp_path, prod(), edited(edited(prod(), bump_kuberay), bigger_head))
    (line,) = summary.two_deploys
    assert line.startswith("the KubeRay operator moves 1.7.0 -> 1.7.1 while the RayCluster spec changes"), line
    assert "deploy the chart bump first (`make upgrade-crds` before it) with the spec that runs, then the spec" in line
    assert summary.change_class.label == "two deploys"


@pytest.mark.parametrize("edit", [bump_kuberay, bigger_head], ids=["chart bump", "spec change"])
def test_each_alone_deploys(tmp_path, edit):
    summary = preview_of(tmp_path, prod(), edited(prod(), edit))
    assert summary.two_deploys == [] and summary.refused == [], summary.lines()


@pytest.mark.parametrize(
    ("field", "value", "says"),
    [
        ("account", "111111111111", "aws.account is 111111111111 but the deployed stack runs in 000000000000"),
        ("region", "eu-west-1", "aws.region is eu-west-1 but the deployed stack runs in us-west-2"),
    ],
)
def test_another_account_or_region_is_a_new_environment_not_an_update(tmp_path, field, value, says):
    from cli.preview import PreviewRefused, check_same_environment
    from tests.conftest import synth_variant

    _, old = synth_variant(tmp_path, prod(), "deployed", deployed_facts(prod()))
    moved = edited(prod(), lambda d: d["aws"].update({field: value}))
    if field == "region":
        moved["network"]["availability_zones"] = ["eu-west-1a", "eu-west-1b", "eu-west-1c"]
        moved["network"]["gpu_availability_zone"] = "eu-west-1b"
    stack, new = synth_variant(tmp_path, moved, "moved", deployed_facts(moved))
    with pytest.raises(PreviewRefused) as refused:
        check_same_environment(old.to_json(), new.to_json(), source="the deployed stack", stack=stack.config.stack_name)
    (line,) = str(refused.value).splitlines()
    assert line.startswith(says), line
    assert "another account or region is a new environment, not an update of this one" in line
