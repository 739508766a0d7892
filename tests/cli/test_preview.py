"""`make preview` as a user meets it: the template CloudFormation holds (recorded answers replayed
with botocore's Stubber), a saved template, and the inputs it refuses in one line."""

from __future__ import annotations

import json

import boto3
import pytest
from botocore.stub import Stubber

from cli import preview as cli_preview
from tests.conftest import CONFIG_DIR, ROOT

DEV = str(CONFIG_DIR / "dev.yaml")
RECORDINGS = ROOT / "tests" / "fixtures" / "aws"


def cloudformation(answer: dict):
    client = boto3.client(
        "cloudformation", region_name="us-east-2", aws_access_key_id="recorded", aws_secret_access_key="recorded"
    )
    stubber = Stubber(client)
    expected = {"StackName": "pd-dev-pd-serving", "TemplateStage": "Original"}
    if "error" in answer:
        stubber.add_client_error(
            "get_template",
            service_error_code=answer["error"]["code"],
            service_message=answer["error"]["message"],
            expected_params=expected,
        )
    else:
        stubber.add_response("get_template", answer, expected)
    stubber.activate()
    return client, stubber


def recorded(name: str) -> dict:
    (call,) = json.loads((RECORDINGS / f"{name}.json").read_text())["calls"]
    return call


@pytest.fixture(scope="module")
def dev_assembly(synthesized):
    _, _, _, _, outdir = synthesized("dev")
    return outdir


@pytest.mark.consumer  # the CDK CLI's diff
def test_a_deployed_stack_with_no_edit_previews_no_change(dev_assembly, capsys):
    template = (dev_assembly / "pd-dev-pd-serving.template.json").read_text()
    client, stubber = cloudformation({"TemplateBody": template})
    code = cli_preview.main([DEV, "--assembly", str(dev_assembly)], cloudformation=client)
    stubber.assert_no_pending_responses()
    out = capsys.readouterr().out
    assert code == 0
    assert "There were no differences" in out and "No change." in out


def test_no_deploy_yet_is_one_line(dev_assembly, capsys):
    client, _ = cloudformation(recorded("preview-no-stack"))
    assert cli_preview.main([DEV, "--assembly", str(dev_assembly)], cloudformation=client) == 2
    err = capsys.readouterr().err.strip()
    assert err == (
        "preview: no deploy of pd-dev-pd-serving yet in us-east-2: there is nothing to compare with; "
        "`make deploy` creates it"
    )


def test_a_template_of_another_environment_is_refused_in_one_line(dev_assembly, synthesized, capsys):
    _, _, _, _, prod = synthesized("prod")
    code = cli_preview.main(
        [DEV, "--assembly", str(dev_assembly), "--template", str(prod / "pd-prod-pd-serving.template.json")]
    )
    err = capsys.readouterr().err.strip()
    assert code == 2 and "\n" not in err
    assert "is the template of cluster pd-prod, not pd-dev" in err


@pytest.mark.parametrize(
    ("content", "why"),
    [
        (None, "no such file"),
        ("not json", "is not a JSON template"),
        ('{"Resources": {"Bucket": {"Type": "AWS::S3::Bucket"}}}', "is not a template of this project's stack"),
    ],
)
def test_a_template_that_is_not_this_stacks_is_refused_in_one_line(dev_assembly, tmp_path, capsys, content, why):
    path = tmp_path / "deployed.json"
    if content is not None:
        path.write_text(content)
    assert cli_preview.main([DEV, "--assembly", str(dev_assembly), "--template", str(path)]) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and why in err


@pytest.mark.consumer  # the CDK CLI's diff
def test_a_stateful_replacement_needs_the_confirmation_flag(dev_assembly, variant, tmp_path, capsys):
    from tests.preview.catalog import CATALOG

    (edit,) = [e for e in CATALOG if e.name == "gpu-instance-type"]
    stack, _, outdir = variant(*edit.after_data())
    config_file = tmp_path / "after.yaml"
    import yaml

    config_file.write_text(yaml.safe_dump(edit.after_data()[1]))
    deployed = str(dev_assembly / "pd-dev-pd-serving.template.json")
    args = [str(config_file), "--assembly", str(outdir), "--template", deployed, "--summary-only"]
    assert cli_preview.main(args) == cli_preview.NEEDS_CONFIRMATION
    captured = capsys.readouterr()
    assert "REPLACED: AWS::EKS::Nodegroup" in captured.out and "ALLOW_REPLACEMENT=1" in captured.err
    assert cli_preview.main([*args, "--allow-replacement"]) == 0


@pytest.mark.parametrize("allow", [False, True])
def test_an_update_cloudformation_would_roll_back_is_refused_even_when_replacement_is_allowed(capsys, allow):
    from preview.serving import Preview

    config = type("Config", (), {"stack_name": "pd-dev-pd-serving"})
    summary = Preview(refused=["REPLACED: AWS::EKS::Cluster Cluster: its Name is custom"])
    assert cli_preview.print_summary(config, "", summary, summary_only=True, allow=allow) == cli_preview.REFUSED
    captured = capsys.readouterr()
    assert "Class of change: refused" in captured.out
    assert captured.err.strip() == (
        "pd-dev-pd-serving: not deployed, CloudFormation would roll this update back (above): no deploy can make "
        "this change."
    )
