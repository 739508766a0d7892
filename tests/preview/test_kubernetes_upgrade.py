"""A Kubernetes upgrade rehearsed as the deploys it takes: each synthesized with the facts the deploy
before it leaves (``facts_from_deployed``), read by the preview, and deployed on the template it makes.

1.35 -> 1.36 uses the real tables of both minors; 1.36 -> 1.37 the real v37 kubectl layer and a
test-only Cluster Autoscaler tag (``tests.preview.conftest.next_kubernetes_minor``). Each step must
change only what the version changes, name the deploys still to come, and end with no change; an edit
made together with a step is refused, so is any step EKS would refuse.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.preview.conftest import NEXT_MINOR, deployed_facts, dev, edited, next_kubernetes_minor

# Seconds per synth: make test-unit leaves this file to make test-consumers and make test.
pytestmark = pytest.mark.consumer


def at_version(version: str):
    def edit(data: dict) -> None:
        data["cluster"]["kubernetes_version"] = version

    return edit


def deploy_in_turn(work: Path, start: dict, target: dict, *, most: int = 6, deployed: dict | None = None):
    """The deploys from ``start`` (deployed; or the ``deployed`` template itself) to ``target``:
    [(summary, changes)] until one changes nothing."""
    from cli.deploy import facts_from_deployed
    from consumers.template_changes import changes
    from preview.serving import summarize
    from tests.conftest import synth_variant

    if deployed is None:
        _, template = synth_variant(work, start, "deployed", deployed_facts(start))
        deployed = template.to_json()
    old = deployed
    steps = []
    for index in range(most):
        facts = facts_from_deployed(deployed_facts(target), old)
        stack, template = synth_variant(work, target, f"step-{index}", facts)
        new = template.to_json()
        found = changes(old, new)
        steps.append((summarize(old, new, found, config=stack.config), found))
        if not found:
            return steps
        old = new
    raise AssertionError(f"still changing after {most} deploys")


def test_an_upgrade_is_the_control_plane_then_one_node_group_per_deploy(tmp_path):
    steps = deploy_in_turn(tmp_path, edited(dev(), at_version("1.35")), dev())
    assert len(steps) == 5, [s.lines() for s, _ in steps]
    (control_plane, _), *node_steps, (last, nothing) = steps
    assert nothing == [] and last.lines() == ["No change."]

    assert control_plane.upgrade[0] == (
        "control plane: Kubernetes 1.35 -> 1.36, upgraded in place by EKS (the API stays up); the node groups stay "
        "at 1.35 in this deploy; 1 add-on(s) move to the versions pinned for 1.36 (config/versions.py)"
    )
    assert control_plane.upgrade[1] == (
        "then one `make deploy` each, with no other edit: system nodes 1.35 -> 1.36; prefill nodes 1.35 -> 1.36; "
        "decode nodes 1.35 -> 1.36"
    )
    assert control_plane.nodes == [] and control_plane.two_deploys == []
    changed = {(c.type, tuple(sorted(c.properties))) for c in control_plane.changes}
    assert ("AWS::EKS::Cluster", ("Version",)) in changed
    # kube-proxy follows the control plane's minor; coredns's pin is the same build for both minors.
    assert ("AWS::EKS::Addon", ("AddonVersion",)) in changed
    assert not [c for c in control_plane.changes if c.type == "AWS::EKS::Nodegroup"]

    for (summary, found), group in zip(node_steps, ("system", "prefill", "decode"), strict=True):
        # The new minor's AMI release comes with it, in the same update of the group.
        assert [(c.type, sorted(c.properties)) for c in found] == [
            ("AWS::EKS::Nodegroup", ["ReleaseVersion", "Version"])
        ]
        assert summary.upgrade[0] == f"{group} nodes: Kubernetes 1.35 -> 1.36 (rolled below)"
        assert any(line.startswith(f"{group}: nodes rolled one at a time (") for line in summary.nodes)
        assert summary.two_deploys == [] and summary.change_class.label == "nodes roll"
    assert node_steps[-1][0].upgrade[-1] == (
        "the last step of the upgrade: every node group then runs the control plane's minor"
    )


def test_the_next_minor_steps_the_same_way_with_its_own_kubectl_layer(tmp_path):
    with next_kubernetes_minor():
        steps = deploy_in_turn(tmp_path, dev(), edited(dev(), at_version(NEXT_MINOR)))
    assert [s.upgrade[0].split(",")[0] for s, _ in steps[:-1]] == [
        f"control plane: Kubernetes 1.36 -> {NEXT_MINOR}",
        f"system nodes: Kubernetes 1.36 -> {NEXT_MINOR} (rolled below)",
        f"prefill nodes: Kubernetes 1.36 -> {NEXT_MINOR} (rolled below)",
        f"decode nodes: Kubernetes 1.36 -> {NEXT_MINOR} (rolled below)",
    ]
    control_plane, found = steps[0]
    layer = [c for c in found if c.type == "AWS::Lambda::LayerVersion"]
    assert layer and control_plane.two_deploys == [], control_plane.lines()
    autoscaler = [c for c in found if c.type == "Custom::AWSCDK-EKS-HelmChart"]
    assert [sorted(c.properties) for c in autoscaler] == [["Values"]]


def test_a_new_ami_release_rolls_one_node_group_per_deploy(tmp_path):
    """The 1.36 pin moves to a newer release over a stack deployed at the older one: each group rolls in its
    own deploy, the preview names the ones still to come, and the walk ends with no change."""
    from config import versions
    from tests.conftest import synth_variant

    older = versions.ReleasePin("1.36.2-20260714", "https://github.com/awslabs/amazon-eks-ami/releases/tag/v20260714")
    with pytest.MonkeyPatch.context() as patch:
        patch.setitem(versions.NODE_AMI_RELEASES, "1.36", older)
        _, template = synth_variant(tmp_path, dev(), "deployed-older-ami", deployed_facts(dev()))
    steps = deploy_in_turn(tmp_path, dev(), dev(), deployed=template.to_json())
    assert len(steps) == 4, [s.lines() for s, _ in steps]
    pin = versions.NODE_AMI_RELEASES["1.36"].version
    for index, group in enumerate(("system", "prefill", "decode")):
        summary, found = steps[index]
        assert [(c.type, sorted(c.properties)) for c in found] == [("AWS::EKS::Nodegroup", ["ReleaseVersion"])]
        assert summary.upgrade[0] == f"{group} nodes: AMI release 1.36.2-20260714 -> {pin} (rolled below)"
        assert summary.change_class.label == "nodes roll" and summary.two_deploys == []
    assert steps[0][0].upgrade[1] == (
        f"then one `make deploy` each, with no other edit: prefill nodes to AMI release {pin}; decode nodes to AMI "
        f"release {pin}"
    )
    assert steps[-1][0].lines() == ["No change."]


def test_an_ami_release_with_another_edit_of_its_node_group_is_two_deploys(tmp_path):
    """EKS refuses "Version and ReleaseVersion updates ... combined with other updates" of a node group."""
    from cli.deploy import facts_from_deployed
    from config import versions
    from consumers.template_changes import changes
    from preview.serving import summarize
    from tests.conftest import synth_variant

    older = versions.ReleasePin("1.36.2-20260714", "https://github.com/awslabs/amazon-eks-ami/releases/tag/v20260714")
    with pytest.MonkeyPatch.context() as patch:
        patch.setitem(versions.NODE_AMI_RELEASES, "1.36", older)
        _, template = synth_variant(tmp_path, dev(), "deployed-older-ami", deployed_facts(dev()))
    old = template.to_json()

    def more_system_nodes(data: dict) -> None:
        data["cluster"]["system_node_group"]["max_size"] += 1

    target = edited(dev(), more_system_nodes)
    stack, template = synth_variant(tmp_path, target, "both", facts_from_deployed(deployed_facts(target), old))
    new = template.to_json()
    summary = summarize(old, new, changes(old, new), config=stack.config)
    (line,) = summary.two_deploys
    assert "changes ReleaseVersion together with ScalingConfig" in line, line
    assert line.endswith("deploy the other edits first, then the release")


@pytest.mark.parametrize(
    ("what", "edit"),
    [
        (
            "scale_down_idle_minutes",
            lambda d: d["cluster"].setdefault("autoscaling", {}).update(scale_down_idle_minutes=20),
        ),
        ("max_model_len", lambda d: d["serving"].update(max_model_len=4096)),
    ],
)
def test_an_edit_made_with_an_upgrade_step_is_refused_as_two_deploys(tmp_path, what, edit):
    """The control plane step and another edit in one deploy: `make deploy` stops (exit 2) and says to
    deploy them apart."""
    from cli.deploy import facts_from_deployed
    from cli.preview import REFUSED, print_summary
    from consumers.template_changes import changes
    from preview.classes import ChangeClass
    from preview.serving import summarize
    from tests.conftest import synth_variant

    work = tmp_path
    start = edited(dev(), at_version("1.35"))
    _, template = synth_variant(work, start, "deployed", deployed_facts(start))
    old = template.to_json()
    target = edited(dev(), edit)
    stack, template = synth_variant(work, target, "both", facts_from_deployed(deployed_facts(target), old))
    new = template.to_json()
    summary = summarize(old, new, changes(old, new), config=stack.config)
    (line,) = summary.two_deploys
    assert line.startswith("a Kubernetes upgrade step goes alone, and this deploy also changes "), line
    assert line.endswith(
        "deploy the other edits first with the versions that run now, or after the upgrade's last step"
    )
    assert summary.change_class is ChangeClass.TWO_DEPLOYS
    config = type("Config", (), {"stack_name": "pd-dev-pd-serving"})
    assert print_summary(config, "", summary, summary_only=True, allow=True) == REFUSED, what


def test_offline_preview_reads_the_versions_from_the_saved_template(tmp_path):
    """`make preview TEMPLATE=` has no credentials: the saved template's versions direct the step."""
    from cli.deploy import offline_facts
    from tests.conftest import synth_variant

    start = edited(dev(), at_version("1.35"))
    _, template = synth_variant(tmp_path, start, "deployed", deployed_facts(start))
    facts = offline_facts(json.loads(json.dumps(template.to_json())))
    assert facts.kubernetes_version == "1.35"
    assert facts.node_group_versions == {"system": "1.35", "prefill": "1.35", "decode": "1.35"}


def test_a_new_add_on_pin_previews_as_the_add_on_updated_in_place(tmp_path):
    """A newer coredns build pinned for 1.36 over a stack deployed at the older one: the add-on is updated in
    place, nothing else moves."""
    from config import versions
    from tests.conftest import synth_variant

    pins = versions.EKS_ADDON_RELEASES["1.36"]
    older = {**pins, "coredns": versions.ReleasePin("v1.13.2-eksbuild.11", pins["coredns"].source)}
    with pytest.MonkeyPatch.context() as patch:
        patch.setitem(versions.EKS_ADDON_RELEASES, "1.36", older)
        _, template = synth_variant(tmp_path, dev(), "deployed-older-coredns", deployed_facts(dev()))
    (summary, found), (last, _) = deploy_in_turn(tmp_path, dev(), dev(), deployed=template.to_json())
    assert [(c.type, c.op, sorted(c.properties)) for c in found] == [("AWS::EKS::Addon", "~", ["AddonVersion"])]
    assert summary.change_class.label == "in place", summary.lines()
    assert summary.upgrade == ["add-on coredns: v1.13.2-eksbuild.11 -> v1.14.3-eksbuild.3, updated in place by EKS"]
    assert summary.nodes == [] and summary.two_deploys == []
    assert last.lines() == ["No change."]
