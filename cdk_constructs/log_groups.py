"""Every CloudWatch log group of the stack: created by the stack, KMS-encrypted, expiring, and deleted with it.

Log groups that a service creates on first write (EKS's ``/aws/eks/<cluster>/cluster``, a Lambda
function's ``/aws/lambda/<name>``) have no expiry and survive ``cdk destroy``. Here the stack creates
them first: EKS's under the name EKS writes to, the Lambda functions' through each function's
``LoggingConfig``, so that destroy removes them all.
"""

from __future__ import annotations

from aws_cdk import CfnResource, Duration, RemovalPolicy, Stack
from aws_cdk import aws_iam as iam
from aws_cdk import aws_kms as kms
from aws_cdk import aws_logs as logs
from constructs import Construct, IConstruct

from cdk_constructs.policy import acknowledge_checkov, acknowledge_guard, limit_grants_to_aws_services

# Control Tower's CT.CLOUDWATCH.PR.2 asks for a year or more.
CONTROL_TOWER_MIN_RETENTION_DAYS = 365

RETENTION = {
    1: logs.RetentionDays.ONE_DAY,
    3: logs.RetentionDays.THREE_DAYS,
    5: logs.RetentionDays.FIVE_DAYS,
    7: logs.RetentionDays.ONE_WEEK,
    14: logs.RetentionDays.TWO_WEEKS,
    30: logs.RetentionDays.ONE_MONTH,
    60: logs.RetentionDays.TWO_MONTHS,
    90: logs.RetentionDays.THREE_MONTHS,
    180: logs.RetentionDays.SIX_MONTHS,
    365: logs.RetentionDays.ONE_YEAR,
}


class EncryptedLogs(Construct):
    """One KMS key for the stack's log groups, and the factory that makes each log group with it.

    Args:
        description: what the key encrypts, shown in KMS.
    """

    def __init__(self, scope: Construct, id_: str, *, description: str) -> None:
        super().__init__(scope, id_)
        stack = Stack.of(self)
        self.key = kms.Key(
            self,
            "Key",
            description=description,
            enable_key_rotation=True,
            removal_policy=RemovalPolicy.DESTROY,
            pending_window=Duration.days(7),
        )
        # CloudWatch Logs encrypts with the key itself, only for this account's log groups in this region
        # (CloudWatch Logs user guide, "Encrypt log data in CloudWatch Logs using AWS KMS").
        self.key.add_to_resource_policy(
            iam.PolicyStatement(
                principals=[iam.ServicePrincipal(f"logs.{stack.region}.amazonaws.com")],
                actions=["kms:Encrypt*", "kms:Decrypt*", "kms:ReEncrypt*", "kms:GenerateDataKey*", "kms:Describe*"],
                resources=["*"],
                conditions={
                    "ArnLike": {
                        "kms:EncryptionContext:aws:logs:arn": f"arn:{stack.partition}:logs:{stack.region}:{stack.account}:log-group:*"
                    }
                },
            )
        )
        limit_grants_to_aws_services(self.key)

    def log_group(self, scope: Construct, id_: str, *, retention_days: int, name: str | None = None) -> logs.LogGroup:
        """A log group encrypted with this key, expiring after ``retention_days``, deleted on destroy."""
        group = logs.LogGroup(
            scope,
            id_,
            log_group_name=name,
            retention=RETENTION[retention_days],
            encryption_key=self.key,
            removal_policy=RemovalPolicy.DESTROY,
        )
        if retention_days < CONTROL_TOWER_MIN_RETENTION_DAYS:
            acknowledge_guard(
                group,
                "cloudwatch_log_group_retention_period_check",
                f"Kept {retention_days} days, as the environment's config chooses: these are operational logs "
                "(control plane, flow logs, provider functions, metrics agents) of a stack that destroy removes "
                "whole; set the config's retention to 365 where an audit needs a year.",
                resource_type="AWS::Logs::LogGroup",
            )
        return group

    def adopted_log_group(self, scope: Construct, id_: str, *, name: str) -> logs.LogGroup:
        """A log group a service made outside the stack, taken in as it is by this deploy's import
        (``cdk deploy --import-existing-resources``): CloudFormation imports a resource only under a
        name the template fixes and with DeletionPolicy Retain, and an import applies no property, so
        the template says what the group is (unencrypted, never expiring). The next deploy, the group
        being the stack's by then, gives it this key, a retention and Delete (``log_group``), which
        CloudFormation applies in place."""
        group = logs.LogGroup(
            scope, id_, log_group_name=name, retention=logs.RetentionDays.INFINITE, removal_policy=RemovalPolicy.RETAIN
        )
        reason = (
            "Imported as the service made it, for one deploy: the next deploy encrypts it with the stack's "
            "key, sets its retention and deletes it with the stack."
        )
        for rule in ("cloudwatch_log_group_retention_period_check", "cloudwatch_log_group_encrypted_check"):
            acknowledge_guard(group, rule, reason, resource_type="AWS::Logs::LogGroup")
        for check in ("CKV_AWS_66", "CKV_AWS_158", "CKV_AWS_338"):
            acknowledge_checkov(group, check, reason, resource_type="AWS::Logs::LogGroup")
        return group

    def capture_function_logs(self, scope: IConstruct, *, retention_days: int) -> int:
        """Gives every Lambda function under ``scope`` a log group of this stack (``LoggingConfig``),
        instead of the ``/aws/lambda/<name>`` group Lambda would create and leave behind.
        Returns how many functions it found."""
        found = 0
        for construct in scope.node.find_all():
            # CDK's singleton custom-resource providers are raw CfnResources, not lambda.CfnFunction.
            if not (isinstance(construct, CfnResource) and construct.cfn_resource_type == "AWS::Lambda::Function"):
                continue
            group = self.log_group(construct.node.scope, f"{construct.node.id}Logs", retention_days=retention_days)
            construct.add_property_override("LoggingConfig.LogGroup", group.log_group_name)
            found += 1
        return found
