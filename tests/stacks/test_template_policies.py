"""Every synthesized template as AWS Control Tower's proactive rules (cfn-guard) and checkov read it.

A finding is either fixed in the constructs or acknowledged next to the construct that causes it
(``cdk_constructs.policy.acknowledge_checkov`` / ``acknowledge_guard``), as metadata on the resource,
with its reason; and every acknowledgement still matches a finding. checkov reads its metadata
itself, so the template is scanned as shipped, and once more without that metadata to see what it
hides. Control Tower's rules do not read ``Metadata.guard`` (the last test shows it), so this test
applies it.

The templates: the shipped environments (dev and prod, both on the amp backend) and variants that
add or remove resources: a gated model's token charts, the internal NLB with its load balancer
controller, the model mirror (auto-deleted in dev, kept in prod), the other observability backends.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import yaml

from consumers.binaries import MissingTool, cfn_guard
from tests.cdk_constructs.test_hf_token import gated_data
from tests.conftest import CONFIG_DIR, ROOT, SHIPPED_ENVIRONMENTS, with_changes

# Seconds per test (checkov and cfn-guard over every template):
# make test-unit leaves this file to make test-consumers and make test.
pytestmark = pytest.mark.consumer

CHECKOV = ROOT / ".venv-checkov" / "bin" / "checkov"
TIMEOUT_S = 600


def _config(env: str) -> dict:
    return yaml.safe_load((CONFIG_DIR / f"{env}.yaml").read_text())


def _variants() -> dict[str, dict]:
    dev, prod = _config("dev"), _config("prod")
    return {
        "gated": gated_data(),
        "internal-nlb": with_changes(
            dev,
            {
                "ray_service.endpoint": {
                    "internal_nlb": True,
                    "allowed_cidrs": [dev["network"]["vpc_cidr"]],
                    "open_to_vpc_without_key": True,
                }
            },
        ),
        "mirror-dev": with_changes(dev, {"model_mirror.enabled": True}),
        # GCS fault tolerance outside production: one store node (prod has it on, with a replica).
        "gcs-ft-dev": with_changes(dev, {"ray_service.gcs_fault_tolerance": {"enabled": True}}),
        "mirror-prod": with_changes(prod, {"model_mirror.enabled": True}),
        "cloudwatch": with_changes(dev, {"observability.backend": "cloudwatch"}),
        "no-observability": with_changes(dev, {"observability.backend": "none"}),
    }


CASES = [*SHIPPED_ENVIRONMENTS, *_variants()]

# (template file name, logical id, rule or check id)
Key = tuple[str, str, str]


@dataclass
class Scan:
    """What both tools said about one case's templates, and what the templates acknowledge."""

    guard_findings: dict[Key, str] = field(default_factory=dict)
    guard_acknowledged: dict[Key, str] = field(default_factory=dict)
    checkov_findings: dict[Key, str] = field(default_factory=dict)
    checkov_acknowledged: dict[Key, str] = field(default_factory=dict)
    # As checkov reports the templates as shipped: its failures and the skips it applied itself.
    checkov_failed_as_shipped: dict[Key, str] = field(default_factory=dict)
    checkov_skipped_as_shipped: dict[Key, str] = field(default_factory=dict)


def _resources(template: dict) -> Iterator[tuple[str, dict]]:
    yield from template.get("Resources", {}).items()


def _acknowledgements(path: Path) -> tuple[dict[Key, str], dict[Key, str]]:
    """(guard's, checkov's) acknowledgements in one template: key -> reason."""
    guard: dict[Key, str] = {}
    checkov: dict[Key, str] = {}
    for logical_id, resource in _resources(json.loads(path.read_text())):
        metadata = resource.get("Metadata", {})
        reasons = metadata.get("guard", {}).get("Reasons", {})
        for rule in metadata.get("guard", {}).get("SuppressedRules", []):
            guard[(path.name, logical_id, rule)] = reasons.get(rule, "")
        for skip in metadata.get("checkov", {}).get("skip", []):
            checkov[(path.name, logical_id, skip["id"])] = skip.get("comment", "")
    return guard, checkov


def _without_checkov_metadata(path: Path, target: Path) -> Path:
    template = json.loads(path.read_text())
    for _, resource in _resources(template):
        resource.get("Metadata", {}).pop("checkov", None)
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_text(json.dumps(template))
    return target


def _offline_environment() -> dict[str, str]:
    """checkov without a platform: no API key or URL of the caller's, no guidelines download
    (BC_SKIP_MAPPING, --skip-download), no PyPI version check at import."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("BC_", "PRISMA_", "CKV_", "CHECKOV_"))}
    env.update(BC_SKIP_MAPPING="TRUE", CKV_SKIP_PACKAGE_UPDATE_CHECK="TRUE", LOG_LEVEL="WARNING")
    return env


def _require_checkov() -> None:
    if not os.access(CHECKOV, os.X_OK):
        pytest.fail(
            f"checkov is not installed ({CHECKOV.relative_to(ROOT)}): run make .venv-checkov/.installed "
            "(make test installs it)",
            pytrace=False,
        )


def _guard() -> tuple[Path, Path]:
    try:
        return cfn_guard()
    except MissingTool as exc:
        pytest.fail(f"cfn-guard: {exc}", pytrace=False)


def _start_checkov(files: list[Path], cwd: Path) -> subprocess.Popen[str]:
    _require_checkov()
    files_args = [arg for f in files for arg in ("-f", str(f))]
    return subprocess.Popen(
        [str(CHECKOV), *files_args, "--framework", "cloudformation", "--skip-download", "-o", "json", "--soft-fail"],
        # Away from the repository, so that no .checkov.yaml of a checkout changes what runs.
        cwd=cwd,
        env=_offline_environment(),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def _checkov_reports(process: subprocess.Popen[str]) -> list[dict]:
    stdout, stderr = process.communicate(timeout=TIMEOUT_S)
    assert process.returncode == 0, f"checkov failed ({process.returncode}): {stderr[-2000:]}"
    output = json.loads(stdout)
    return output if isinstance(output, list) else [output]


def _checkov_results(reports: list[dict], outcome: str) -> Iterator[tuple[Path, str, str, dict]]:
    """(file, logical id, check id, check) for each ``failed_checks`` or ``skipped_checks`` entry."""
    for report in reports:
        for check in report.get("results", {}).get(outcome, []):
            _, logical_id = check["resource"].split(".", 1)
            yield Path(check["file_abs_path"]).resolve(), logical_id, check["check_id"], check


_RESOURCE_PATH = re.compile(r"^/Resources/([^/]+)")
_CONTROL_ID = re.compile(r"\[(CT\.[A-Z0-9]+\.PR\.\d+)\]:\s*(.*)")


def _guard_failures(result: Any, resources: set[str], messages: list[str], compared_to: bool = False) -> None:
    """Walks one failed rule of cfn-guard's structured output: the resources whose paths it reports,
    and Control Tower's id and title from the rule's custom message. The ``to`` side of a comparison
    is the value a property was compared with, not a resource that failed."""
    if isinstance(result, list):
        for item in result:
            _guard_failures(item, resources, messages, compared_to)
    elif isinstance(result, dict):
        for key, value in result.items():
            if key == "path" and isinstance(value, str) and not compared_to:
                match = _RESOURCE_PATH.match(value)
                if match:
                    resources.add(match.group(1))
            elif key == "custom_message" and isinstance(value, str):
                messages.extend(" ".join(m) for m in _CONTROL_ID.findall(value))
            else:
                _guard_failures(value, resources, messages, compared_to or key == "to")


def run_guard(templates: list[Path]) -> dict[tuple[Path, str, str], str]:
    """Control Tower's proactive rules on the templates: (template, logical id, rule name) -> control."""
    binary, rules = _guard()
    data_args = [arg for t in templates for arg in ("--data", str(t))]
    result = subprocess.run(
        [str(binary), "validate", "--rules", str(rules), *data_args, "--output-format", "json"]
        + ["--show-summary", "none", "--structured"],
        capture_output=True,
        text=True,
        timeout=TIMEOUT_S,
    )
    # 19: some rule failed; anything else but 0 is guard's own error.
    assert result.returncode in (0, 19), f"cfn-guard failed ({result.returncode}): {result.stderr[-2000:]}"
    findings: dict[tuple[Path, str, str], str] = {}
    documents = json.loads(result.stdout)
    assert {Path(d["name"]).resolve() for d in documents} == {t.resolve() for t in templates}
    for document in documents:
        path = Path(document["name"]).resolve()
        for failed in document.get("not_compliant", []):
            rule = failed["Rule"]["name"]
            resources: set[str] = set()
            messages: list[str] = []
            _guard_failures(failed, resources, messages)
            # A finding without a resource cannot carry an acknowledgement: it always shows.
            for logical_id in resources or {"<template>"}:
                findings[(path, logical_id, rule)] = messages[0] if messages else rule
    return findings


@pytest.fixture(scope="module")
def scans(synthesized, variant, tmp_path_factory) -> dict[str, Scan]:
    """Synthesizes every case, then runs checkov (in the background) and cfn-guard once over all."""
    _require_checkov()
    _guard()
    outdirs: dict[str, Path] = {env: Path(synthesized(env)[4]) for env in SHIPPED_ENVIRONMENTS}
    for name, data in _variants().items():
        outdirs[name] = variant(name, data)[2]
    templates = {case: sorted(outdir.rglob("*.template.json")) for case, outdir in outdirs.items()}
    assert all(templates.values()), {case: str(outdirs[case]) for case, found in templates.items() if not found}

    work = tmp_path_factory.mktemp("checkov")
    unmarked = {
        template.resolve(): _without_checkov_metadata(template, work / case / template.name).resolve()
        for case, found in templates.items()
        for template in found
    }
    checkov = _start_checkov([*unmarked, *unmarked.values()], cwd=work)
    try:
        guard = run_guard([t for found in templates.values() for t in found])
        reports = _checkov_reports(checkov)
    finally:
        if checkov.poll() is None:
            checkov.kill()
            checkov.wait()
    # A template that checkov could not parse would pass with no finding at all.
    assert [r["summary"]["parsing_errors"] for r in reports] == [0] * len(reports)
    scanned = {
        path
        for outcome in ("passed_checks", "failed_checks", "skipped_checks")
        for path, *_ in _checkov_results(reports, outcome)
    }
    assert scanned == {*unmarked, *unmarked.values()}, "checkov did not scan every template"

    case_of = {t.resolve(): case for case, found in templates.items() for t in found}
    case_of.update({unmarked[t]: case_of[t] for t in unmarked})
    result = {case: Scan() for case in templates}
    for (path, logical_id, rule), control in guard.items():
        result[case_of[path]].guard_findings[(path.name, logical_id, rule)] = control
    for case, found in templates.items():
        for template in found:
            guard_acks, checkov_acks = _acknowledgements(template)
            result[case].guard_acknowledged.update(guard_acks)
            result[case].checkov_acknowledged.update(checkov_acks)
    shipped = set(unmarked)
    for path, logical_id, check_id, check in _checkov_results(reports, "failed_checks"):
        scan, key = result[case_of[path]], (path.name, logical_id, check_id)
        target = scan.checkov_failed_as_shipped if path in shipped else scan.checkov_findings
        target[key] = check["check_name"]
    for path, logical_id, check_id, check in _checkov_results(reports, "skipped_checks"):
        if path in shipped:
            key = (path.name, logical_id, check_id)
            result[case_of[path]].checkov_skipped_as_shipped[key] = check["check_result"].get("suppress_comment", "")
    return result


def _lines(findings: dict[Key, str]) -> str:
    return "\n".join(
        f"  {logical_id}: {rule} ({what})  [{name}]" for (name, logical_id, rule), what in sorted(findings.items())
    )


@pytest.mark.parametrize("case", CASES)
def test_control_tower_rules_find_nothing_unacknowledged(scans, case):
    scan = scans[case]
    unexplained = {k: v for k, v in scan.guard_findings.items() if k not in scan.guard_acknowledged}
    if unexplained:
        pytest.fail(
            "cfn-guard (Control Tower's proactive rules) findings: fix them, or acknowledge_guard() them next to "
            f"the construct that causes them, with the reason:\n{_lines(unexplained)}",
            pytrace=False,
        )


@pytest.mark.parametrize("case", CASES)
def test_checkov_finds_nothing_unacknowledged(scans, case):
    scan = scans[case]
    if scan.checkov_failed_as_shipped:
        pytest.fail(
            "checkov findings: fix them, or acknowledge_checkov() them next to the construct that causes them, "
            f"with the reason:\n{_lines(scan.checkov_failed_as_shipped)}",
            pytrace=False,
        )
    # checkov applied each acknowledgement itself, with its reason.
    matched = {k: v for k, v in scan.checkov_acknowledged.items() if k in scan.checkov_findings}
    assert scan.checkov_skipped_as_shipped == matched


@pytest.mark.parametrize("case", CASES)
def test_every_acknowledgement_still_matches_a_finding(scans, case):
    scan = scans[case]
    stale = {k: "cfn-guard" for k in scan.guard_acknowledged if k not in scan.guard_findings}
    stale |= {k: "checkov" for k in scan.checkov_acknowledged if k not in scan.checkov_findings}
    if stale:
        pytest.fail(f"acknowledgements that match no finding (stale: remove them):\n{_lines(stale)}", pytrace=False)
    acknowledged = scan.guard_acknowledged | scan.checkov_acknowledged
    unreasoned = {k: reason for k, reason in acknowledged.items() if len(reason.strip()) < 20}
    assert not unreasoned, f"acknowledgements without a reason:\n{_lines(unreasoned)}"


def test_acknowledging_needs_a_reason_and_a_resource(tmp_path):
    import aws_cdk as cdk
    from aws_cdk import aws_s3 as s3
    from aws_cdk.assertions import Template

    from cdk_constructs.policy import acknowledge_checkov, acknowledge_guard

    stack = cdk.Stack(cdk.App(outdir=str(tmp_path)), "S")
    bucket = s3.Bucket(stack, "Bucket")
    with pytest.raises(ValueError, match="needs a real reason"):
        acknowledge_checkov(bucket, "CKV_AWS_18", "ok", resource_type="AWS::S3::Bucket")
    with pytest.raises(ValueError, match="no AWS::Lambda::Function"):
        acknowledge_guard(
            bucket, "lambda_inside_vpc_check", "a reason long enough", resource_type="AWS::Lambda::Function"
        )
    acknowledge_guard(bucket, "s3_lifecycle_policy_check", "first reason, long enough", resource_type="AWS::S3::Bucket")
    acknowledge_guard(
        bucket, "s3_lifecycle_policy_check", "second reason, long enough", resource_type="AWS::S3::Bucket"
    )
    acknowledge_checkov(bucket, "CKV_AWS_18", "a reason long enough", resource_type="AWS::S3::Bucket")
    (resource,) = Template.from_stack(stack).to_json()["Resources"].values()
    assert resource["Metadata"] == {
        "guard": {
            "SuppressedRules": ["s3_lifecycle_policy_check"],
            "Reasons": {"s3_lifecycle_policy_check": "second reason, long enough"},
        },
        "checkov": {"skip": [{"id": "CKV_AWS_18", "comment": "a reason long enough"}]},
    }


def test_control_tower_rules_ignore_guard_metadata(tmp_path):
    """Why the test applies ``Metadata.guard`` itself: the rules report a suppressed resource all the same."""
    bucket = {
        "Type": "AWS::S3::Bucket",
        "Properties": {},
        "Metadata": {"guard": {"SuppressedRules": ["s3_lifecycle_policy_check"]}},
    }
    template = tmp_path / "bucket.template.json"
    template.write_text(json.dumps({"Resources": {"Bucket": bucket}}))
    findings = run_guard([template])
    assert findings[(template.resolve(), "Bucket", "s3_lifecycle_policy_check")].startswith("CT.S3.PR.6 ")
