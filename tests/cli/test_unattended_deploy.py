"""`make deploy REQUIRE_APPROVAL=never`: a pipeline deploys without a prompt only the template the last
`make preview` showed, over the stack that preview compared it with (cli/deploy.py)."""

from __future__ import annotations

import json

from cli.deploy import record_preview, unattended_refusal

STACK = "pd-dev-pd-serving"
DEPLOYED = {"Resources": {"Cluster": {"Type": "AWS::EKS::Cluster", "Properties": {"Version": "1.36"}}}}


def assembly(tmp_path, template: dict):
    outdir = tmp_path / "cdk.out"
    outdir.mkdir(exist_ok=True)
    (outdir / f"{STACK}.template.json").write_text(json.dumps(template, indent=1))
    return outdir


def test_the_template_the_preview_showed_deploys(tmp_path):
    outdir = assembly(tmp_path, {"Resources": {"A": {"Type": "AWS::SNS::Topic"}}})
    record = record_preview(outdir, STACK, DEPLOYED)
    assert record == tmp_path / f".preview-{STACK}.json"
    assert unattended_refusal(outdir, STACK, json.loads(json.dumps(DEPLOYED))) is None


def test_a_template_that_changed_since_the_preview_is_refused(tmp_path):
    outdir = assembly(tmp_path, {"Resources": {"A": {"Type": "AWS::SNS::Topic"}}})
    record_preview(outdir, STACK, DEPLOYED)
    assembly(tmp_path, {"Resources": {"B": {"Type": "AWS::SNS::Topic"}}})
    refusal = unattended_refusal(outdir, STACK, DEPLOYED)
    assert refusal is not None and "\n" not in refusal
    assert "the template about to be deployed (sha256 " in refusal
    assert "is not the one `make preview` showed" in refusal and "run `make preview`" in refusal


def test_a_stack_deployed_by_someone_else_since_the_preview_is_refused(tmp_path):
    outdir = assembly(tmp_path, {"Resources": {"A": {"Type": "AWS::SNS::Topic"}}})
    record_preview(outdir, STACK, DEPLOYED)
    moved = {"Resources": {"Cluster": {"Type": "AWS::EKS::Cluster", "Properties": {"Version": "1.37"}}}}
    refusal = unattended_refusal(outdir, STACK, moved)
    assert refusal == (
        "REQUIRE_APPROVAL=never: the deployed stack changed since `make preview` compared with it; run `make preview` "
        "(with the same config, credentials and address), review it, then deploy again"
    )


def test_without_a_preview_nothing_deploys_unattended(tmp_path):
    outdir = assembly(tmp_path, {"Resources": {}})
    refusal = unattended_refusal(outdir, STACK, DEPLOYED)
    assert refusal is not None
    assert refusal.startswith(f"REQUIRE_APPROVAL=never deploys only what `make preview` showed, and .preview-{STACK}")
