"""What `make deploy` checks before CloudFormation starts, and what it resolves for the stack.

    python -m cli.deploy_guard CONFIG --facts-out FILE

First the config alone (no AWS call): a placeholder account or principal, a documentation range
as the API endpoint's only door, nobody who could use kubectl. Then, with your credentials: the
account you are signed in to, your IAM role ARN with its path (an access entry needs the role, not
STS's assumed-role ARN), your public address if the config lets the deployer in, the EC2
on-demand vCPU quota of the GPU instance family against the GPU node groups at their maximum,
whether the GPU zone offers the GPU instance types at all, that each admin principal exists, and
that a gated model's token secret exists, is not being deleted, and which KMS key it needs. Last,
the stack as it is: not deployed, whether a destroy left the model mirror bucket behind (imported
with its objects) or a log group under a fixed name (a stop); deployed, each node group's size now
and Container Insights log groups the running add-on made outside the stack (imported).
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

from botocore.exceptions import ClientError

from cmdline import ArgumentParser
from config import catalog
from config.loader import load_config_or_exit
from config.releases import node_releases
from config.schema import PLACEHOLDER_ACCOUNT, AppConfig, DeployedStoreToken, DeployFacts
from config.token_rotation import ROTATED_STAGE
from config.upgrade import VersionStepRefused, step_of
from config.versions import EKS_ADDONS
from manifests.observability import (
    CONTAINER_INSIGHTS_LOG_GROUPS,
    container_insights_log_group,
    control_plane_log_group,
    fixed_log_groups,
)

CHECKIP_URL = "https://checkip.amazonaws.com"
# RFC 5737: addresses for documentation; no real client comes from them.
DOCUMENTATION_RANGES = tuple(ipaddress.ip_network(c) for c in ("192.0.2.0/24", "198.51.100.0/24", "203.0.113.0/24"))
FIND_YOUR_ADDRESS = "`curl -s https://checkip.amazonaws.com` prints your public address; add /32"
# Nodes EKS adds to a one-zone managed node group while it rolls it (upgrade_surge).
ROLLING_SURGE_NODES = 2
# The stack's outputs that name its node groups (stacks/pd_serving_stack.py), by deploy-facts name.
NODE_GROUP_OUTPUTS = {"system": "SystemNodeGroup", "prefill": "PrefillNodeGroup", "decode": "DecodeNodeGroup"}
# Secrets Manager's own key: DescribeSecret leaves KmsKeyId out for it, or names this alias.
AWS_MANAGED_SECRETS_KEY = "alias/aws/secretsmanager"
# A stack in these states holds no resources, and the CDK CLI creates it anew: it deletes one whose
# creation rolled back first, and takes one with only a change set in review as not deployed.
NOT_DEPLOYED_STATES = {"ROLLBACK_COMPLETE", "REVIEW_IN_PROGRESS"}
# KMS key states in which Secrets Manager cannot decrypt the secret, and how to get out of each.
UNUSABLE_KEY_STATES = {
    "Disabled": "enable it with `aws kms enable-key --key-id {key} --region {region}`",
    "PendingDeletion": "cancel the deletion with `aws kms cancel-key-deletion --key-id {key} --region {region}`, "
    "then `aws kms enable-key`",
    "PendingReplicaDeletion": "cancel the deletion with `aws kms cancel-key-deletion --key-id {key} --region {region}`",
    "PendingImport": "import its key material, or store the token under another key",
    "Unavailable": "reconnect its custom key store, or store the token under another key",
}


class Refusal(Exception):
    """A reason not to deploy: one line naming the field or the credential and what to do."""


@dataclass
class Verdict:
    facts: DeployFacts = field(default_factory=DeployFacts)
    errors: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    # What a destroy kept that this deploy takes back into the stack (cdk deploy --import-existing-resources).
    to_import: list[str] = field(default_factory=list)


def error_code(exc: Exception) -> str:
    """The AWS error code of a failed call (its exception's name when AWS gave none)."""
    return getattr(exc, "response", {}).get("Error", {}).get("Code", type(exc).__name__)


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
            code = error_code(exc)
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


def upgrade_surge(config: AppConfig, live: LiveNodeGroups) -> tuple[str, int, str] | None:
    """(GPU group, vCPUs, to what it rolls) of the surge this deploy's Kubernetes upgrade step or AMI release adds: EKS rolls a
    managed node group by first adding nodes, "up to twice the number of Availability Zones" or one more
    than the maximum unavailable (https://docs.aws.amazon.com/eks/latest/userguide/managed-node-update-behavior.html):
    two, in the GPU groups' one zone."""
    if live.cluster_version is None:
        return None
    facts = DeployFacts(
        kubernetes_version=live.cluster_version, node_group_versions=live.versions, node_ami_releases=live.releases
    )
    try:
        step = step_of(config.cluster, facts)
        releases = node_releases(config.cluster, step, facts)
    except VersionStepRefused:
        return None  # refused with its own line (the synth's)
    rolls = step.rolls or releases.rolls
    if rolls not in ("prefill", "decode"):
        return None
    target = f"Kubernetes {step.node_groups[rolls]}" if step.rolls else f"AMI release {releases.releases[rolls]}"
    group = getattr(config.cluster.gpu_node_groups, rolls)
    return rolls, ROLLING_SURGE_NODES * catalog.INSTANCES[group.instance_type].vcpus, target


def quota_findings(
    config: AppConfig, quotas: Any, surge: tuple[str, int, str] | None = None
) -> tuple[list[str], list[str]]:
    """(errors, warnings) from the account's on-demand vCPU quotas for the GPU families, with the surge of
    a node group this deploy rolls to a new Kubernetes minor or AMI release."""
    errors, warnings = [], []
    names = {q.code: q.name for q in catalog.ON_DEMAND_QUOTAS.values()}
    need = gpu_vcpus(config)
    surging = ""
    if surge is not None:
        group, vcpus, target = surge
        code = catalog.on_demand_quota(getattr(config.cluster.gpu_node_groups, group).instance_type).code
        desired, most = need[code]
        need[code] = (desired, most + vcpus)
        surging = (
            f" (with the {vcpus} vCPUs of the {ROLLING_SURGE_NODES} nodes EKS adds while it rolls {group} to {target})"
        )
    for code, (desired, most) in sorted(need.items()):
        try:
            try:
                value = quotas.get_service_quota(ServiceCode="ec2", QuotaCode=code)["Quota"]["Value"]
            except quotas.exceptions.NoSuchResourceException:
                value = quotas.get_aws_default_service_quota(ServiceCode="ec2", QuotaCode=code)["Quota"]["Value"]
        except Exception as exc:  # noqa: BLE001 - an unreadable quota is a warning, not a stop
            code_text = error_code(exc)
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
                f"max_size need {most}{surging}, so scaling out (and a NewCluster upgrade) would stall; {raise_it}"
            )
            (errors if config.production else warnings).append(line)
    return errors, warnings


def capacity_findings(config: AppConfig, source: str, ec2: Any) -> tuple[list[str], list[str]]:
    """(errors, warnings): is each GPU instance type offered in the GPU zone, and if not, where.

    One call for every zone of the region: AZ names map to different physical zones in each
    account, so only this account's answer says which of its zones has the type.
    """
    groups = config.cluster.gpu_node_groups
    phases: dict[str, list[str]] = {}
    for phase in ("prefill", "decode"):
        phases.setdefault(getattr(groups, phase).instance_type, []).append(phase)
    zone, region = config.network.gpu_availability_zone, config.aws.region
    offered: dict[str, set[str]] = {instance_type: set() for instance_type in phases}
    request: dict[str, Any] = {
        "LocationType": "availability-zone",
        "Filters": [{"Name": "instance-type", "Values": sorted(phases)}],
    }
    try:
        while True:
            page = ec2.describe_instance_type_offerings(**request)
            for offering in page.get("InstanceTypeOfferings", []):
                offered.setdefault(offering["InstanceType"], set()).add(offering["Location"])
            if not page.get("NextToken"):
                break
            request["NextToken"] = page["NextToken"]
    except ClientError as exc:
        types = ",".join(sorted(phases))
        return [], [
            f"could not check that {zone} offers {types} (ec2:DescribeInstanceTypeOfferings: {error_code(exc)}); "
            "check with `aws ec2 describe-instance-type-offerings --location-type availability-zone --filters "
            f"Name=instance-type,Values={types} --region {region}`"
        ]
    errors = []
    for instance_type, users in sorted(phases.items()):
        if zone in offered[instance_type]:
            continue
        uses = f"cluster.gpu_node_groups.{' and '.join(users)} {'use' if len(users) > 1 else 'uses'} {instance_type}"
        others = sorted(offered[instance_type])
        fix = (
            f"set network.gpu_availability_zone to one that does: {', '.join(others)} (and list it in "
            "network.availability_zones)"
            if others
            else f"no zone of {region} offers it to this account: choose another instance_type or aws.region"
        )
        errors.append(
            f"{source}: {uses}, which network.gpu_availability_zone {zone} does not offer "
            f"(ec2:DescribeInstanceTypeOfferings; zone names differ per account), so no GPU node could start; {fix}"
        )
    return errors, []


def admin_findings(config: AppConfig, source: str, iam: Any) -> tuple[list[str], list[str]]:
    """(errors, warnings): does each ARN in cluster.admin_principals name a role or user that exists."""
    errors, warnings = [], []
    for arn in config.cluster.admin_principals:
        account, resource = arn.split(":")[4], arn.split(":", 5)[5]
        kind, _, path_and_name = resource.partition("/")
        name = path_and_name.rsplit("/", 1)[-1]
        operation, lookup = ("GetRole", "get-role") if kind == "role" else ("GetUser", "get-user")
        if account != config.aws.account:
            warnings.append(
                f"{arn} in cluster.admin_principals is in account {account}, not aws.account {config.aws.account}: "
                f"not checked (iam:{operation} sees this account only)"
            )
            continue
        try:
            if kind == "role":
                actual = iam.get_role(RoleName=name)["Role"]["Arn"]
            else:
                actual = iam.get_user(UserName=name)["User"]["Arn"]
        except ClientError as exc:
            code = error_code(exc)
            if code == "NoSuchEntity":
                errors.append(
                    f"{source}: cluster.admin_principals has {arn}, which does not exist (iam:{operation}: {code}); "
                    f"EKS would refuse its access entry and roll the deploy back; correct it (`aws iam {lookup} "
                    f"--{kind}-name {name} --query {kind.title()}.Arn` prints the ARN with its path) or remove it"
                )
            else:
                warnings.append(
                    f"could not check that {arn} in cluster.admin_principals exists (iam:{operation}: {code}); "
                    "if it does not, EKS refuses its access entry and the deploy rolls back"
                )
            continue
        if actual != arn:
            errors.append(
                f"{source}: cluster.admin_principals has {arn}, but the {kind} {name} is {actual}; use that ARN "
                "(an access entry names the principal with its path)"
            )
    return errors, warnings


def secret_key(
    config: AppConfig, source: str, secretsmanager: Any, kms: Any, *, field: str, secret: str, holds: str
) -> tuple[str | None, list[str]]:
    """(the ARN of the customer-managed KMS key the secret named by ``field`` is encrypted with, or None;
    warnings). Raises Refusal when the Ray pods could not mount it. ``holds`` says what it holds.

    An imported secret's ``grant_read`` gives no ``kms:Decrypt``: with a customer-managed key the
    GPU workers' role needs it on that key, or the CSI mount fails.
    """
    region = config.aws.region
    named = f"{source}: {field} {secret}"
    try:
        described = secretsmanager.describe_secret(SecretId=secret)
    except ClientError as exc:
        code = error_code(exc)
        if code != "ResourceNotFoundException":
            return None, [
                f"could not check {field} {secret} (secretsmanager:DescribeSecret: {code}); if it is missing or "
                "encrypted with a customer-managed KMS key, the Ray pods stay in ContainerCreating (FailedMount)"
            ]
        create = (
            "correct the ARN"
            if secret.startswith("arn:")
            else f"create it with the {holds} as its value (`aws secretsmanager create-secret --name {secret} "
            f"--secret-string file://{holds.replace(' ', '-')}.txt --region {region}`) or correct the name"
        )
        raise Refusal(
            f"{named} does not exist in {region} (secretsmanager:DescribeSecret: {code}), so the Ray pods could not "
            f"mount the {holds}; {create}"
        ) from None
    if described.get("DeletedDate"):
        raise Refusal(
            f"{named} is scheduled for deletion ({str(described['DeletedDate'])[:10]}), so the Ray pods could not "
            f"mount the {holds}; restore it with `aws secretsmanager restore-secret --secret-id {secret} "
            f"--region {region}`"
        )
    key_id = described.get("KmsKeyId")
    if not key_id or key_id.split(":")[-1] == AWS_MANAGED_SECRETS_KEY:
        return None, []
    try:
        key = kms.describe_key(KeyId=key_id)["KeyMetadata"]
    except ClientError as exc:
        return None, [
            f"could not read the KMS key {key_id} that {field} {secret} is encrypted with "
            f"(kms:DescribeKey: {error_code(exc)}), so the GPU workers' role gets no kms:Decrypt on it and their "
            f"{holds} mount may fail; allow kms:DescribeKey on the key to whoever deploys"
        ]
    if key.get("KeyManager") == "AWS":
        return None, []
    arn, state = key["Arn"], key.get("KeyState", "Enabled")
    if state in UNUSABLE_KEY_STATES:
        raise Refusal(
            f"{named} is encrypted with the KMS key {arn}, which is {state} (kms:DescribeKey), so Secrets Manager "
            f"could not decrypt the {holds} for the Ray pods; "
            f"{UNUSABLE_KEY_STATES[state].format(key=arn, region=region)}"
        )
    if key.get("AWSAccountId") not in (None, config.aws.account):
        return arn, [
            f"{field} {secret} is encrypted with the KMS key {arn} of account "
            f"{key['AWSAccountId']}: its key policy must also let the GPU workers' role decrypt with it"
        ]
    return arn, []


def token_key(config: AppConfig, source: str, secretsmanager: Any, kms: Any) -> tuple[str | None, list[str]]:
    """The gated model's token secret (``secret_key``); nothing to check without one."""
    secret = config.serving.model.hf_token_secret
    if not secret:
        return None, []
    return secret_key(
        config, source, secretsmanager, kms, field="serving.model.hf_token_secret", secret=secret, holds="token"
    )


def api_key_keys(config: AppConfig, source: str, secretsmanager: Any, kms: Any) -> tuple[list[str], list[str]]:
    """(the customer-managed KMS keys of the endpoint's API key secrets, warnings), each as ``secret_key``."""
    keys: list[str] = []
    warnings: list[str] = []
    for index, secret in enumerate(config.ray_service.endpoint.api_key_secrets):
        arn, found = secret_key(
            config,
            source,
            secretsmanager,
            kms,
            field=f"ray_service.endpoint.api_key_secrets[{index}]",
            secret=secret,
            holds="API key",
        )
        warnings += found
        if arn and arn not in keys:
            keys.append(arn)
    return keys, warnings


def deployed_stack(config: AppConfig, cloudformation: Any) -> tuple[bool | None, dict[str, Any], list[str]]:
    """(deployed, the stack's description, warnings); deployed is None when CloudFormation would not say."""
    try:
        stacks = cloudformation.describe_stacks(StackName=config.stack_name)["Stacks"]
    except ClientError as exc:
        message = getattr(exc, "response", {}).get("Error", {}).get("Message", "")
        if error_code(exc) == "ValidationError" and "does not exist" in message:
            return False, {}, []
        return (
            None,
            {},
            [
                f"could not read the stack {config.stack_name} (cloudformation:DescribeStacks: {error_code(exc)}): "
                "what a destroy left behind and the node groups' sizes are not checked"
            ],
        )
    stack = stacks[0] if stacks else {}
    return bool(stack) and stack.get("StackStatus") not in NOT_DEPLOYED_STATES, stack, []


def left_behind_findings(
    config: AppConfig, source: str, *, s3: Any, logs: Any
) -> tuple[list[str], list[str], list[str]]:
    """(errors, warnings, to import) for a stack not deployed: what a destroy left behind under a fixed name."""
    errors, warnings, to_import = [], [], []
    region = config.aws.region
    if config.model_mirror.enabled:
        bucket = config.mirror_bucket
        try:
            s3.head_bucket(Bucket=bucket, ExpectedBucketOwner=config.aws.account)
        except ClientError as exc:
            status = getattr(exc, "response", {}).get("ResponseMetadata", {}).get("HTTPStatusCode")
            code = error_code(exc)
            if code in ("403", "AccessDenied") or status == 403:
                errors.append(
                    f"{source}: model_mirror.bucket_name: the bucket {bucket} exists but is not this account's "
                    f"(s3:HeadBucket: 403 with ExpectedBucketOwner {config.aws.account}); bucket names are global, so "
                    "set model_mirror.bucket_name to a name of your own"
                )
            elif code not in ("404", "NoSuchBucket", "NotFound") and status != 404:
                warnings.append(
                    f"could not check whether the model mirror bucket {bucket} exists (s3:HeadBucket: {code}); if a "
                    "destroy left it behind, the deploy fails on it"
                )
        else:
            if config.mirror_kept_on_destroy:
                to_import.append(
                    f"the model mirror bucket {bucket} (kept by the last destroy): imported with its objects"
                )
            else:
                errors.append(
                    f"{source}: model_mirror.keep_on_destroy: the bucket {bucket} exists (an earlier destroy kept it) "
                    "and this config would create it anew, which fails; set model_mirror.keep_on_destroy: true to "
                    f"take it back with its objects, or delete it (`aws s3 rb s3://{bucket} --force --region {region}`)"
                )
    for name in fixed_log_groups(config.cluster_name, config.observability.backend):
        try:
            groups = logs.describe_log_groups(logGroupNamePrefix=name).get("logGroups", [])
        except ClientError as exc:
            warnings.append(
                f"could not check whether the log group {name} exists (logs:DescribeLogGroups: {error_code(exc)})"
            )
            continue
        if any(group.get("logGroupName") == name for group in groups):
            what = (
                "the control-plane log group"
                if name == control_plane_log_group(config.cluster_name)
                else "the log group"
            )
            errors.append(
                f"{source}: {what} {name} exists but the stack {config.stack_name} does not, and the stack creates it "
                f"under that name, so the deploy would fail; delete it with `aws logs delete-log-group --log-group-name "
                f"{name} --region {region}` (its events are lost: export them first with `aws logs create-export-task` "
                "to keep them)"
            )
    return errors, warnings, to_import


def container_insights_findings(
    config: AppConfig, *, deployed: bool, logs: Any, cloudformation: Any
) -> tuple[list[str], list[str], list[str]]:
    """(warnings, what to import, the groups to adopt) for a deployed stack with the `cloudwatch`
    backend: the stack creates the log groups the add-on's agents write to, so one the agents made
    before the stack owned it would fail the update with "already exists". It cannot be deleted
    first: the running add-on's agents recreate it within seconds. So this deploy imports it as it is
    (``DeployFacts.adopted_log_groups``, ``cdk deploy --import-existing-resources``) and the next one
    makes it the stack's like the others. A stack not deployed runs no add-on: ``left_behind_findings``
    asks for the deletion there."""
    if config.observability.backend != "cloudwatch" or not deployed:
        return [], [], []
    cluster = config.cluster_name
    names = [container_insights_log_group(cluster, name) for name in CONTAINER_INSIGHTS_LOG_GROUPS]
    try:
        existing = {
            group["logGroupName"]
            for page in logs.get_paginator("describe_log_groups").paginate(
                logGroupNamePrefix=container_insights_log_group(cluster, "")
            )
            for group in page.get("logGroups", [])
        }
        owned: set[str] = set()
        if existing & set(names):
            owned = {
                resource.get("PhysicalResourceId", "")
                for page in cloudformation.get_paginator("list_stack_resources").paginate(StackName=config.stack_name)
                for resource in page.get("StackResourceSummaries", [])
                if resource.get("ResourceType") == "AWS::Logs::LogGroup"
            }
    except ClientError as exc:
        return [f"could not check the Container Insights log groups of {cluster} ({error_code(exc)})"], [], []
    foreign = [name for name in names if name in existing and name not in owned]
    if not foreign:
        return [], [], []
    return (
        [],
        [
            f"the Container Insights log group(s) {', '.join(foreign)} (the running add-on's agents made them "
            f"outside the stack {config.stack_name}): imported as they are, unencrypted and never expiring; the "
            "next `make deploy` encrypts them, sets their retention and lets destroy delete them"
        ],
        foreign,
    )


@dataclass
class LiveNodeGroups:
    """What EKS says the deployed cluster and its node groups run now."""

    sizes: dict[str, int] = field(default_factory=dict)
    versions: dict[str, str] = field(default_factory=dict)
    releases: dict[str, str] = field(default_factory=dict)  # each group's AMI release
    cluster_version: str | None = None
    addon_versions: dict[str, str] = field(default_factory=dict)
    warnings: list[str] = field(default_factory=list)


def cluster_version(config: AppConfig, eks: Any) -> tuple[str | None, list[str]]:
    """(the Kubernetes minor the control plane runs, warnings): EKS may have moved it outside the
    template (it upgrades a cluster whose extended support ends)."""
    try:
        return eks.describe_cluster(name=config.cluster_name)["cluster"]["version"], []
    except (ClientError, KeyError) as exc:
        return None, [
            f"could not read the Kubernetes version of {config.cluster_name} (eks:DescribeCluster: {error_code(exc)}); "
            "the deployed template's stands in for it"
        ]


def addon_versions(config: AppConfig, eks: Any) -> tuple[dict[str, str], list[str]]:
    """({add-on: the version it runs}, warnings): config/versions.py's pins are floors, so a newer version
    that runs is kept, which only a reading can tell."""
    found: dict[str, str] = {}
    warnings = []
    for name in EKS_ADDONS:
        try:
            found[name] = eks.describe_addon(clusterName=config.cluster_name, addonName=name)["addon"]["addonVersion"]
        except (ClientError, KeyError) as exc:
            warnings.append(
                f"could not read the version of the {name} add-on (eks:DescribeAddon: {error_code(exc)}); the deployed "
                "template's stands in for it, and a pin older than what runs would take the add-on back"
            )
    return found, warnings


def store_token(stack: dict[str, Any], secretsmanager: Any) -> tuple[DeployedStoreToken | None, list[str]]:
    """(the GCS store token's secret, replication group and rotated version, warnings), when the deployed
    stack has a store: which rotation step comes next (config/token_rotation.py)."""
    outputs = {o["OutputKey"]: o.get("OutputValue", "") for o in stack.get("Outputs", [])}
    secret, group = outputs.get("GcsStoreAuthTokenSecret"), outputs.get("GcsStoreReplicationGroup")
    if not (secret and group):
        return None, []
    token = DeployedStoreToken(secret_arn=secret, replication_group=group)
    try:
        stages = secretsmanager.describe_secret(SecretId=secret).get("VersionIdsToStages", {})
    except ClientError as exc:
        return token, [
            f"could not read the GCS store token's versions (secretsmanager:DescribeSecret: {error_code(exc)}): a "
            "rotation in progress is not taken further in this deploy"
        ]
    rotated = [version for version, labels in stages.items() if ROTATED_STAGE in labels]
    return token.model_copy(update={"rotated_version": rotated[0] if rotated else None}), []


def live_node_groups(config: AppConfig, stack: dict[str, Any], eks: Any) -> LiveNodeGroups:
    """The control plane's version and add-ons, and each node group's desired size, version and AMI release now."""
    live = LiveNodeGroups()
    live.cluster_version, live.warnings = cluster_version(config, eks)
    live.addon_versions, warnings = addon_versions(config, eks)
    live.warnings += warnings
    live.sizes, live.versions, live.releases, warnings = node_group_sizes(config, stack, eks)
    live.warnings += warnings
    return live


def node_group_sizes(
    config: AppConfig, stack: dict[str, Any], eks: Any
) -> tuple[dict[str, int], dict[str, str], dict[str, str], list[str]]:
    """({group: desired size now}, {group: Kubernetes minor now}, {group: AMI release now}, warnings) of the
    deployed stack's node groups."""
    outputs = {o["OutputKey"]: o.get("OutputValue", "") for o in stack.get("Outputs", [])}
    sizes: dict[str, int] = {}
    versions: dict[str, str] = {}
    releases: dict[str, str] = {}
    warnings = []
    for group, key in NODE_GROUP_OUTPUTS.items():
        unknown = "the template then sets the config's desired_size, and EKS resizes the group to it at once"
        if not outputs.get(key):
            warnings.append(
                f"the stack {config.stack_name} has no output {key}: the {group} node group's size is unknown; {unknown}"
            )
            continue
        # The output holds the node group's Ref, which CloudFormation gives as "<cluster>/<nodegroup>".
        name = outputs[key].rsplit("/", 1)[-1]
        try:
            nodegroup = eks.describe_nodegroup(clusterName=config.cluster_name, nodegroupName=name)["nodegroup"]
            sizes[group] = nodegroup["scalingConfig"]["desiredSize"]
            if "version" in nodegroup:
                versions[group] = nodegroup["version"]
            if "releaseVersion" in nodegroup:
                releases[group] = nodegroup["releaseVersion"]
        except (ClientError, KeyError) as exc:
            warnings.append(
                f"could not read the size of the {group} node group {name} (eks:DescribeNodegroup: {error_code(exc)}); "
                f"{unknown}"
            )
    return sizes, versions, releases, warnings


def check(
    config: AppConfig,
    source: str,
    *,
    sts: Any,
    iam: Any,
    quotas: Any,
    ec2: Any,
    secretsmanager: Any,
    kms: Any,
    cloudformation: Any,
    s3: Any,
    logs: Any,
    eks: Any,
    checkip_url: str = CHECKIP_URL,
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
    for errors, warnings in (
        capacity_findings(config, source, ec2),
        admin_findings(config, source, iam),
    ):
        verdict.errors += errors
        verdict.warnings += warnings
    key_arn: str | None = None
    api_keys: list[str] = []
    try:
        key_arn, warnings = token_key(config, source, secretsmanager, kms)
        verdict.warnings += warnings
    except Refusal as exc:
        verdict.errors.append(str(exc))
    try:
        api_keys, warnings = api_key_keys(config, source, secretsmanager, kms)
        verdict.warnings += warnings
    except Refusal as exc:
        verdict.errors.append(str(exc))
    deployed, stack, warnings = deployed_stack(config, cloudformation)
    verdict.warnings += warnings
    live = LiveNodeGroups()
    if deployed is False:
        errors, warnings, verdict.to_import = left_behind_findings(config, source, s3=s3, logs=logs)
        verdict.errors += errors
        verdict.warnings += warnings
    token: DeployedStoreToken | None = None
    if deployed:
        live = live_node_groups(config, stack, eks)
        verdict.warnings += live.warnings
        token, warnings = store_token(stack, secretsmanager)
        verdict.warnings += warnings
    # After the stack is read: a node group this deploy rolls surges beyond its max_size.
    errors, warnings = quota_findings(config, quotas, upgrade_surge(config, live))
    verdict.errors += errors
    verdict.warnings += warnings
    adopted: list[str] = []
    if deployed:
        warnings, to_import, adopted = container_insights_findings(
            config, deployed=deployed, logs=logs, cloudformation=cloudformation
        )
        verdict.warnings += warnings
        verdict.to_import += to_import
    verdict.facts = DeployFacts.model_validate(
        {
            "deployer_principal": principal,
            "deployer_cidr": cidr,
            "node_group_sizes": live.sizes,
            "kubernetes_version": live.cluster_version,
            "node_group_versions": live.versions,
            "node_ami_releases": live.releases,
            "addon_versions": live.addon_versions,
            "store_token": token,
            "hf_token_kms_key_arn": key_arn,
            "api_key_kms_key_arns": api_keys,
            "adopted_log_groups": adopted,
        }
    )
    return verdict


# check's keyword -> the boto3 service name of its client.
SERVICES = {
    "sts": "sts",
    "iam": "iam",
    "quotas": "service-quotas",
    "ec2": "ec2",
    "secretsmanager": "secretsmanager",
    "kms": "kms",
    "cloudformation": "cloudformation",
    "s3": "s3",
    "logs": "logs",
    "eks": "eks",
}


def aws_clients(region: str) -> dict[str, Any]:
    """Every client check needs, in the config's region."""
    import boto3

    session = boto3.Session(region_name=region)
    return {key: session.client(service) for key, service in SERVICES.items()}


def report(verdict: Verdict) -> int:
    """Prints the warnings, then the refusals (exit 2) or what was resolved (0)."""
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
    if facts.node_group_sizes:
        sizes = ", ".join(f"{group} {size}" for group, size in facts.node_group_sizes.items())
        print(f"node group sizes now: {sizes} (an existing group keeps its size)")
    if facts.hf_token_kms_key_arn:
        print(f"token secret's KMS key: {facts.hf_token_kms_key_arn} (the Ray pods may decrypt with it)")
    for arn in facts.api_key_kms_key_arns:
        print(f"API key secrets' KMS key: {arn} (the Ray pods may decrypt with it)")
    return 0


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
    if report(verdict) != 0:
        return 2
    for line in verdict.to_import:
        print(f"import: {line} (cdk deploy --import-existing-resources)")
    if args.facts_out:
        with open(args.facts_out, "w") as handle:
            json.dump(verdict.facts.model_dump(exclude_defaults=True), handle)
    return 0


if __name__ == "__main__":
    sys.exit(main())
