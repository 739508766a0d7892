"""`make deploy`'s guard: offline refusals first, then recorded AWS answers, then what the stack makes of them.

The AWS answers are replayed with botocore's Stubber (requests and responses checked against
botocore's model of each API); the deployer's public address comes from a loopback HTTP server
standing in for checkip.amazonaws.com. Nothing here reaches AWS or the internet.
"""

from __future__ import annotations

import json
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler

import boto3
import pytest
import yaml
from botocore.stub import Stubber

from cli import deploy_guard
from config.loader import parse_config
from config.schema import DeployFacts
from tests.conftest import CONFIG_DIR, ROOT, loopback_http_server

RECORDINGS = ROOT / "tests" / "fixtures" / "aws"
ACCOUNT = "111122223333"
SSO_ROLE = (
    f"arn:aws:iam::{ACCOUNT}:role/aws-reserved/sso.amazonaws.com/us-east-2/"
    "AWSReservedSSO_AdministratorAccess_0a1b2c3d4e5f6789"
)


def config_data(env: str = "dev", **cluster_changes) -> dict:
    data = yaml.safe_load((CONFIG_DIR / f"{env}.yaml").read_text())
    data["aws"]["account"] = ACCOUNT
    data["cluster"]["admin_principals"] = [
        p.replace("000000000000", ACCOUNT) for p in data["cluster"]["admin_principals"]
    ]
    data["cluster"].update(cluster_changes)
    return data


@contextmanager
def checkip_server(answer: str):
    """A loopback stand-in for https://checkip.amazonaws.com that answers ``answer``."""

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self):  # noqa: N802 - http.server's name
            body = answer.encode()
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args):
            pass

    with loopback_http_server(Handler) as url:
        yield f"{url}/"


# Each service's client, by the keyword deploy_guard.check takes it with (boto3's service names:
# test_aws_clients_are_every_client_check_takes checks them against botocore's models).
CLIENTS = deploy_guard.SERVICES


@contextmanager
def recorded_aws(name: str | None, region: str = "us-east-2", then: list[dict] | None = None):
    """Real boto3 clients whose calls are answered by a recording (None: no call may be made), and
    then by the calls in ``then`` (the same shape), made after the guard's."""
    calls = json.loads((RECORDINGS / f"{name}.json").read_text())["calls"] if name else []
    calls = [*calls, *(then or [])]
    clients = {
        key: boto3.client(service, region_name=region, aws_access_key_id="recorded", aws_secret_access_key="recorded")
        for key, service in CLIENTS.items()
    }
    stubbers = {key: Stubber(client) for key, client in clients.items()}
    by_service = {service: key for key, service in CLIENTS.items()}
    for call in calls:
        key = by_service[call["service"]]
        if "error" in call:
            stubbers[key].add_client_error(
                call["operation"],
                service_error_code=call["error"]["code"],
                service_message=call["error"]["message"],
                http_status_code=call["error"].get("status", 400),
                expected_params=call.get("expected"),
            )
        else:
            stubbers[key].add_response(call["operation"], call["response"], call.get("expected"))
    for stubber in stubbers.values():
        stubber.activate()
    try:
        yield clients
    finally:
        for stubber in stubbers.values():
            stubber.assert_no_pending_responses()
            stubber.deactivate()


def guard(name: str | None, data: dict) -> deploy_guard.Verdict:
    config = parse_config(data, source="dev.yaml")
    recording = json.loads((RECORDINGS / f"{name}.json").read_text()) if name else {}
    checkip = recording.get("checkip", "198.51.100.7\n")
    with checkip_server(checkip) as url, recorded_aws(name) as clients:
        return deploy_guard.check(config, "dev.yaml", checkip_url=url, **clients)


# --- offline: refused before any AWS call (no recording: a call would fail the Stubber) ---------


def test_placeholder_account_is_refused_before_any_aws_call():
    data = config_data()
    data["aws"]["account"] = "000000000000"
    (line,) = guard(None, data).errors
    assert line.startswith("dev.yaml: aws.account is the placeholder 000000000000; set your 12-digit account id")


@pytest.mark.parametrize("cidr", ["203.0.113.0/24", "198.51.100.20/32", "192.0.2.0/24"])
def test_documentation_range_for_the_public_endpoint_is_refused(cidr):
    data = config_data(endpoint={"public": True, "private": True, "public_cidrs": [cidr]})
    (line,) = guard(None, data).errors
    assert f"cluster.endpoint.public_cidrs has {cidr}, a documentation range (RFC 5737)" in line
    assert "curl -s https://checkip.amazonaws.com" in line


def test_nobody_who_could_use_kubectl_is_refused():
    data = config_data(admin_principals=[], grant_deployer_admin=False)
    (line,) = guard(None, data).errors
    assert "cluster.admin_principals is empty and cluster.grant_deployer_admin is false" in line


def test_placeholder_admin_principal_is_refused():
    data = config_data("prod")
    data["cluster"]["admin_principals"] = ["arn:aws:iam::000000000000:role/PlatformAdmin"]
    (line,) = guard(None, data).errors
    assert "cluster.admin_principals has the placeholder arn:aws:iam::000000000000:role/PlatformAdmin" in line


# --- with recorded answers ------------------------------------------------------------------------


def test_sso_role_resolves_to_its_iam_role_with_path():
    verdict = guard("sso-admin", config_data())
    assert verdict.errors == [] and verdict.warnings == []
    assert verdict.facts.deployer_principal == SSO_ROLE
    assert verdict.facts.deployer_cidr == "93.184.216.34/32"


def test_iam_user_is_used_as_it_is():
    verdict = guard("iam-user", config_data())
    assert verdict.facts.deployer_principal == f"arn:aws:iam::{ACCOUNT}:user/ci/deployer"


def test_role_whose_path_cannot_be_read_is_refused_with_what_to_do():
    (line,) = guard("role-without-getrole", config_data()).errors
    assert "cannot read the path of your role Deployer (iam:GetRole: AccessDenied)" in line
    assert "add its ARN to cluster.admin_principals" in line


def test_root_user_is_refused():
    (line,) = guard("root", config_data()).errors
    assert "root user" in line


def test_credentials_for_another_account_are_refused():
    (line,) = guard("other-account", config_data()).errors
    assert f"aws.account is {ACCOUNT} but your credentials are for account 444455556666" in line


def test_no_gpu_quota_stops_the_deploy_with_the_quota_named():
    (line,) = guard("new-account-no-gpu-quota", config_data()).errors
    assert "Running On-Demand G and VT instances (L-DB2E81BA) allows 0 vCPUs in us-east-2" in line
    assert "start with 64 (desired_size)" in line
    assert "request-service-quota-increase --service-code ec2 --quota-code L-DB2E81BA --desired-value 128" in line


def test_quota_below_max_warns_in_dev_and_refuses_in_production():
    dev = guard("gpu-quota-below-max", config_data())
    assert dev.errors == []
    (warning,) = dev.warnings
    assert "allows 96 vCPUs in us-east-2; the GPU node groups at max_size need 128" in warning
    prod_data = config_data()
    prod_data["production"] = True
    prod = guard("gpu-quota-below-max", prod_data)
    assert any("at max_size need 128" in e for e in prod.errors)


def test_unreadable_quota_is_a_warning_that_says_how_to_check():
    verdict = guard("gpu-quota-unreadable", config_data())
    assert verdict.errors == []
    (warning,) = verdict.warnings
    assert "could not read the quota L-DB2E81BA" in warning and "AccessDeniedException" in warning


# --- capacity that exists: the GPU instance type in the GPU zone ----------------------------------


def test_gpu_type_offered_in_the_gpu_zone_passes():
    # sso-admin's recording answers DescribeInstanceTypeOfferings with us-east-2a among the zones.
    verdict = guard("sso-admin", config_data())
    assert not any("gpu_availability_zone" in line for line in verdict.errors + verdict.warnings)


def test_gpu_type_not_offered_in_the_gpu_zone_names_the_zones_that_offer_it():
    (line,) = guard("gpu-type-not-offered", config_data()).errors
    assert "cluster.gpu_node_groups.prefill and decode use g6.8xlarge" in line
    assert "network.gpu_availability_zone us-east-2a does not offer" in line
    assert "set network.gpu_availability_zone to one that does: us-east-2b, us-east-2c" in line


# --- admin principals exist -----------------------------------------------------------------------

PLATFORM_ADMIN = f"arn:aws:iam::{ACCOUNT}:role/PlatformAdmin"
ALICE = f"arn:aws:iam::{ACCOUNT}:user/ops/alice"


def prod_with_admins(*arns: str) -> dict:
    data = config_data("prod")
    data["cluster"]["admin_principals"] = list(arns)
    return data


def test_admin_principals_that_exist_pass():
    verdict = guard("admin-principals-exist", prod_with_admins(PLATFORM_ADMIN, ALICE))
    assert verdict.errors == [] and verdict.warnings == []


def test_admin_principals_that_do_not_exist_are_refused_one_line_each():
    role_line, user_line = guard("admin-principal-missing", prod_with_admins(PLATFORM_ADMIN, ALICE)).errors
    assert (
        f"cluster.admin_principals has {PLATFORM_ADMIN}, which does not exist (iam:GetRole: NoSuchEntity)" in role_line
    )
    assert "aws iam get-role --role-name PlatformAdmin --query Role.Arn" in role_line
    assert f"cluster.admin_principals has {ALICE}, which does not exist (iam:GetUser: NoSuchEntity)" in user_line
    assert "aws iam get-user --user-name alice --query User.Arn" in user_line


def test_admin_role_under_another_path_is_refused_with_its_arn():
    (line,) = guard("admin-principal-other-path", prod_with_admins(PLATFORM_ADMIN)).errors
    assert f"cluster.admin_principals has {PLATFORM_ADMIN}, but the role PlatformAdmin is " in line
    assert f"arn:aws:iam::{ACCOUNT}:role/platform/PlatformAdmin; use that ARN" in line


def test_admin_principal_that_cannot_be_looked_up_is_a_warning():
    verdict = guard("admin-principal-unreadable", prod_with_admins(PLATFORM_ADMIN))
    assert verdict.errors == []
    (warning,) = verdict.warnings
    assert (
        f"could not check that {PLATFORM_ADMIN} in cluster.admin_principals exists (iam:GetRole: AccessDenied)"
        in warning
    )


# --- the gated model's token secret ---------------------------------------------------------------

TOKEN_SECRET = "pd-serving/hf-token"
TOKEN_KEY = f"arn:aws:kms:us-east-2:{ACCOUNT}:key/1234abcd-12ab-34cd-56ef-1234567890ab"


def gated(data: dict) -> dict:
    data["serving"]["model"] = {
        "model_id": "llama-3.1-8b",
        "source": "meta-llama/Llama-3.1-8B-Instruct",
        "gated": True,
        "hf_token_secret": TOKEN_SECRET,
    }
    return data


def test_token_secret_that_does_not_exist_is_refused():
    (line,) = guard("token-secret-missing", gated(config_data())).errors
    assert f"serving.model.hf_token_secret {TOKEN_SECRET} does not exist in us-east-2" in line
    assert "ResourceNotFoundException" in line


def test_token_secret_scheduled_for_deletion_is_refused():
    (line,) = guard("token-secret-deleted", gated(config_data())).errors
    assert f"serving.model.hf_token_secret {TOKEN_SECRET} is scheduled for deletion (2026-11-28)" in line
    assert f"aws secretsmanager restore-secret --secret-id {TOKEN_SECRET} --region us-east-2" in line


def test_token_secret_with_the_aws_managed_key_needs_no_key_grant():
    verdict = guard("token-secret-aws-managed-key", gated(config_data()))
    assert verdict.errors == [] and verdict.warnings == []
    assert verdict.facts.hf_token_kms_key_arn is None


def test_token_secret_with_a_customer_managed_key_resolves_the_key_arn():
    verdict = guard("token-secret-customer-key", gated(config_data()))
    assert verdict.errors == [] and verdict.warnings == []
    assert verdict.facts.hf_token_kms_key_arn == TOKEN_KEY


def test_token_secret_whose_key_is_pending_deletion_is_refused():
    (line,) = guard("token-secret-disabled-key", gated(config_data())).errors
    assert f"serving.model.hf_token_secret {TOKEN_SECRET} is encrypted with the KMS key {TOKEN_KEY}" in line
    assert "PendingDeletion" in line and "aws kms cancel-key-deletion --key-id" in line


def with_api_keys(data: dict) -> dict:
    data["ray_service"].setdefault("endpoint", {})["api_key_secrets"] = ["pd-serving/api-key-1", "pd-serving/api-key-2"]
    return data


def test_api_key_secrets_are_checked_and_a_customer_key_is_resolved():
    verdict = guard("api-key-secrets", with_api_keys(config_data()))
    assert verdict.errors == [] and verdict.warnings == []
    # The first uses Secrets Manager's own key (nothing to grant), the second the platform team's.
    assert verdict.facts.api_key_kms_key_arns == [TOKEN_KEY]


def test_an_api_key_secret_that_does_not_exist_is_refused():
    (line,) = guard("api-key-secret-missing", with_api_keys(config_data())).errors
    assert "ray_service.endpoint.api_key_secrets[1] pd-serving/api-key-2 does not exist in us-east-2" in line
    assert "could not mount the API key; create it with the API key as its value" in line


def test_a_multi_region_key_is_a_fact_the_stack_accepts():
    # A multi-Region key's id starts with mrk-.
    arn = f"arn:aws:kms:us-east-2:{ACCOUNT}:key/mrk-1234abcd12ab34cd56ef1234567890ab"
    assert DeployFacts(hf_token_kms_key_arn=arn).hf_token_kms_key_arn == arn


# --- destroy, then deploy again -------------------------------------------------------------------

MIRROR = f"pd-dev-models-{ACCOUNT}-us-east-2"


def kept_mirror(data: dict) -> dict:
    data["model_mirror"] = {"enabled": True, "keep_on_destroy": True}
    return data


@pytest.mark.parametrize("recording", ["mirror-left-behind", "mirror-left-behind-after-rollback"])
def test_mirror_bucket_a_destroy_kept_is_imported(recording):
    verdict = guard(recording, kept_mirror(config_data()))
    assert verdict.errors == []
    assert verdict.to_import == [
        f"the model mirror bucket {MIRROR} (kept by the last destroy): imported with its objects"
    ]


def test_mirror_bucket_name_owned_by_another_account_is_refused():
    verdict = guard("mirror-owned-elsewhere", kept_mirror(config_data()))
    (line,) = verdict.errors
    assert f"model_mirror.bucket_name: the bucket {MIRROR} exists but is not this account's" in line
    assert "set model_mirror.bucket_name to a name of your own" in line
    assert verdict.to_import == []


def test_mirror_bucket_left_behind_that_this_config_would_create_anew_is_refused():
    data = config_data()
    data["model_mirror"] = {"enabled": True, "keep_on_destroy": False}
    verdict = guard("mirror-left-behind", data)
    (line,) = verdict.errors
    assert f"model_mirror.keep_on_destroy: the bucket {MIRROR} exists (an earlier destroy kept it)" in line
    assert "set model_mirror.keep_on_destroy: true" in line and f"aws s3 rb s3://{MIRROR} --force" in line
    assert verdict.to_import == []


def test_no_mirror_bucket_yet_is_a_plain_first_deploy():
    verdict = guard("mirror-not-there", kept_mirror(config_data()))
    assert verdict.errors == [] and verdict.to_import == []


def test_control_plane_log_group_left_behind_is_refused_with_the_command():
    (line,) = guard("control-plane-log-group-left-behind", config_data()).errors
    assert "the control-plane log group /aws/eks/pd-dev/cluster exists but the stack pd-dev-pd-serving does not" in line
    assert "`aws logs delete-log-group --log-group-name /aws/eks/pd-dev/cluster --region us-east-2`" in line
    assert "its events are lost" in line


def test_deployed_stack_reads_each_node_group_size():
    verdict = guard("stack-deployed", config_data())
    assert verdict.errors == [] and verdict.warnings == []
    assert verdict.facts.node_group_sizes == {"system": 1, "prefill": 1, "decode": 2}
    # What runs, from EKS: the upgrade's next step follows it (config/upgrade.py).
    assert verdict.facts.kubernetes_version == "1.36"
    assert verdict.facts.node_group_versions == {"system": "1.36", "prefill": "1.36", "decode": "1.36"}


def test_the_quota_counts_the_nodes_eks_adds_while_an_upgrade_rolls_a_gpu_group():
    """Half an upgrade done: this deploy rolls prefill to 1.36, and EKS first adds two g6.8xlarge
    (64 vCPUs) beyond max_size. 160 vCPUs hold both groups at max_size (128), not the surge too."""
    verdict = guard("upgrade-rolls-prefill", config_data())
    assert verdict.errors == []
    (warning,) = verdict.warnings
    assert warning.startswith(
        "Running On-Demand G and VT instances (L-DB2E81BA) allows 160 vCPUs in us-east-2; the GPU node groups at "
        "max_size need 192 (with the 64 vCPUs of the 2 nodes EKS adds while it rolls prefill to Kubernetes 1.36)"
    ), warning
    assert verdict.facts.node_group_versions == {"system": "1.36", "prefill": "1.35", "decode": "1.35"}


def test_node_group_that_cannot_be_described_is_a_warning():
    verdict = guard("stack-deployed-group-unreadable", config_data())
    assert verdict.errors == []
    (warning,) = verdict.warnings
    assert "could not read the size of the decode node group DecodeNodes6526137E-Zf5gK8pJtA6u" in warning
    assert verdict.facts.node_group_sizes == {"system": 1, "prefill": 1}


# --- what the stack does with the resolved facts --------------------------------------------------


def test_resolved_deployer_gets_an_access_entry_and_the_endpoint(tmp_path):
    from aws_cdk.assertions import Template

    from app import build_app

    data = config_data()
    config_path = tmp_path / "dev.yaml"
    config_path.write_text(yaml.safe_dump(data))
    verdict = guard("sso-admin", data)
    facts = tmp_path / "facts.json"
    facts.write_text(json.dumps(verdict.facts.model_dump(exclude_none=True)))
    stack = build_app(str(config_path), outdir=str(tmp_path / "out"), deploy_facts=str(facts)).node.children[0]
    template = Template.from_stack(stack)
    entries = [r["Properties"] for r in template.find_resources("AWS::EKS::AccessEntry").values()]
    (mine,) = [e for e in entries if e["PrincipalArn"] == SSO_ROLE]
    assert "cluster-access-policy/AmazonEKSClusterAdminPolicy" in json.dumps(mine["AccessPolicies"])
    (cluster,) = template.find_resources("AWS::EKS::Cluster").values()
    assert cluster["Properties"]["ResourcesVpcConfig"]["PublicAccessCidrs"] == ["93.184.216.34/32"]


def test_offline_synth_keeps_the_endpoint_closed_and_grants_nobody(synthesized):
    _, _, template, _, _ = synthesized("dev")
    (cluster,) = template.find_resources("AWS::EKS::Cluster").values()
    assert cluster["Properties"]["ResourcesVpcConfig"]["PublicAccessCidrs"] == ["192.0.2.1/32"]
    principals = [r["Properties"]["PrincipalArn"] for r in template.find_resources("AWS::EKS::AccessEntry").values()]
    # Only roles the stack itself creates (references, not literal ARNs): no person is granted.
    assert principals and all(isinstance(p, dict) for p in principals), principals


def test_guard_cli_writes_the_facts_for_app(tmp_path, monkeypatch):
    data = config_data()
    config_path = tmp_path / "dev.yaml"
    config_path.write_text(yaml.safe_dump(data))
    facts = tmp_path / "facts.json"
    with checkip_server("93.184.216.34\n") as url, recorded_aws("sso-admin") as clients:
        monkeypatch.setattr(deploy_guard, "aws_clients", lambda region: clients)
        code = deploy_guard.main([str(config_path), "--facts-out", str(facts), "--checkip-url", url])
    assert code == 0
    assert json.loads(facts.read_text()) == {"deployer_principal": SSO_ROLE, "deployer_cidr": "93.184.216.34/32"}


def test_aws_clients_are_every_client_check_takes():
    import inspect

    takes = {
        name
        for name, parameter in inspect.signature(deploy_guard.check).parameters.items()
        if parameter.kind is inspect.Parameter.KEYWORD_ONLY and name != "checkip_url"
    }
    clients = deploy_guard.aws_clients("us-east-2")  # no call is made to create a client
    assert set(clients) == takes == set(CLIENTS)
    assert {key: client.meta.service_model.service_name for key, client in clients.items()} == CLIENTS


def test_guard_cli_prints_what_it_imports_and_the_live_sizes(tmp_path, monkeypatch, capsys):
    config_path = tmp_path / "dev.yaml"
    config_path.write_text(yaml.safe_dump(kept_mirror(config_data())))
    with checkip_server("93.184.216.34\n") as url, recorded_aws("mirror-left-behind") as clients:
        monkeypatch.setattr(deploy_guard, "aws_clients", lambda region: clients)
        assert deploy_guard.main([str(config_path), "--checkip-url", url]) == 0
    assert f"import: the model mirror bucket {MIRROR} (kept by the last destroy)" in capsys.readouterr().out
    config_path.write_text(yaml.safe_dump(config_data()))
    facts = tmp_path / "facts.json"
    with checkip_server("93.184.216.34\n") as url, recorded_aws("stack-deployed") as clients:
        monkeypatch.setattr(deploy_guard, "aws_clients", lambda region: clients)
        assert deploy_guard.main([str(config_path), "--facts-out", str(facts), "--checkip-url", url]) == 0
    assert "node group sizes now: system 1, prefill 1, decode 2" in capsys.readouterr().out
    assert json.loads(facts.read_text())["node_group_sizes"] == {"system": 1, "prefill": 1, "decode": 2}


def cloudwatch_config() -> dict:
    data = config_data()
    data["observability"] = {"backend": "cloudwatch"}
    return data


def test_container_insights_groups_the_running_add_on_made_are_imported_not_deleted():
    """A deployed stack that ran the cloudwatch backend before it owned these groups: the add-on's
    agents made them, and recreate one within seconds of its deletion, so asking for a deletion would
    loop. The deploy imports them as they are; the next one makes them the stack's."""
    verdict = guard("cloudwatch-groups-made-by-the-agent", cloudwatch_config())
    assert verdict.errors == [] and verdict.warnings == []
    made = ["/aws/containerinsights/pd-dev/performance", "/aws/containerinsights/pd-dev/application"]
    assert verdict.facts.adopted_log_groups == made
    (line,) = verdict.to_import
    assert f"the Container Insights log group(s) {', '.join(made)} (the running add-on's agents made them" in line
    assert "imported as they are" in line and "the next `make deploy` encrypts them" in line
    assert "delete-log-group" not in line


def test_the_stack_imports_the_groups_the_guard_found(tmp_path, monkeypatch, capsys):
    """From the guard's facts file to the template `make deploy` deploys with
    --import-existing-resources: the two groups the agents made, under their names, kept (Retain)."""
    from aws_cdk.assertions import Template

    from app import build_app

    config_path = tmp_path / "dev.yaml"
    config_path.write_text(yaml.safe_dump(cloudwatch_config()))
    facts = tmp_path / "facts.json"
    with checkip_server("93.184.216.34\n") as url, recorded_aws("cloudwatch-groups-made-by-the-agent") as clients:
        monkeypatch.setattr(deploy_guard, "aws_clients", lambda region: clients)
        assert deploy_guard.main([str(config_path), "--facts-out", str(facts), "--checkip-url", url]) == 0
    assert "import: the Container Insights log group(s)" in capsys.readouterr().out
    stack = build_app(str(config_path), outdir=str(tmp_path / "out"), deploy_facts=str(facts)).node.children[0]
    groups = Template.from_stack(stack).find_resources("AWS::Logs::LogGroup")
    kept = {r["Properties"]["LogGroupName"] for r in groups.values() if r["DeletionPolicy"] == "Retain"}
    assert kept == {"/aws/containerinsights/pd-dev/performance", "/aws/containerinsights/pd-dev/application"}


def test_container_insights_groups_the_stack_owns_pass():
    verdict = guard("cloudwatch-groups-owned", cloudwatch_config())
    assert verdict.errors == [] and verdict.warnings == []


def test_a_container_insights_group_left_after_a_destroy_is_refused():
    (line,) = guard("cloudwatch-group-left-behind", cloudwatch_config()).errors
    assert "the log group /aws/containerinsights/pd-dev/host exists but the stack pd-dev-pd-serving does not" in line
    assert "`aws logs delete-log-group --log-group-name /aws/containerinsights/pd-dev/host --region us-east-2`" in line


def test_the_guard_reads_the_add_ons_and_ami_releases_that_run():
    """The pins are floors: what runs is read, and a release roll counts its surge like an upgrade step."""
    verdict = guard("releases-behind", config_data())
    assert verdict.errors == []
    unreadable, quota = verdict.warnings
    assert unreadable == (
        "could not read the version of the eks-pod-identity-agent add-on (eks:DescribeAddon: AccessDeniedException); "
        "the deployed template's stands in for it, and a pin older than what runs would take the add-on back"
    )
    assert quota.startswith(
        "Running On-Demand G and VT instances (L-DB2E81BA) allows 160 vCPUs in us-east-2; the GPU node groups at "
        "max_size need 192 (with the 64 vCPUs of the 2 nodes EKS adds while it rolls prefill to AMI release "
        "1.36.3-20260903)"
    ), quota
    assert verdict.facts.addon_versions == {
        "vpc-cni": "v1.21.1-eksbuild.7",
        "kube-proxy": "v1.36.0-eksbuild.21",
        "coredns": "v1.14.3-eksbuild.3",
    }
    assert verdict.facts.node_ami_releases == {
        "system": "1.36.3-20260903",
        "prefill": "1.36.2-20260714",
        "decode": "1.36.2-20260714",
    }
