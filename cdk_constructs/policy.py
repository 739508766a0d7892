"""Policy checks (cdk-nag 3 AwsSolutions) and the findings this project acknowledges, with reasons.

Every acknowledgement names one finding, uses the ``AwsSolutions::`` prefix so that it lands in the
validation report's ``suppressedViolations`` with its reason (an audit trail), and sits next to the
construct that causes it.
"""

from __future__ import annotations

import aws_cdk as cdk
from constructs import IConstruct

PACK = "AwsSolutions"


def attach_policy_checks(app: cdk.App) -> None:
    from cdk_nag import AwsSolutionsChecks

    cdk.Validations.of(app).add_plugins(AwsSolutionsChecks(app))


def acknowledge(scope: IConstruct, finding: str, reason: str) -> None:
    """Acknowledge one finding (e.g. ``AwsSolutions-L1``) on ``scope`` and below it."""
    if len(reason.strip()) < 20:
        raise ValueError(f"acknowledging {finding} needs a real reason, got {reason!r}")
    cdk.Validations.of(scope).acknowledge(cdk.Acknowledgment(id=f"{PACK}::{finding}", reason=reason))


def managed_policy_finding(name: str) -> str:
    return f"AwsSolutions-IAM4[Policy::arn:<AWS::Partition>:iam::aws:policy/{name}]"
