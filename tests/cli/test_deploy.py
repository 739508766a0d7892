"""`make preview` / `make deploy` as one sequence: the stack synthesized by the CDK CLI with the
facts the deployed template gives, previewed, and synthesized again when a node group is replaced.

Offline (a saved template): the CDK CLI runs for real (`cdk synth`, `cdk diff`); nothing reaches AWS.
"""

from __future__ import annotations

import json

import pytest
import yaml

from cli import deploy as cli_deploy
from manifests.contract import PHASE_LABEL
from tests.conftest import ROOT
from tests.preview.catalog import ADMIN_A, ADMIN_B
from tests.preview.conftest import dev
from tests.preview.test_upgrade import DEPLOYED
from verify.kube import RecordedKube

# Seconds per test (make deploy's flow: the CDK CLI synthesizes and diffs):
# make test-unit leaves this file to make test-consumers and make test.
pytestmark = pytest.mark.consumer


def write_config(tmp_path, **decode_changes) -> str:
    data = dev()
    data["cluster"]["admin_principals"] = [ADMIN_A, ADMIN_B]
    data["cluster"]["gpu_node_groups"]["decode"].update(decode_changes)
    path = tmp_path / "dev.yaml"
    path.write_text(yaml.safe_dump(data))
    return str(path)


def node_group_sizes(outdir) -> dict:
    template = json.loads((outdir / "pd-dev-pd-serving.template.json").read_text())
    return {
        resource["Properties"]["Labels"].get(PHASE_LABEL, "system"): resource["Properties"]["ScalingConfig"].get(
            "DesiredSize"
        )
        for resource in template["Resources"].values()
        if resource["Type"] == "AWS::EKS::Nodegroup"
    }


def test_a_redeploy_over_a_saved_template_leaves_every_size_to_the_autoscaler(tmp_path, capsys):
    outdir = tmp_path / "cdk.out"
    args = [write_config(tmp_path), "--preview-only", "--template", str(DEPLOYED), "--outdir", str(outdir)]
    assert cli_deploy.main([*args, "--summary-only"]) == 0
    out = capsys.readouterr().out
    assert out.count("the template stops setting DesiredSize") == 3
    assert "REPLACED" not in out and "moves from" not in out
    assert node_group_sizes(outdir) == {"system": None, "prefill": None, "decode": None}


def test_a_replaced_node_group_is_synthesized_again_at_its_size_and_needs_the_flag(tmp_path, capsys):
    outdir = tmp_path / "cdk.out"
    config = write_config(tmp_path, instance_type="g6.12xlarge")
    args = [config, "--preview-only", "--template", str(DEPLOYED), "--outdir", str(outdir), "--summary-only"]
    assert cli_deploy.main(args) == 3
    captured = capsys.readouterr()
    assert "replaced node group(s) decode start at their current size: synthesizing again" in captured.out
    assert "REPLACED: AWS::EKS::Nodegroup" in captured.out and "ALLOW_REPLACEMENT=1" in captured.err
    # The saved template's decode group had DesiredSize 1: the new group starts there.
    assert node_group_sizes(outdir) == {"system": None, "prefill": None, "decode": 1}


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["config/dev.yaml", "--template", "x.json"], "--template previews only: add --preview-only"),
        (["config/dev.yaml", "--no-such-flag"], "unrecognized arguments: --no-such-flag"),
    ],
)
def test_bad_flags_are_refused_in_one_line(argv, message, capsys):
    with pytest.raises(SystemExit) as exit_:
        cli_deploy.main(argv)
    err = capsys.readouterr().err.strip()
    assert exit_.value.code == 2 and "\n" not in err and message in err


def test_the_deploy_imports_what_a_destroy_kept_only_when_the_guard_found_it(tmp_path):
    plain = cli_deploy.deploy_command(tmp_path, cdk=tmp_path / "cdk")
    importing = cli_deploy.deploy_command(tmp_path, cdk=tmp_path / "cdk", import_existing=True)
    assert "--import-existing-resources" not in plain
    assert importing[: len(plain) - 2] == plain[:-2] and "--import-existing-resources" in importing
    assert plain[:4] == [str(tmp_path / "cdk"), "deploy", "--app", str(tmp_path)]


def test_make_preview_with_credentials_reads_the_sizes_and_the_deployed_template(tmp_path, capsys):
    """The guard's recorded answers for a deployed dev stack (decode grown to 2 nodes by the
    autoscaler), then CloudFormation's GetTemplate answering the template 2b5a230 deployed."""
    from tests.cli.test_deploy_guard import ACCOUNT, checkip_server, config_data, recorded_aws

    data = config_data()  # no admin principals but you: the two admins of the deployed stack lose it
    config = tmp_path / "dev.yaml"
    config.write_text(yaml.safe_dump(data))
    deployed = DEPLOYED.read_text().replace("000000000000", ACCOUNT)
    get_template = {
        "service": "cloudformation",
        "operation": "get_template",
        "expected": {"StackName": "pd-dev-pd-serving", "TemplateStage": "Original"},
        "response": {"TemplateBody": deployed},
    }
    outdir = tmp_path / "cdk.out"
    # What kubectl printed: Ray's autoscaler has grown decode to 3 workers.
    kube = RecordedKube(ROOT / "tests" / "fixtures" / "verify" / "serving-grown")
    with checkip_server("93.184.216.34\n") as url, recorded_aws("stack-deployed", then=[get_template]) as clients:
        argv = [str(config), "--preview-only", "--outdir", str(outdir), "--summary-only", "--checkip-url", url]
        code = cli_deploy.main(argv, clients=clients, kube=kube)
    out = capsys.readouterr().out
    assert code == 0, out
    assert "node group sizes now: system 1, prefill 1, decode 2" in out
    assert "serving replicas now: decode 3, prefill 1" in out
    assert out.count("the template stops setting DesiredSize") == 3
    assert "moves from" not in out and "REPLACED" not in out
    for admin in (ADMIN_A, ADMIN_B):
        assert f"loses cluster admin: {admin.replace('000000000000', ACCOUNT)}" in out
    assert "gains cluster admin: arn:aws:iam::111122223333:role/aws-reserved/sso.amazonaws.com/" in out
    assert node_group_sizes(outdir) == {"system": None, "prefill": None, "decode": None}
