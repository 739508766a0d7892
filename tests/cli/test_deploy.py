"""`make preview` / `make deploy` as one sequence: the stack synthesized by the CDK CLI with the
facts the deployed template gives, previewed, and synthesized again when a node group is replaced.

Offline (a saved template): the CDK CLI runs for real (`cdk synth`, `cdk diff`); nothing reaches AWS.
"""

from __future__ import annotations

import json

import pytest
import yaml

from cli import deploy as cli_deploy
from consumers.template import HELM_CHART_TYPE as HELM_CHART
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


def test_a_pipeline_deploys_unattended_only_what_make_preview_showed(tmp_path, capsys, monkeypatch):
    """make preview, then make deploy REQUIRE_APPROVAL=never, with the guard's and CloudFormation's recorded
    answers. The CDK CLI synthesizes for real; its `deploy` (which would reach AWS) writes its arguments down
    instead. An edit between the two is refused before any deploy."""
    from tests.cli.test_deploy_guard import ACCOUNT, checkip_server, config_data, recorded_aws

    config = tmp_path / "dev.yaml"
    config.write_text(yaml.safe_dump(config_data()))
    deployed_args = tmp_path / "deploy-args"
    cdk = tmp_path / "cdk"
    cdk.write_text(
        f'#!/bin/sh\nif [ "$1" = deploy ]; then printf "%s\\n" "$@" > {deployed_args}; exit 0; fi\n'
        f'exec {cli_deploy.DEFAULT_CDK} "$@"\n'
    )
    cdk.chmod(0o755)
    outdir = tmp_path / "cdk.out"
    kube = RecordedKube(ROOT / "tests" / "fixtures" / "verify" / "serving-grown")

    def make(*flags: str) -> int:
        # A fresh answer each time: botocore decodes the template body into the answer it is given.
        get_template = {
            "service": "cloudformation",
            "operation": "get_template",
            "expected": {"StackName": "pd-dev-pd-serving", "TemplateStage": "Original"},
            "response": {"TemplateBody": DEPLOYED.read_text().replace("000000000000", ACCOUNT)},
        }
        with checkip_server("93.184.216.34\n") as url, recorded_aws("stack-deployed", then=[get_template]) as clients:
            argv = [str(config), "--outdir", str(outdir), "--cdk", str(cdk), "--summary-only", "--checkip-url", url]
            return cli_deploy.main([*argv, *flags], clients=clients, kube=kube)

    assert make("--preview-only") == 0
    assert "previewed template recorded in .preview-pd-dev-pd-serving.json" in capsys.readouterr().out
    assert make("--require-approval", "never") == 0
    assert deployed_args.read_text().split("\n")[:2] == ["deploy", "--app"]
    assert "--require-approval\nnever\n" in deployed_args.read_text()

    deployed_args.unlink()
    data = config_data()
    data["serving"]["max_model_len"] = 4096  # edited after the preview
    config.write_text(yaml.safe_dump(data))
    assert make("--require-approval", "never") == 2
    assert "is not the one `make preview` showed" in capsys.readouterr().err
    assert not deployed_args.exists()


# --- what needs two deploys, offline: the template of the first as the deployed one of the second --------


def with_gcs_store(**store) -> dict:
    from tests.cdk_constructs.test_gcs_store import dev_ft_data

    data = dev_ft_data()
    if store:
        data["ray_service"]["gcs_fault_tolerance"]["store"] = store
    return data


def deployed_template(variant, name: str, data: dict, facts=None):
    """The template of a stack deployed from ``data`` (the session's synth of that variant)."""
    _, _, outdir = variant(name, data, facts)
    return outdir / "pd-dev-pd-serving.template.json"


def deploy_preview(tmp_path, name: str, data: dict, deployed) -> tuple[int, dict]:
    """make preview CONFIG=<data> TEMPLATE=<deployed>: the exit status and the template it synthesized."""
    config = tmp_path / f"{name}.yaml"
    config.write_text(yaml.safe_dump(data))
    outdir = tmp_path / f"{name}.out"
    args = [str(config), "--preview-only", "--template", str(deployed), "--outdir", str(outdir), "--summary-only"]
    code = cli_deploy.main(args)
    return code, json.loads((outdir / "pd-dev-pd-serving.template.json").read_text())


def store_shape(template: dict) -> tuple[int, bool] | None:
    for resource in template["Resources"].values():
        if resource["Type"] == "AWS::ElastiCache::ReplicationGroup":
            props = resource["Properties"]
            assert props["MultiAZEnabled"] is props["AutomaticFailoverEnabled"]
            return props["NumCacheClusters"], props["AutomaticFailoverEnabled"]
    return None


def csi_charts(template: dict) -> set[str]:
    charts = {r["Properties"]["Chart"] for r in template["Resources"].values() if r["Type"] == HELM_CHART}
    return charts & {"secrets-store-csi-driver", "secrets-store-csi-driver-provider-aws"}


def test_the_stores_second_zone_is_added_in_two_deploys(tmp_path, variant, capsys):
    """ElastiCache turns failover on only once the replica exists: the first deploy adds the replica, the
    second (over the first's template) turns failover on; neither is an update CloudFormation refuses."""
    deployed = deployed_template(variant, "gcs-ft-dev", with_gcs_store())
    code, first = deploy_preview(tmp_path, "multi-az", with_gcs_store(multi_az=True), deployed)
    out = capsys.readouterr().out
    assert code == 0, out
    assert store_shape(first) == (2, False)
    assert "NumCacheClusters 1 -> 2, automatic failover off -> off: updated in place" in out
    assert "the next `make deploy` goes on to NumCacheClusters 2, automatic failover on" in out
    deployed_first = tmp_path / "first.template.json"
    deployed_first.write_text(json.dumps(first))
    code, second = deploy_preview(tmp_path, "multi-az-again", with_gcs_store(multi_az=True), deployed_first)
    out = capsys.readouterr().out
    assert code == 0, out
    assert store_shape(second) == (2, True)
    assert "NumCacheClusters 2 -> 2, automatic failover off -> on: updated in place" in out
    assert "the next `make deploy`" not in out


def test_turning_fault_tolerance_off_keeps_the_store_for_the_cluster_that_serves(tmp_path, variant, capsys):
    """The new RayService no longer names the store, while the RayCluster serving now keeps its GCS there
    until KubeRay deletes it: the store, its token and the CSI driver stay for this deploy, and the
    template it leaves tells the next deploy that nothing serving uses the store any more."""
    from preview.serving import ray_service_of

    deployed = deployed_template(variant, "gcs-ft-dev", with_gcs_store())
    code, first = deploy_preview(tmp_path, "ft-off", dev(), deployed)
    out = capsys.readouterr().out
    assert code == 0, out
    assert store_shape(first) == (1, False)
    ray_service = ray_service_of(first)
    assert ray_service and "gcsFaultToleranceOptions" not in ray_service["spec"]["rayClusterConfig"]
    assert len(csi_charts(first)) == 2
    assert "kept for this deploy: the RayCluster serving now keeps its GCS there" in out
    assert "REMOVED" not in out and "uninstalled" not in out
    from preview.serving import deployed_gcs_store

    kept = deployed_gcs_store(first)
    assert (
        kept is not None and not kept.in_use
    )  # so the next deploy removes it (loudly: tests/preview/test_stateful.py)


def test_removing_every_api_key_keeps_the_csi_driver_the_workers_mount_through(tmp_path, variant, capsys):
    """With no other secret to mount, removing the API keys would uninstall the CSI driver while the
    serving workers' key volumes are mounted through it: the deploy keeps its charts."""
    from config.schema import DeployFacts
    from tests.cdk_constructs.test_api_keys import CUSTOMER_KEY, keyed_data

    deployed = deployed_template(variant, "api-keys", keyed_data(), DeployFacts(api_key_kms_key_arns=[CUSTOMER_KEY]))
    code, after = deploy_preview(tmp_path, "unkeyed", dev(), deployed)
    out = capsys.readouterr().out
    assert code == 0, out
    assert len(csi_charts(after)) == 2
    assert "uninstalled" not in out
