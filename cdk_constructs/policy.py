"""Policy checks and the findings this project acknowledges, with reasons.

Three checkers read the synthesized templates: cdk-nag 3 AwsSolutions at synth, and checkov and
cfn-guard with AWS Control Tower's proactive rules in the tests (tests/stacks/test_template_policies.py).
Every acknowledgement names one finding, carries its reason, and sits next to the construct that
causes it. cdk-nag's go through the Validations API with the ``AwsSolutions::`` prefix, so that they
land in the validation report's ``suppressedViolations``; checkov's and cfn-guard's are metadata on
the CloudFormation resources, so that they travel with the template.
"""

from __future__ import annotations

from typing import Any

import aws_cdk as cdk
from aws_cdk import aws_iam as iam
from aws_cdk import aws_kms as kms
from constructs import IConstruct

PACK = "AwsSolutions"


def attach_policy_checks(app: cdk.App) -> None:
    from cdk_nag import AwsSolutionsChecks

    cdk.Validations.of(app).add_plugins(AwsSolutionsChecks(app))


def _require_reason(finding: str, reason: str) -> None:
    if len(reason.strip()) < 20:
        raise ValueError(f"acknowledging {finding} needs a real reason, got {reason!r}")


def acknowledge(scope: IConstruct, finding: str, reason: str) -> None:
    """Acknowledge one finding (e.g. ``AwsSolutions-L1``) on ``scope`` and below it."""
    _require_reason(finding, reason)
    cdk.Validations.of(scope).acknowledge(cdk.Acknowledgment(id=f"{PACK}::{finding}", reason=reason))


def _resources(scope: IConstruct, resource_type: str, finding: str, reason: str) -> list[cdk.CfnResource]:
    """The CloudFormation resources of one type at or under ``scope``; none is an error, since an
    acknowledgement that lands nowhere hides nothing and only misleads."""
    _require_reason(finding, reason)
    found = [
        c for c in scope.node.find_all() if isinstance(c, cdk.CfnResource) and c.cfn_resource_type == resource_type
    ]
    if not found:
        raise ValueError(f"acknowledging {finding}: no {resource_type} at or under {scope.node.path}")
    return found


def acknowledge_checkov(scope: IConstruct, check_id: str, reason: str, *, resource_type: str) -> None:
    """Skip one checkov check (e.g. ``CKV_AWS_116``) on the ``resource_type`` resources at or under
    ``scope``, as ``Metadata.checkov.skip``: checkov itself reads it, wherever the template is scanned."""
    for resource in _resources(scope, resource_type, check_id, reason):
        metadata: dict[str, Any] = resource.get_metadata("checkov") or {}
        skips = [s for s in metadata.get("skip", []) if s.get("id") != check_id]
        resource.add_metadata("checkov", {**metadata, "skip": [*skips, {"id": check_id, "comment": reason}]})


def acknowledge_guard(scope: IConstruct, rule: str, reason: str, *, resource_type: str) -> None:
    """Suppress one cfn-guard rule, by its rule name (e.g. ``lambda_inside_vpc_check`` for CT.LAMBDA.PR.3),
    on the ``resource_type`` resources at or under ``scope``, as ``Metadata.guard.SuppressedRules``
    (with the reason in ``Metadata.guard.Reasons``).

    Control Tower's proactive rules (cdklabs.cdk-validator-cfnguard 0.0.62) do not read this metadata:
    the tests apply it. A Control Tower environment that enables one of these controls still refuses
    the resource; the reason here is what to tell its owner."""
    for resource in _resources(scope, resource_type, rule, reason):
        metadata: dict[str, Any] = resource.get_metadata("guard") or {}
        rules = [r for r in metadata.get("SuppressedRules", []) if r != rule]
        reasons = {**metadata.get("Reasons", {}), rule: reason}
        resource.add_metadata("guard", {**metadata, "SuppressedRules": [*rules, rule], "Reasons": reasons})


def cdk_provider(scope: IConstruct, provider_id: str) -> IConstruct:
    """A singleton custom-resource provider that aws-cdk-lib creates at the stack's root on behalf
    of a construct (e.g. ``Custom::VpcRestrictDefaultSGCustomResourceProvider`` for a VPC that
    restricts its default security group). Fails when it is not there: aws-cdk-lib renamed it."""
    return cdk.Stack.of(scope).node.find_child(provider_id)


def acknowledge_cloudformation_only_functions(scope: IConstruct, *, outside_vpc: str | None = None) -> None:
    """The findings that do not apply to a Lambda function that only CloudFormation's custom-resource
    calls invoke (an aws-cdk-lib provider): no dead-letter queue, no reserved concurrency, and, given
    ``outside_vpc`` (why it may run outside the VPC), no VPC."""
    function = "AWS::Lambda::Function"
    acknowledge_checkov(
        scope,
        "CKV_AWS_116",
        "Only CloudFormation's custom-resource calls invoke it: a failure reaches the stack operation as a "
        "FAILED response or a timeout, and a dead-letter queue would keep an event whose response URL has expired.",
        resource_type=function,
    )
    acknowledge_checkov(
        scope,
        "CKV_AWS_115",
        "It runs only during stack operations, a few invocations at a time; reserved concurrency would be "
        "taken from the account's pool and sit idle between deploys.",
        resource_type=function,
    )
    if outside_vpc:
        acknowledge_checkov(scope, "CKV_AWS_117", outside_vpc, resource_type=function)
        acknowledge_guard(scope, "lambda_inside_vpc_check", outside_vpc, resource_type=function)


def limit_grants_to_aws_services(key: kms.Key) -> None:
    """Only AWS services, on behalf of a principal, may create grants on ``key`` (Control Tower's
    CT.KMS.PR.3): a grant is a lasting delegation that a key policy review does not show. EKS's grant
    for secrets encryption comes through the EKS service; CloudWatch Logs uses the key without one."""
    key.add_to_resource_policy(
        iam.PolicyStatement(
            effect=iam.Effect.DENY,
            principals=[iam.AnyPrincipal()],
            actions=["kms:CreateGrant"],
            resources=["*"],
            conditions={"BoolIfExists": {"kms:GrantIsForAWSResource": "false", "aws:PrincipalIsAWSService": "false"}},
        )
    )


def managed_policy_finding(name: str) -> str:
    return f"AwsSolutions-IAM4[Policy::arn:<AWS::Partition>:iam::aws:policy/{name}]"
