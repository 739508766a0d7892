"""The change rehearsal: each edit a user makes after the first deploy, as two deploys in a row.

Both configs are synthesized and run through the CDK CLI's own diff (its replacement analysis
comes from CloudFormation's resource specifications); each edit must make the class of change it
is about and nothing else: no logical id moves, no stateful replacement it does not demand, no node
group change for an edit that is not about nodes. The preview's summary is checked too: what
`make preview` prints for the edit.
"""

from __future__ import annotations

import shutil
from dataclasses import dataclass, field

import pytest

from tests.preview.catalog import ADMIN_A, ADMIN_B, CATALOG

# Seconds per test (each rehearsal runs the CDK CLI's diff):
# make test-unit leaves this file to make test-consumers and make test.
pytestmark = pytest.mark.consumer

NODE_TYPES = {"AWS::EKS::Nodegroup", "AWS::EC2::LaunchTemplate"}


@dataclass(frozen=True)
class Expected:
    summary: tuple[str, ...]  # phrases the preview prints
    nodes: bool = False  # the edit is about nodes
    stateful: tuple[str, ...] = ()  # resource types it replaces or removes, loudly
    moved_types: tuple[str, ...] = ()  # types of which one resource goes and another comes
    replaced_ok: tuple[str, ...] = ()  # stateless types the edit replaces
    warnings: tuple[str, ...] = ()
    changed_types: set[str] = field(default_factory=set)  # when set: exactly these types change


IN_PLACE = "in place: Serve redeploys the app on the running cluster"
KUBECTL_BARRIER_TYPE = "AWS::SSM::Parameter"
NEW_CLUSTER = "new cluster: KubeRay builds a second RayCluster"
EXPECT = {
    "scale-max": Expected(
        ("decode: scaling bounds max 2 -> 4; no node is replaced", "worker replica bounds: no rollout, no model load"),
        nodes=True,
        changed_types={"AWS::EKS::Nodegroup", "Custom::AWSCDK-EKS-KubernetesResource"},
    ),
    # desired_size only sizes a group when it is created; once it exists the autoscaler owns its size.
    "desired-size": Expected(
        ("worker replica bounds: no rollout, no model load",), changed_types={"Custom::AWSCDK-EKS-KubernetesResource"}
    ),
    "shrink-max": Expected(
        ("decode: scaling bounds max 3 -> 1; no node is replaced",),
        nodes=True,
        warnings=("decode: DesiredSize unset -> 1: EKS resizes the group to it at once",),
        changed_types={"AWS::EKS::Nodegroup", "Custom::AWSCDK-EKS-KubernetesResource"},
    ),
    # aws_eks_v2's kubectl barrier (an SSM parameter every manifest and chart waits for) waits for the admins'
    # entries too, so a destroy removes them last: its DependsOn follows them, which updates no resource.
    "add-admin": Expected(
        (f"gains cluster admin: {ADMIN_A}",), changed_types={"AWS::EKS::AccessEntry", KUBECTL_BARRIER_TYPE}
    ),
    # Entries are keyed by principal: the second admin's entry stays where it is.
    "remove-first-admin": Expected(
        (f"loses cluster admin: {ADMIN_A}",), changed_types={"AWS::EKS::AccessEntry", KUBECTL_BARRIER_TYPE}
    ),
    "change-model": Expected((IN_PLACE,)),
    "max-model-len": Expected((IN_PLACE,), changed_types={"Custom::AWSCDK-EKS-KubernetesResource"}),
    "chart-bump": Expected(
        ("nvidia-device-plugin: 0.20.0 -> 0.20.1 (helm upgrade)",), changed_types={"Custom::AWSCDK-EKS-HelmChart"}
    ),
    # The kubectl layer follows the minor; the control plane moves first, each node group in a deploy
    # of its own after it (tests/preview/test_kubernetes_upgrade.py walks them all).
    "kubernetes-minor": Expected(
        ("control plane: Kubernetes 1.35 -> 1.36", "then one `make deploy` each, with no other edit: system nodes"),
        replaced_ok=("AWS::Lambda::LayerVersion",),
    ),
    "cloudwatch": Expected(
        ("REPLACED: AWS::Logs::LogGroup", "REMOVED: AWS::APS::Workspace"),
        stateful=("AWS::Logs::LogGroup", "AWS::APS::Workspace"),
    ),
    "mirror-dev": Expected(("other resource(s) change",)),
    "gated": Expected((NEW_CLUSTER, "secrets-store-csi-driver 1.6.0: installed")),
    "internal-nlb": Expected(("aws-load-balancer-controller 3.2.2: installed", "no rollout, no model load")),
    # The launch templates carry the tags to instances, volumes and interfaces: a new version rolls the
    # nodes one at a time. The placement group carries none (its tags would replace it).
    "cost-tag": Expected(("prefill: nodes rolled one at a time (its launch template)",), nodes=True),
    "gpu-instance-type": Expected(
        ("REPLACED: AWS::EKS::Nodegroup", "decode: nodes replaced (InstanceTypes)", NEW_CLUSTER),
        nodes=True,
        stateful=("AWS::EKS::Nodegroup",),
    ),
}


def assert_only_what_the_edit_is_about(rehearsal, expected: Expected) -> None:
    summary = "\n".join(rehearsal.preview.lines())
    for phrase in expected.summary:
        assert phrase in summary, f"{phrase!r} not in the preview:\n{summary}"
    for phrase in expected.warnings:
        assert any(phrase in w for w in rehearsal.preview.warnings), rehearsal.preview.warnings
    if not expected.warnings:
        assert rehearsal.preview.warnings == [], rehearsal.preview.warnings
    replaced = {c.type for c in rehearsal.changes if c.replaced or c.may_be_replaced}
    removed_stateful = {line.split(" ")[1] for line in rehearsal.preview.stateful}
    assert removed_stateful == set(expected.stateful), rehearsal.preview.stateful
    assert rehearsal.preview.needs_confirmation is bool(expected.stateful)
    assert not (replaced - set(expected.stateful) - set(expected.replaced_ok)), replaced
    added = {c.type for c in rehearsal.changes if c.op == "+"}
    removed = {c.type for c in rehearsal.changes if c.op == "-"}
    assert not ((added & removed) - set(expected.moved_types)), f"logical ids move: {added & removed}"
    node_changes = [c for c in rehearsal.changes if c.type in NODE_TYPES]
    assert bool(node_changes) is expected.nodes, node_changes
    if expected.changed_types:
        assert {c.type for c in rehearsal.changes} == expected.changed_types, rehearsal.diff


@pytest.mark.parametrize("edit", CATALOG, ids=lambda e: e.name)
def test_each_edit_changes_what_it_is_about_and_nothing_else(rehearse, edit):
    rehearsal = rehearse(edit.before_data(), edit.after_data())
    assert_only_what_the_edit_is_about(rehearsal, EXPECT[edit.name])


def test_every_edit_of_the_catalog_has_its_expectation():
    assert sorted(EXPECT) == sorted(e.name for e in CATALOG)
    assert len(CATALOG) + 1 >= 14  # with the serve_app code change below


def test_a_serve_app_code_change_rolls_the_app_in_place_with_dev_rollout(rehearse, variant, tmp_path, monkeypatch):
    """serve_app's code is an asset whose hash is in the RayService's working_dir: dev rolls out
    in_place, so Serve redeploys the app on the running cluster (prod's new_cluster: see
    tests/manifests/test_rollout.py)."""
    from cdk_constructs import ray_service as ray_service_construct
    from tests.conftest import synth_variant
    from tests.preview.conftest import deployed_facts, dev

    variant("dev-deployed", dev(), deployed_facts(dev()))  # the stack as deployed, before the code changes
    code = tmp_path / "serve_app"
    shutil.copytree(ray_service_construct.SERVE_APP_DIR, code, ignore=shutil.ignore_patterns("__pycache__"))
    (code / "app.py").write_text((code / "app.py").read_text() + "\n# a code change\n")
    monkeypatch.setattr(ray_service_construct, "SERVE_APP_DIR", code)
    stack, _ = synth_variant(tmp_path, dev(), "code-change", deployed_facts(dev()))
    rehearsal = rehearse(("dev", None), (stack.config, tmp_path / "code-change-out"))
    assert_only_what_the_edit_is_about(rehearsal, Expected((IN_PLACE,)))


def test_a_replaced_node_group_starts_at_the_size_the_old_one_has(rehearse):
    """A create needs a size: the replacement of decode's group starts where the autoscaler had it,
    the groups it does not replace still leave their size to the autoscaler."""
    (edit,) = [e for e in CATALOG if e.name == "gpu-instance-type"]
    rehearsal = rehearse(edit.before_data(), edit.after_data())
    from manifests.contract import PHASE_LABEL

    sizes = {
        group["Properties"]["Labels"].get(PHASE_LABEL, "system"): group["Properties"]["ScalingConfig"].get(
            "DesiredSize"
        )
        for group in rehearsal.after.get("Resources", {}).values()
        if group["Type"] == "AWS::EKS::Nodegroup"
    }
    assert sizes == {"system": None, "prefill": None, "decode": 1}


def test_the_first_deploy_after_the_first_hands_the_sizes_to_the_autoscaler(variant):
    """A stack deployed before (every group with its DesiredSize) deployed again: the template stops
    setting the sizes, which CloudFormation takes as no change to them; nothing else moves."""
    import json
    from pathlib import Path

    from cli.preview import preview
    from tests.preview.conftest import deployed_facts, dev

    first_stack, _, first_dir = variant("dev-first-deploy", dev())
    old = json.loads((Path(first_dir) / f"{first_stack.config.stack_name}.template.json").read_text())
    stack, _, outdir = variant("dev-deployed", dev(), deployed_facts(dev()))
    diff, summary = preview(stack.config, assembly=Path(outdir), old=old, source="the first deploy")
    changes = summary.changes
    assert {c.type for c in changes} == {"AWS::EKS::Nodegroup"}, diff
    assert all(c.op == "~" and not (c.replaced or c.may_be_replaced) for c in changes), diff
    assert summary.warnings == [] and not summary.needs_confirmation
    stopped = [line for line in summary.nodes if "the template stops setting DesiredSize" in line]
    assert len(stopped) == 3, summary.nodes


# What the stack deployed while entries were keyed by their position in the list (Admin0, Admin1).
POSITIONAL_ENTRY_IDS = {ADMIN_A: "EksClusterAdmin06BF8452E", ADMIN_B: "EksClusterAdmin1E23D5C9A"}


def test_removing_the_first_admin_of_a_positionally_keyed_stack_moves_no_entry(variant):
    """A stack deployed with the old, positional ids: each principal keeps the logical id its entry
    has (the deploy reads them from the deployed template), so only the removed admin's entry goes."""
    import json
    from pathlib import Path

    from cli.deploy import facts_from_deployed
    from cli.preview import preview
    from config.schema import DeployFacts
    from tests.preview.conftest import deployed_facts

    (edit,) = [e for e in CATALOG if e.name == "remove-first-admin"]
    before_name, before_data = edit.before_data()
    legacy = deployed_facts(before_data).model_copy(update={"access_entry_ids": POSITIONAL_ENTRY_IDS})
    stack, _, before_dir = variant(f"{before_name}-positional", before_data, legacy)
    old = json.loads((Path(before_dir) / f"{stack.config.stack_name}.template.json").read_text())
    assert {k for k, r in old["Resources"].items() if r["Type"] == "AWS::EKS::AccessEntry"} >= set(
        POSITIONAL_ENTRY_IDS.values()
    )
    after_name, after_data = edit.after_data()
    facts = facts_from_deployed(DeployFacts.model_validate({"node_group_sizes": legacy.node_group_sizes}), old)
    after_stack, _, after_dir = variant(f"{after_name}-over-positional", after_data, facts)
    diff, summary = preview(after_stack.config, assembly=Path(after_dir), old=old, source="the positional stack")
    changes = [c for c in summary.changes if c.type != KUBECTL_BARRIER_TYPE]  # its DependsOn follows the entries
    assert [(c.op, c.logical_id) for c in changes] == [("-", POSITIONAL_ENTRY_IDS[ADMIN_A])], diff
    assert summary.warnings == [] and summary.access == [f"loses cluster admin: {ADMIN_A}"]
