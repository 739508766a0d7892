"""The controller rules are KubeRay 1.7.0's; synth says so when the config installs another operator."""

from __future__ import annotations

import json
from pathlib import Path

from config import versions
from config.loader import parse_config
from kuberay import MIRRORED_VERSION, rules_version_note
from tests.conftest import synth_variant, with_changes


def test_the_pinned_operator_is_the_release_the_rules_mirror():
    assert versions.KUBERAY_OPERATOR.version == MIRRORED_VERSION
    assert rules_version_note(versions.KUBERAY_OPERATOR.version) is None


def test_another_operator_version_is_named_with_the_rules_it_was_checked_against():
    note = rules_version_note("1.8.0")
    assert note is not None
    assert note.startswith(
        "charts.kuberay_operator is 1.8.0, but the controller rules checked at synth are KubeRay 1.7.0's"
    )
    assert "validation.go at v1.8.0" in note


def _kuberay_warnings(outdir) -> list[str]:
    """The warnings naming kuberay_operator that synth leaves in the cloud assembly, which `cdk synth`
    prints from: its manifest's metadata, read as JSON rather than through jsii's proxies of it."""
    manifest = json.loads((Path(outdir) / "manifest.json").read_text())
    metadata: list[dict] = []
    for artifact in manifest["artifacts"].values():
        metadata += [entry for entries in artifact.get("metadata", {}).values() for entry in entries]
        if "additionalMetadataFile" in artifact:  # where the assembly keeps a stack's metadata
            more = json.loads((Path(outdir) / artifact["additionalMetadataFile"]).read_text())
            metadata += [entry for entries in more.values() for entry in entries]
    return [
        str(entry["data"])
        for entry in metadata
        if entry["type"] == "aws:cdk:warning" and "kuberay_operator" in str(entry["data"])
    ]


def test_synth_warns_when_the_config_asks_for_another_operator(tmp_path, dev_data):
    data = with_changes(dev_data, {"charts.kuberay_operator": "1.8.0"})
    assert parse_config(data).charts.kuberay_operator == "1.8.0"
    synth_variant(tmp_path, data, "operator-1-8")
    (warning,) = _kuberay_warnings(tmp_path / "operator-1-8-out")
    assert "the controller rules checked at synth are KubeRay 1.7.0's" in warning


def test_synth_is_quiet_with_the_pinned_operator(synthesized):
    *_, outdir = synthesized("dev")
    assert _kuberay_warnings(outdir) == []
