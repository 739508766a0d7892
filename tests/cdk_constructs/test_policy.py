"""Policy: cdk-nag 3 (through the Validations API), cfn-lint, and a scan for secret material."""

from __future__ import annotations

import json
import subprocess
import sys

import aws_cdk as cdk
import pytest
from aws_cdk import aws_s3 as s3

from cdk_constructs.policy import acknowledge, attach_policy_checks
from tests.conftest import ROOT, SHIPPED_ENVIRONMENTS
from tests.secret_scan import find_secrets


def _report(outdir) -> dict:
    return json.loads((outdir / "validation-report.json").read_text())


def _nag_report(outdir) -> dict:
    (report,) = [p for p in _report(outdir)["pluginReports"] if p["pluginName"] == "AwsSolutions"]
    return report


@pytest.mark.parametrize("env", SHIPPED_ENVIRONMENTS)
def test_no_unacknowledged_aws_solutions_findings(synthesized, env):
    *_, app, outdir = synthesized(env)
    report = _nag_report(outdir)
    assert report["violations"] == []
    assert report["conclusion"] == "success"
    # The acknowledged ones stay visible, each with its reason.
    assert len(report["suppressedViolations"]) >= 5
    for finding in report["suppressedViolations"]:
        assert len(finding["reason"]) >= 20, finding["ruleName"]


def test_policy_check_catches_a_known_violation(tmp_path):
    app = cdk.App(outdir=str(tmp_path), context={"@aws-cdk/core:failSynthOnValidationErrors": False})
    stack = cdk.Stack(app, "Violating", env=cdk.Environment(account="111111111111", region="us-east-2"))
    s3.Bucket(stack, "NoSslNoLogs")  # no server access logs, no SSL-only policy
    attach_policy_checks(app)
    app.synth()
    rules = {v["ruleName"] for v in _nag_report(tmp_path)["violations"]}
    assert "AwsSolutions-S1" in rules
    assert "AwsSolutions-S10" in rules


def test_synth_fails_on_an_unacknowledged_finding(tmp_path):
    app = cdk.App(outdir=str(tmp_path))
    stack = cdk.Stack(app, "Violating", env=cdk.Environment(account="111111111111", region="us-east-2"))
    s3.Bucket(stack, "NoSslNoLogs")
    attach_policy_checks(app)
    with pytest.raises(RuntimeError, match="ValidationFailed: ERROR The S3 Bucket has server access logs disabled"):
        app.synth()


def test_acknowledgement_without_a_real_reason_is_refused(tmp_path):
    stack = cdk.Stack(cdk.App(outdir=str(tmp_path)), "S")
    with pytest.raises(ValueError, match="needs a real reason"):
        acknowledge(stack, "AwsSolutions-S1", "ok")


@pytest.mark.parametrize("env", SHIPPED_ENVIRONMENTS)
def test_cfn_lint_reports_nothing(synthesized, env):
    config, *_, outdir = synthesized(env)
    template = outdir / f"{config.stack_name}.template.json"
    result = subprocess.run(
        [sys.executable, "-m", "cfnlint", "--format", "json", str(template)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    findings = json.loads(result.stdout or "[]")
    assert findings == [], [f"{f['Rule']['Id']}: {f['Message']}" for f in findings]


@pytest.mark.parametrize("env", SHIPPED_ENVIRONMENTS)
def test_no_secret_material_in_templates_manifests_or_serve_config(synthesized, env):
    config, stack, template, _, outdir = synthesized(env)
    texts = {path.name: path.read_text() for path in outdir.glob("*.json")}
    texts["serveConfigV2"] = stack.serving.serve_config_v2
    texts["RayService"] = json.dumps(stack.serving.manifest_body)
    assert texts["serveConfigV2"]
    for name, text in texts.items():
        assert find_secrets(text) == [], name


def test_secret_scan_finds_planted_secrets():
    planted = "env: {HF_TOKEN: hf_" + "a" * 34 + "}, key: AKIA" + "ABCDEFGHIJKLMNOP"
    found = find_secrets(planted)
    assert any(f.startswith("Hugging Face token") for f in found)
    assert any(f.startswith("AWS access key id") for f in found)
    assert any(f.startswith("token variable") for f in found)
