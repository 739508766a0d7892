"""config/upgrade.py: a Kubernetes upgrade as the steps EKS takes, derived from what runs and the config."""

from __future__ import annotations

import pytest

from config.loader import parse_config
from config.upgrade import VersionStepRefused, remaining_steps, upgrade_step
from tests.config.helpers import problems_for

GROUPS = ("system", "prefill", "decode")


def every_group(version: str) -> dict[str, str]:
    return dict.fromkeys(GROUPS, version)


def test_a_first_deploy_creates_everything_at_the_configs_versions():
    step = upgrade_step(target="1.36", group_targets=every_group("1.36"), deployed=None, deployed_groups={})
    assert (step.control_plane, step.node_groups, step.moves) == ("1.36", every_group("1.36"), "")


def test_the_control_plane_moves_first_and_the_node_groups_stay():
    step = upgrade_step(
        target="1.37", group_targets=every_group("1.37"), deployed="1.36", deployed_groups=every_group("1.36")
    )
    assert step.control_plane == "1.37" and step.node_groups == every_group("1.36")
    assert step.moves == "control plane 1.36 -> 1.37" and step.rolls is None
    assert step.then == ("system nodes 1.36 -> 1.37", "prefill nodes 1.36 -> 1.37", "decode nodes 1.36 -> 1.37")


def test_then_one_node_group_per_deploy_the_system_nodes_first():
    step = upgrade_step(
        target="1.37", group_targets=every_group("1.37"), deployed="1.37", deployed_groups=every_group("1.36")
    )
    assert step.node_groups == {"system": "1.37", "prefill": "1.36", "decode": "1.36"}
    assert step.rolls == "system"
    step = upgrade_step(
        target="1.37",
        group_targets=every_group("1.37"),
        deployed="1.37",
        deployed_groups={"system": "1.37", "prefill": "1.36", "decode": "1.36"},
    )
    assert step.rolls == "prefill" and step.then == ("decode nodes 1.36 -> 1.37",)


def test_the_whole_upgrade_is_four_deploys_and_then_nothing():
    steps = remaining_steps(
        target="1.37", group_targets=every_group("1.37"), deployed="1.36", deployed_groups=every_group("1.36")
    )
    assert steps == [
        "control plane 1.36 -> 1.37",
        "system nodes 1.36 -> 1.37",
        "prefill nodes 1.36 -> 1.37",
        "decode nodes 1.36 -> 1.37",
    ]
    assert (
        remaining_steps(
            target="1.37", group_targets=every_group("1.37"), deployed="1.37", deployed_groups=every_group("1.37")
        )
        == []
    )


def test_a_group_held_back_is_left_where_it_is():
    targets = {**every_group("1.37"), "decode": "1.36"}
    steps = remaining_steps(target="1.37", group_targets=targets, deployed="1.36", deployed_groups=every_group("1.36"))
    assert steps == ["control plane 1.36 -> 1.37", "system nodes 1.36 -> 1.37", "prefill nodes 1.36 -> 1.37"]


def test_a_new_group_is_created_at_its_version():
    step = upgrade_step(
        target="1.36",
        group_targets=every_group("1.36"),
        deployed="1.36",
        deployed_groups={"system": "1.36", "prefill": "1.36"},
    )
    assert step.node_groups["decode"] == "1.36" and step.moves == ""


@pytest.mark.parametrize(
    ("target", "deployed", "groups", "says"),
    [
        (
            "1.35",
            "1.36",
            every_group("1.36"),
            "cluster.kubernetes_version is 1.35 but the deployed cluster runs 1.36: EKS never takes a control plane "
            "back a minor by an update; keep 1.36, or set 1.37 to upgrade",
        ),
        (
            "1.38",
            "1.36",
            every_group("1.36"),
            "cluster.kubernetes_version is 1.38 but the deployed cluster runs 1.36: EKS upgrades one minor at a "
            "time; set 1.37, deploy until `make preview` shows no upgrade step left, then the next minor",
        ),
        (
            "1.38",
            "1.37",
            {"system": "1.37", "prefill": "1.36", "decode": "1.36"},
            "cluster.kubernetes_version is 1.38 but the deployed cluster runs 1.37 with the prefill nodes at 1.36, "
            "decode nodes at 1.36: EKS upgrades a control plane only once every node group runs its version; "
            "keep 1.37 and deploy until the node groups have caught up",
        ),
    ],
)
def test_a_step_eks_refuses_is_one_line_naming_the_field_the_deployed_version_and_the_next_step(
    target, deployed, groups, says
):
    with pytest.raises(VersionStepRefused) as refused:
        upgrade_step(target=target, group_targets=every_group(target), deployed=deployed, deployed_groups=groups)
    assert str(refused.value) == says


def test_a_node_group_is_never_taken_back_a_minor():
    with pytest.raises(VersionStepRefused) as refused:
        upgrade_step(
            target="1.36",
            group_targets={**every_group("1.36"), "prefill": "1.35"},
            deployed="1.36",
            deployed_groups=every_group("1.36"),
        )
    assert str(refused.value) == (
        "cluster.gpu_node_groups.prefill.kubernetes_version is 1.35 but the prefill nodes run 1.36: EKS never takes "
        "a node group back a minor; set 1.36 or later"
    )


def test_a_node_group_may_not_run_ahead_of_the_control_plane(dev_data):
    dev_data["cluster"]["gpu_node_groups"]["decode"]["kubernetes_version"] = "1.37"
    assert (
        "cluster.gpu_node_groups.decode.kubernetes_version 1.37 is newer than cluster.kubernetes_version 1.36: nodes "
        "may not run ahead of the control plane; set 1.36 or leave it out"
    ) in problems_for(dev_data)


def test_a_node_group_may_lag_three_minors_and_no_more(dev_data):
    dev_data["cluster"]["system_node_group"]["kubernetes_version"] = "1.33"
    assert parse_config(dev_data, source="test.yaml").cluster.node_group_versions()["system"] == "1.33"
    dev_data["cluster"]["system_node_group"]["kubernetes_version"] = "1.32"
    assert (
        "cluster.system_node_group.kubernetes_version 1.32 is more than 3 minors behind cluster.kubernetes_version "
        "1.36 (Kubernetes' version skew policy); set 1.33 or later"
    ) in problems_for(dev_data)


def test_the_synth_refuses_a_step_from_the_deployed_versions_in_one_line(tmp_path, dev_data):
    """`make deploy` passes what runs; a config EKS would refuse fails the synth, before any deploy."""
    import yaml

    from app import build_app
    from config.loader import ConfigError
    from config.schema import DeployFacts

    config = tmp_path / "dev.yaml"
    dev_data["cluster"]["kubernetes_version"] = "1.35"
    config.write_text(yaml.safe_dump(dev_data))
    facts = tmp_path / "facts.json"
    facts.write_text(DeployFacts(kubernetes_version="1.36", node_group_versions=every_group("1.36")).model_dump_json())
    with pytest.raises(ConfigError) as refused:
        build_app(str(config), outdir=str(tmp_path / "out"), deploy_facts=str(facts))
    (line,) = refused.value.problems
    assert line.startswith("cluster.kubernetes_version is 1.35 but the deployed cluster runs 1.36")
