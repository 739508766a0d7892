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

from tests.preview.catalog import ADMIN_A, CATALOG

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
NEW_CLUSTER = "new cluster: KubeRay builds a second RayCluster"
EXPECT = {
    "scale-max": Expected(
        ("decode: scaling bounds max 2 -> 4; no node is replaced", "worker replica bounds: no rollout, no model load"),
        nodes=True,
        changed_types={"AWS::EKS::Nodegroup", "Custom::AWSCDK-EKS-KubernetesResource"},
    ),
    "desired-size": Expected(
        ("Cost per hour: node groups $4.23 -> $6.24",),
        nodes=True,
        warnings=("decode: DesiredSize 1 -> 2: EKS resizes the group to it at once",),
    ),
    "add-admin": Expected((f"gains cluster admin: {ADMIN_A}",), changed_types={"AWS::EKS::AccessEntry"}),
    "remove-first-admin": Expected(
        (f"loses cluster admin: {ADMIN_A}",),
        warnings=("EKS refuses a second entry for the same principal, and the update rolls back",),
        replaced_ok=("AWS::EKS::AccessEntry",),
        changed_types={"AWS::EKS::AccessEntry"},
    ),
    "change-model": Expected((IN_PLACE,)),
    "max-model-len": Expected((IN_PLACE,), changed_types={"Custom::AWSCDK-EKS-KubernetesResource"}),
    "chart-bump": Expected(
        ("nvidia-device-plugin: 0.20.0 -> 0.20.1 (helm upgrade)",), changed_types={"Custom::AWSCDK-EKS-HelmChart"}
    ),
    # The kubectl layer follows the minor; the control plane and then each node group are upgraded in place.
    "kubernetes-minor": Expected(
        ("nodes rolled one at a time",), nodes=True, replaced_ok=("AWS::Lambda::LayerVersion",)
    ),
    "cloudwatch": Expected(
        ("REPLACED: AWS::Logs::LogGroup", "REMOVED: AWS::APS::Workspace"),
        stateful=("AWS::Logs::LogGroup", "AWS::APS::Workspace"),
    ),
    "mirror-dev": Expected(("other resource(s) change",)),
    "gated": Expected((NEW_CLUSTER, "secrets-store-csi-driver 1.6.0: installed")),
    "internal-nlb": Expected(("aws-load-balancer-controller 3.2.2: installed", "no rollout, no model load")),
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


def test_a_serve_app_code_change_rolls_the_app_in_place_with_dev_rollout(rehearse, tmp_path, monkeypatch):
    """serve_app's code is an asset whose hash is in the RayService's working_dir: dev rolls out
    in_place, so Serve redeploys the app on the running cluster (prod's new_cluster: see
    tests/manifests/test_rollout.py)."""
    from cdk_constructs import ray_service as ray_service_construct
    from tests.conftest import synth_variant
    from tests.preview.conftest import dev

    code = tmp_path / "serve_app"
    shutil.copytree(ray_service_construct.SERVE_APP_DIR, code, ignore=shutil.ignore_patterns("__pycache__"))
    (code / "app.py").write_text((code / "app.py").read_text() + "\n# a code change\n")
    monkeypatch.setattr(ray_service_construct, "SERVE_APP_DIR", code)
    stack, _ = synth_variant(tmp_path, dev(), "code-change")
    rehearsal = rehearse(("dev", None), (stack.config, tmp_path / "code-change-out"))
    assert_only_what_the_edit_is_about(rehearsal, Expected((IN_PLACE,)))
