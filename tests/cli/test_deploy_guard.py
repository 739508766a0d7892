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


@contextmanager
def recorded_aws(name: str | None, region: str = "us-east-2"):
    """Real boto3 clients whose calls are answered by a recording (None: no call may be made)."""
    calls = json.loads((RECORDINGS / f"{name}.json").read_text())["calls"] if name else []
    clients = {
        key: boto3.client(service, region_name=region, aws_access_key_id="recorded", aws_secret_access_key="recorded")
        for key, service in (("sts", "sts"), ("iam", "iam"), ("quotas", "service-quotas"))
    }
    stubbers = {key: Stubber(client) for key, client in clients.items()}
    for call in calls:
        key = {"sts": "sts", "iam": "iam", "service-quotas": "quotas"}[call["service"]]
        if "error" in call:
            stubbers[key].add_client_error(
                call["operation"],
                service_error_code=call["error"]["code"],
                service_message=call["error"]["message"],
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
    checkip = json.loads((RECORDINGS / f"{name}.json").read_text())["checkip"] if name else "198.51.100.7\n"
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
