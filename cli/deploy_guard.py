"""What `make deploy` checks before CloudFormation starts, and what it resolves for the stack.

    python -m cli.deploy_guard CONFIG --facts-out FILE

First the config alone (no AWS call): a placeholder account or principal, a documentation range
as the API endpoint's only door, nobody who could use kubectl. Then, with your credentials: the
account you are signed in to, your IAM role ARN with its path (an access entry needs the role, not
STS's assumed-role ARN), your public address if the config lets the deployer in, and the EC2
on-demand vCPU quota of the GPU instance family against the GPU node groups at their maximum.
FILE then holds what app.py needs (``-c deploy_facts=FILE``). Exit 2 on any refusal, one line each.
"""

from __future__ import annotations

import argparse
import ipaddress
import json
import sys
import urllib.request
from dataclasses import dataclass, field
from typing import Any

from cli.args import ArgumentParser
from config import catalog
from config.loader import load_config_or_exit
from config.schema import PLACEHOLDER_ACCOUNT, AppConfig, DeployFacts

CHECKIP_URL = "https://checkip.amazonaws.com"
# RFC 5737: addresses for documentation; no real client comes from them.
DOCUMENTATION_RANGES = tuple(ipaddress.ip_network(c) for c in ("192.0.2.0/24", "198.51.100.0/24", "203.0.113.0/24"))
FIND_YOUR_ADDRESS = "`curl -s https://checkip.amazonaws.com` prints your public address; add /32"


class Refusal(Exception):
    """A reason not to deploy: one line naming the field or the credential and what to do."""


@dataclass
class Verdict:
    facts: DeployFacts = field(default_factory=DeployFacts)
    errors: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)


def offline_problems(config: AppConfig, source: str) -> list[str]:
    """Everything wrong with the config that needs no AWS call to see."""
    problems = []
    if config.aws.account == PLACEHOLDER_ACCOUNT:
        problems.append(
            f"{source}: aws.account is the placeholder {PLACEHOLDER_ACCOUNT}; set your 12-digit account id "
            "(`aws sts get-caller-identity --query Account`)"
        )
    for arn in config.cluster.admin_principals:
        if f"::{PLACEHOLDER_ACCOUNT}:" in arn:
            problems.append(f"{source}: cluster.admin_principals has the placeholder {arn}; use a real ARN")
    endpoint = config.cluster.endpoint
    if endpoint.public:
        for cidr in endpoint.public_cidrs:
            network = ipaddress.ip_network(cidr, strict=False)
            if any(network.version == r.version and network.subnet_of(r) for r in DOCUMENTATION_RANGES):
                problems.append(
                    f"{source}: cluster.endpoint.public_cidrs has {cidr}, a documentation range (RFC 5737) "
                    f"no real client comes from; put your own address there ({FIND_YOUR_ADDRESS}) or set "
                    "cluster.endpoint.allow_deployer_address: true"
                )
    if not config.cluster.admin_principals and not config.cluster.grant_deployer_admin:
        problems.append(
            f"{source}: cluster.admin_principals is empty and cluster.grant_deployer_admin is false, so nobody "
            "could use kubectl on the new cluster; add your role ARN to cluster.admin_principals "
            "(`aws iam get-role --role-name NAME --query Role.Arn`) or set grant_deployer_admin: true"
        )
    return problems


def principal_arn(caller_arn: str, iam: Any) -> str:
    """The IAM ARN an access entry needs for the caller STS reports.

    An assumed role (``arn:aws:sts::A:assumed-role/NAME/session``) becomes the role's own ARN,
    path included, which only ``iam:GetRole`` knows: SSO roles live under
    ``role/aws-reserved/sso.amazonaws.com/<region>/``.
    """
    partition, service, resource = caller_arn.split(":")[1], caller_arn.split(":")[2], caller_arn.split(":", 5)[5]
    if service == "iam" and resource.startswith("user/"):
        return caller_arn
    if service == "sts" and resource.startswith("assumed-role/"):
        role_name = resource.split("/")[1]
        try:
            return iam.get_role(RoleName=role_name)["Role"]["Arn"]
        except Exception as exc:  # noqa: BLE001 - any failure means the path is unknown
            code = getattr(exc, "response", {}).get("Error", {}).get("Code", type(exc).__name__)
            raise Refusal(
                f"cannot read the path of your role {role_name} (iam:GetRole: {code}); add its ARN to "
                f"cluster.admin_principals (arn:{partition}:iam::<account>:role/<path>/{role_name}; SSO roles "
                "live under role/aws-reserved/sso.amazonaws.com/<region>/)"
            ) from None
    if resource == "root":
        raise Refusal(
            "you are signed in as the account's root user; deploy with an IAM role or user, which can then be "
            "granted access to the cluster"
        )
    raise Refusal(
        f"your credentials are {caller_arn}, which an EKS access entry cannot name; deploy with an IAM role or "
        "user, or set cluster.grant_deployer_admin: false and list admins in cluster.admin_principals"
    )


def public_address(url: str = CHECKIP_URL, timeout: float = 10) -> str:
    """This machine's public IPv4 address as a /32, as AWS's checkip service sees it."""
    try:
        with urllib.request.urlopen(url, timeout=timeout) as response:
            text = response.read().decode().strip()
        address = ipaddress.IPv4Address(text)
    except (OSError, ValueError) as exc:
        raise Refusal(
            f"cannot find your public address at {url} ({exc}); list it in cluster.endpoint.public_cidrs "
            "and set allow_deployer_address: false"
        ) from None
    return f"{address}/32"


def gpu_vcpus(config: AppConfig) -> dict[str, tuple[int, int]]:
    """Quota code -> (vCPUs at desired size, vCPUs at max size) of the GPU node groups."""
    need: dict[str, tuple[int, int]] = {}
    for group in (config.cluster.gpu_node_groups.prefill, config.cluster.gpu_node_groups.decode):
        vcpus = catalog.INSTANCES[group.instance_type].vcpus
        code = catalog.on_demand_quota(group.instance_type).code
        desired, most = need.get(code, (0, 0))
        need[code] = (desired + group.desired_size * vcpus, most + group.max_size * vcpus)
    return need


def quota_findings(config: AppConfig, quotas: Any) -> tuple[list[str], list[str]]:
    """(errors, warnings) from the account's on-demand vCPU quotas for the GPU families."""
    errors, warnings = [], []
    names = {q.code: q.name for q in catalog.ON_DEMAND_QUOTAS.values()}
    for code, (desired, most) in sorted(gpu_vcpus(config).items()):
        try:
            try:
                value = quotas.get_service_quota(ServiceCode="ec2", QuotaCode=code)["Quota"]["Value"]
            except quotas.exceptions.NoSuchResourceException:
                value = quotas.get_aws_default_service_quota(ServiceCode="ec2", QuotaCode=code)["Quota"]["Value"]
        except Exception as exc:  # noqa: BLE001 - an unreadable quota is a warning, not a stop
            code_text = getattr(exc, "response", {}).get("Error", {}).get("Code", type(exc).__name__)
            warnings.append(
                f"could not read the quota {code} ({names[code]}): {code_text}; check it with `aws service-quotas "
                f"get-service-quota --service-code ec2 --quota-code {code} --region {config.aws.region}`"
            )
            continue
        raise_it = (
            f"raise it in the Service Quotas console or with `aws service-quotas request-service-quota-increase "
            f"--service-code ec2 --quota-code {code} --desired-value {most} --region {config.aws.region}`"
        )
        if value < desired:
            errors.append(
                f"{names[code]} ({code}) allows {value:g} vCPUs in {config.aws.region}, but the GPU node groups "
                f"start with {desired} (desired_size); the node groups would fail about 25 minutes in; {raise_it}"
            )
        elif value < most:
            line = (
                f"{names[code]} ({code}) allows {value:g} vCPUs in {config.aws.region}; the GPU node groups at "
                f"max_size need {most}, so scaling out (and a NewCluster upgrade) would stall; {raise_it}"
            )
            (errors if config.production else warnings).append(line)
    return errors, warnings


def check(
    config: AppConfig, source: str, *, sts: Any, iam: Any, quotas: Any, checkip_url: str = CHECKIP_URL
) -> Verdict:
    """Every check, offline ones first; AWS is asked only if the config itself is deployable."""
    verdict = Verdict(errors=offline_problems(config, source))
    if verdict.errors:
        return verdict
    identity = sts.get_caller_identity()
    if identity["Account"] != config.aws.account:
        verdict.errors.append(
            f"{source}: aws.account is {config.aws.account} but your credentials are for account "
            f"{identity['Account']} ({identity['Arn']}); switch AWS_PROFILE or correct aws.account"
        )
        return verdict
    principal = cidr = None
    try:
        if config.cluster.grant_deployer_admin:
            principal = principal_arn(identity["Arn"], iam)
        if config.cluster.endpoint.public and config.cluster.endpoint.allow_deployer_address:
            cidr = public_address(checkip_url)
    except Refusal as exc:
        verdict.errors.append(f"{source}: {exc}")
        return verdict
    verdict.facts = DeployFacts(deployer_principal=principal, deployer_cidr=cidr)
    errors, warnings = quota_findings(config, quotas)
    verdict.errors += errors
    verdict.warnings += warnings
    return verdict


def aws_clients(region: str) -> dict[str, Any]:
    import boto3

    session = boto3.Session(region_name=region)
    return {"sts": session.client("sts"), "iam": session.client("iam"), "quotas": session.client("service-quotas")}


def main(argv: list[str] | None = None) -> int:
    parser = ArgumentParser(prog="python -m cli.deploy_guard", description=__doc__.splitlines()[0])
    parser.add_argument("config", help="the environment's config, e.g. config/dev.yaml")
    parser.add_argument("--facts-out", metavar="FILE", help="where to write what app.py needs (-c deploy_facts=FILE)")
    parser.add_argument("--checkip-url", default=CHECKIP_URL, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    config = load_config_or_exit(args.config)
    try:
        verdict = check(config, args.config, checkip_url=args.checkip_url, **aws_clients(config.aws.region))
    except Exception as exc:  # noqa: BLE001 - no credentials, no network: say so in one line
        print(f"cannot check the deployment with your AWS credentials: {exc}", file=sys.stderr)
        return 2
    for line in verdict.warnings:
        print(f"warning: {line}", file=sys.stderr)
    if verdict.errors:
        print("\n".join(verdict.errors), file=sys.stderr)
        return 2
    facts = verdict.facts
    if facts.deployer_principal:
        print(f"cluster admin (you): {facts.deployer_principal}")
    if facts.deployer_cidr:
        print(f"API endpoint open to your address: {facts.deployer_cidr}")
    if args.facts_out:
        with open(args.facts_out, "w") as handle:
            json.dump(facts.model_dump(exclude_none=True), handle)
    return 0


if __name__ == "__main__":
    sys.exit(main())
