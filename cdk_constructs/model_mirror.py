"""The stack's S3 mirror of model weights, and who may touch it.

Encrypted (S3-managed keys), private (all public access blocked, TLS only). The GPU workers may read
it through their Pod Identity role (granted on the model's prefix by the serving construct); the
``model-mirror`` service account that ``make mirror-model``
runs its Job with may write it (and read a gated model's token, when there is one). Kept when the
stack is destroyed in production (weights take an hour to copy again); emptied and deleted with
it elsewhere.
"""

from __future__ import annotations

from aws_cdk import Duration, RemovalPolicy
from aws_cdk import aws_eks_v2 as eks
from aws_cdk import aws_s3 as s3
from constructs import Construct

from cdk_constructs.hf_token import grant_token_key, imported_secret
from cdk_constructs.policy import (
    acknowledge,
    acknowledge_checkov,
    acknowledge_cloudformation_only_functions,
    acknowledge_guard,
    cdk_provider,
)
from manifests.contract import MIRROR_SERVICE_ACCOUNT


class ModelMirror(Construct):
    """Args:
    cluster: the EKS cluster (the mirror Job's service account is created in it).
    bucket_name: the bucket's name (the config's, so that ``serving.model.source`` can name it).
    namespace: where the mirror Job runs (the RayService's namespace, beside the token's provider class).
    keep_on_destroy: keep the bucket and its weights when the stack is destroyed.
    namespace_manifest: the namespace, which must exist before the service account.
    token_secret: a gated model's token secret, which the Job mounts with its own role.
    token_key_arn: the customer-managed KMS key that secret is encrypted with (resolved by `make deploy`'s guard).
    """

    def __init__(
        self,
        scope: Construct,
        id_: str,
        *,
        cluster: eks.Cluster,
        bucket_name: str,
        namespace: str,
        keep_on_destroy: bool,
        namespace_manifest: Construct,
        token_secret: str | None = None,
        token_key_arn: str | None = None,
    ) -> None:
        super().__init__(scope, id_)
        self.bucket = s3.Bucket(
            self,
            "Bucket",
            bucket_name=bucket_name,
            encryption=s3.BucketEncryption.S3_MANAGED,
            block_public_access=s3.BlockPublicAccess.BLOCK_ALL,
            enforce_ssl=True,
            removal_policy=RemovalPolicy.RETAIN if keep_on_destroy else RemovalPolicy.DESTROY,
            auto_delete_objects=not keep_on_destroy,
            # A Job that dies mid-copy leaves the parts of its multi-GB uploads behind, billed and invisible.
            lifecycle_rules=[s3.LifecycleRule(abort_incomplete_multipart_upload_after=Duration.days(7))],
        )
        no_access_logs = (
            "The mirror holds public model weights written by one Job and read by the Ray pods; S3 server access "
            "logs would add a second bucket to keep or delete. CloudTrail data events audit it where needed."
        )
        acknowledge(self.bucket, "AwsSolutions-S1", no_access_logs)
        self._acknowledge_bucket_findings(no_access_logs)
        if not keep_on_destroy:
            acknowledge_cloudformation_only_functions(
                cdk_provider(self, "Custom::S3AutoDeleteObjectsCustomResourceProvider"),
                outside_vpc="It calls only the S3 API, to empty the bucket when the stack is destroyed, when the "
                "VPC's NAT may already be gone; aws-cdk-lib runs it outside any VPC.",
            )
        self.writer = cluster.add_service_account(
            "ModelMirrorServiceAccount",
            name=MIRROR_SERVICE_ACCOUNT,
            namespace=namespace,
            identity_type=eks.IdentityType.POD_IDENTITY,
        )
        self.writer.node.add_dependency(namespace_manifest)
        self.bucket.grant_read_write(self.writer)
        if token_secret:
            imported_secret(self, "TokenSecret", token_secret).grant_read(self.writer)
            if token_key_arn:
                grant_token_key(self, self.writer, token_key_arn)
        acknowledge(
            self.writer,
            "AwsSolutions-IAM5[Action::s3:Abort*]",
            "CDK's grant for writing a bucket; the mirror Job writes this one bucket only.",
        )
        for finding in (
            "Action::s3:DeleteObject*",
            "Action::s3:GetBucket*",
            "Action::s3:GetObject*",
            "Action::s3:List*",
        ):
            acknowledge(
                self.writer, f"AwsSolutions-IAM5[{finding}]", "CDK's read/write grant on the mirror bucket alone."
            )
        acknowledge(
            self.writer,
            f"AwsSolutions-IAM5[Resource::<{self._logical_id()}.Arn>/*]",
            "Every object of the mirror bucket: the Job writes a model's files under a prefix chosen per model.",
        )

    def _acknowledge_bucket_findings(self, no_access_logs: str) -> None:
        bucket = "AWS::S3::Bucket"
        acknowledge_checkov(self.bucket, "CKV_AWS_18", no_access_logs, resource_type=bucket)
        acknowledge_guard(self.bucket, "s3_bucket_logging_enabled_check", no_access_logs, resource_type=bucket)
        no_versions = (
            "A cache of weights that make mirror-model copies again from their source; versioning would keep "
            "every overwritten multi-GB file, and destroy (outside production) would have to delete each version."
        )
        acknowledge_checkov(self.bucket, "CKV_AWS_21", no_versions, resource_type=bucket)
        acknowledge_guard(self.bucket, "s3_bucket_versioning_enabled_check", no_versions, resource_type=bucket)
        acknowledge_guard(
            self.bucket,
            "s3_bucket_object_lock_enabled_check",
            "Object Lock would keep weights that a re-mirror overwrites and stop destroy (outside production) "
            "from emptying the bucket; nothing here is a record to preserve.",
            resource_type=bucket,
        )
        acknowledge_guard(
            self.bucket,
            "s3_event_notifications_enabled_check",
            "Nothing reacts to new weights: the mirror Job writes them and the pods read them at their next start.",
            resource_type=bucket,
        )
        acknowledge_guard(
            self.bucket,
            "s3_bucket_default_encryption_kms_check",
            "Encrypted at rest with S3-managed keys: the weights are published models (a gated one is licence-gated, "
            "not secret), and IAM already limits the bucket to the mirror Job and the Ray pods; a KMS key would add "
            "key permissions for each reader and a KMS call per object read.",
            resource_type=bucket,
        )

    def _logical_id(self) -> str:
        from aws_cdk import Stack

        return Stack.of(self).get_logical_id(self.bucket.node.default_child)
