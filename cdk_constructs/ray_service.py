"""The serving app on the cluster: serve_app as an S3 asset, the head's and the GPU workers' Pod Identity roles,
the RayService."""

from __future__ import annotations

import atexit
import shutil
import tempfile
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import aws_cdk as cdk
from aws_cdk import aws_eks_v2 as eks
from aws_cdk import aws_iam as iam
from aws_cdk import aws_s3 as s3
from aws_cdk import aws_s3_assets as s3_assets
from constructs import Construct

from cdk_constructs.cache_salt import CacheSalt
from cdk_constructs.gcs_store import GcsStore
from cdk_constructs.hf_token import HuggingFaceToken, grant_token_key, imported_secret
from cdk_constructs.policy import acknowledge
from config.schema import ChartVersions, RayServiceConfig
from kuberay import rules_version_note
from kuberay.rules import validate_ray_service
from manifests import api_keys as api_keys_manifests
from manifests import gcs_store as gcs_store_manifests
from manifests.contract import RAY_HEAD_SERVICE_ACCOUNT, RAY_WORKER_SERVICE_ACCOUNT, SERVE_PORT
from manifests.ray_service import namespace as namespace_manifest
from manifests.ray_service import owned_serve_service, serve_service_name
from serve_app.serve_config import serve_config_yaml
from serve_app.spec import ServingSpec

SERVE_APP_DIR = Path(__file__).resolve().parent.parent / "serve_app"


# Ray unzips a remote (s3://) working_dir with remove_top_level_directory=True
# (ray/_private/runtime_env/packaging.py, download_and_unpack_package): when every entry sits
# under one directory, that directory is dropped. So the zip holds one wrapper directory around
# serve_app/, and after Ray's unpack serve_app/ is at the root of the working_dir, importable.
WORKING_DIR_WRAPPER = "working_dir"


def stage_serve_app(source: Path = SERVE_APP_DIR) -> Path:
    """The asset directory: ``working_dir/serve_app/…``, which Ray unpacks to ``serve_app/…``."""
    staging = Path(tempfile.mkdtemp(prefix="serve-app-"))
    # CDK copies the asset into the cloud assembly during synth; the staging copy can go after.
    atexit.register(shutil.rmtree, staging, ignore_errors=True)
    shutil.copytree(
        source,
        staging / WORKING_DIR_WRAPPER / "serve_app",
        ignore=shutil.ignore_patterns("__pycache__", "*.pyc"),
    )
    return staging


class RayServiceApp(Construct):
    """The RayService that serves ``serve_app`` with the environment's serving spec.

    Args:
        cluster: the EKS cluster.
        ray_service: the environment's ray_service section.
        serving: the environment's serving spec.
        charts: the chart versions (the CSI driver and provider for a gated model's token; the
            KubeRay operator whose rules the RayService is checked against).
        render_manifest: the RayService for a Serve config (``manifests.ray_service.ray_service``
            bound to the environment); the Serve config names this construct's code asset.
        operator: the KubeRay operator's chart; its CRDs must exist before the RayService, and it
            outlives the namespace on teardown, since it takes the finalizers off what is in it.
        token_key_arn: the customer-managed KMS key the token secret is encrypted with (resolved by
            `make deploy`'s guard); the GPU workers' role may decrypt with it through Secrets Manager.
        gcs_store: the GCS fault-tolerance store when ``ray_service.gcs_fault_tolerance`` is on (its
            host goes into ``render_manifest``); its AUTH token reaches the head (and KubeRay's Redis
            cleanup Job) through the CSI driver.
        network_policies: the serving namespace's NetworkPolicies (``manifests.network_policies``),
            applied before the RayService, so that its pods start with them in place.
        keep_secrets_store: the deployed RayService's pods mount through the Secrets Store CSI driver
            (``DeployFacts.secrets_store_in_use``): its charts stay even when nothing new mounts through
            them, since a pod whose CSI volume has no driver cannot unmount it and stays Terminating.
        api_key_key_arns: the customer-managed KMS keys of the API key secrets (resolved by `make
            deploy`'s guard: ``DeployFacts.api_key_kms_key_arns``); the GPU workers' role may decrypt with them.
        streamer_wheels: (bucket, prefix) of the model streamer's wheels in the stack's mirror, which
            the streaming GPU workers' init container fetches (``manifests.ray_service.streamer_wheels_location``).

    ``serve_service`` is the internal NLB's Service (None without one); whoever wires the stack
    makes it, and ``namespace``, depend on what must outlive them on teardown (the nodes, the
    cluster's networking add-ons, the load balancer controller: ``manifests.finalizers``).
    """

    def __init__(
        self,
        scope: Construct,
        id_: str,
        *,
        cluster: eks.Cluster,
        ray_service: RayServiceConfig,
        serving: ServingSpec,
        charts: ChartVersions,
        render_manifest: Callable[[str], dict[str, Any]],
        operator: Construct,
        token_key_arn: str | None = None,
        gcs_store: GcsStore | None = None,
        streamer_wheels: tuple[str, str] | None = None,
        api_key_key_arns: Sequence[str] = (),
        keep_secrets_store: bool = False,
        network_policies: Sequence[dict[str, Any]] = (),
    ) -> None:
        super().__init__(scope, id_)
        rs = ray_service
        self.namespace = cluster.add_manifest("Namespace", namespace_manifest(rs))
        # Two accounts, so that each role reads only what its own pods mount or fetch: the head the store's
        # AUTH token and the code; the GPU workers the model, the streamer's wheels, the HF token, the API
        # keys and the code. The head's keeps the id of the one account both shared before, and so its
        # resources in a deployed stack (why: manifests.contract).
        self.head_service_account = self._service_account(
            cluster, id_="ServiceAccount", name=RAY_HEAD_SERVICE_ACCOUNT, namespace=rs.namespace
        )
        self.worker_service_account = self._service_account(
            cluster, id_="GpuWorkerServiceAccount", name=RAY_WORKER_SERVICE_ACCOUNT, namespace=rs.namespace
        )
        # The operator takes the finalizers of the RayService and its RayClusters off; the namespace's
        # deletion waits for them, so it goes before the operator on teardown.
        self.namespace.node.add_dependency(operator)
        self.network_policies = None
        if network_policies:
            self.network_policies = cluster.add_manifest("NetworkPolicies", *network_policies)
            self.network_policies.node.add_dependency(self.namespace)

        # A content hash names the object, so any change to serve_app rolls out on the next deploy.
        self.code = s3_assets.Asset(self, "ServeAppCode", path=str(stage_serve_app(SERVE_APP_DIR)))
        # Read this one object, not the whole (shared) CDK assets bucket. The workers' replicas run
        # serve_app; so may the head, where Serve's controller builds the app in a zero-CPU task
        # (build_serve_application, ray/serve/_private/application_state.py).
        for account in (self.head_service_account, self.worker_service_account):
            account.add_to_principal_policy(
                iam.PolicyStatement(
                    actions=["s3:GetObject"],
                    resources=[self.code.bucket.arn_for_objects(self.code.s3_object_key)],
                )
            )
        self._grant_model_access(serving, token_key_arn, streamer_wheels)
        # The CSI driver and AWS's provider, for the token's and the API keys' mounts and for the GCS
        # store's Secret sync.
        self.secrets_store = None
        if serving.model.hf_token_secret or gcs_store or rs.endpoint.api_key_secrets or keep_secrets_store:
            self.secrets_store = HuggingFaceToken(
                self,
                "HfToken",
                cluster=cluster,
                namespace=rs.namespace,
                secret=serving.model.hf_token_secret,
                driver_version=charts.secrets_store_csi_driver,
                provider_version=charts.secrets_store_csi_provider_aws,
                namespace_manifest=self.namespace,
                sync_secrets=gcs_store is not None,
            )
        self.hf_token = self.secrets_store if serving.model.hf_token_secret else None
        self.gcs_provider_class = None
        if gcs_store and self.secrets_store:
            # The head's role alone reads the AUTH token (GetSecretValue, DescribeSecret) through the CSI
            # provider: the head mounts it, and so does KubeRay's Redis cleanup Job, which runs as the head.
            gcs_store.auth_token.grant_read(self.head_service_account)
            self.gcs_provider_class_body = gcs_store_manifests.secret_provider_class(
                namespace=rs.namespace, secret_arn=gcs_store.auth_token.secret_arn, region=cdk.Stack.of(self).region
            )
            self.gcs_provider_class = cluster.add_manifest("GcsStoreSecretProviderClass", self.gcs_provider_class_body)
            self.gcs_provider_class.node.add_dependency(self.secrets_store.driver, self.namespace)
            # Teardown runs in reverse: the namespace, whose deletion waits for KubeRay's Redis cleanup
            # Job (the RayCluster's finalizer), goes before the store that the Job connects to.
            self.namespace.node.add_dependency(gcs_store)

        self.api_keys_provider_class = None
        self.cache_salt = CacheSalt(self, "CacheSalt")
        self.cache_salt_provider_class = None
        if rs.endpoint.api_key_secrets and self.secrets_store:
            self._grant_api_keys(rs.endpoint.api_key_secrets, api_key_key_arns)
            self.api_keys_provider_class_body = api_keys_manifests.secret_provider_class(
                namespace=rs.namespace, secrets=rs.endpoint.api_key_secrets, region=cdk.Stack.of(self).region
            )
            self.api_keys_provider_class = cluster.add_manifest(
                "ApiKeysSecretProviderClass", self.api_keys_provider_class_body
            )
            self.api_keys_provider_class.node.add_dependency(self.secrets_store.driver, self.namespace)
            # The keyed ingress reads the files the workers mount there.
            serving = serving.model_copy(update={"api_key_dir": api_keys_manifests.MOUNT_PATH})
            if rs.endpoint.cache_isolation == "per_key":
                self.cache_salt.grant_read(self.worker_service_account)
                self.cache_salt_provider_class = cluster.add_manifest(
                    "CacheSaltSecretProviderClass",
                    api_keys_manifests.salt_provider_class(
                        namespace=rs.namespace,
                        secret=self.cache_salt.secret.secret_arn,
                        region=cdk.Stack.of(self).region,
                    ),
                )
                self.cache_salt_provider_class.node.add_dependency(self.secrets_store.driver, self.namespace)
                serving = serving.model_copy(update={"cache_salt_file": api_keys_manifests.SALT_PATH})

        self.serve_config_v2 = serve_config_yaml(serving, working_dir=self.code.s3_object_url)
        self.manifest_body = render_manifest(self.serve_config_v2)
        # What KubeRay's controller would refuse fails synth here, not as a silent
        # ValidationFailed condition after the deploy.
        validate_ray_service(self.manifest_body)
        rules_note = rules_version_note(charts.kuberay_operator)
        if rules_note:
            cdk.Annotations.of(self).add_warning_v2("pd-serving:kuberay-rules-version", rules_note)
        self.manifest = cluster.add_manifest("RayService", self.manifest_body)
        self.manifest.node.add_dependency(operator)
        self.manifest.node.add_dependency(self.head_service_account, self.worker_service_account)
        if self.secrets_store:
            # Pods mount the token through the driver and the provider class from their first start.
            self.manifest.node.add_dependency(self.secrets_store)
        if self.gcs_provider_class:
            self.manifest.node.add_dependency(self.gcs_provider_class)
        if self.api_keys_provider_class:
            self.manifest.node.add_dependency(self.api_keys_provider_class)
        if self.cache_salt_provider_class:
            self.manifest.node.add_dependency(self.cache_salt_provider_class)
        if self.network_policies:
            self.manifest.node.add_dependency(self.network_policies)
        owned_service = owned_serve_service(rs)
        self.serve_service = cluster.add_manifest("ServeService", owned_service) if owned_service else None
        if self.serve_service:
            self.serve_service.node.add_dependency(self.namespace)
            self.manifest.node.add_dependency(self.serve_service)
        self.serve_service_name = serve_service_name(rs)
        self.port_forward_command = (
            f"kubectl -n {rs.namespace} port-forward svc/{self.serve_service_name} {SERVE_PORT}:{SERVE_PORT}"
        )

    def _service_account(self, cluster: eks.Cluster, *, id_: str, name: str, namespace: str) -> eks.ServiceAccount:
        account = cluster.add_service_account(
            id_, name=name, namespace=namespace, identity_type=eks.IdentityType.POD_IDENTITY
        )
        # Only the ServiceAccount object lives in the namespace. Its role and Pod Identity association
        # are AWS resources that the namespace's deletion may still need: KubeRay's Redis cleanup Job
        # runs as the head's account (manifests/finalizers.py), so they go after the namespace on teardown.
        account.node.find_child(f"manifest-{id_}ServiceAccountResource").node.add_dependency(self.namespace)
        self.namespace.node.add_dependency(account.role, account.node.find_child("Association"))
        return account

    def _grant_api_keys(self, secrets: Sequence[str], key_arns: Sequence[str]) -> None:
        """GetSecretValue and DescribeSecret on each key's secret alone, through the CSI provider; and
        kms:Decrypt through Secrets Manager on the customer-managed keys among them."""
        for index, secret in enumerate(secrets):
            imported_secret(self, f"ApiKeySecret{index}", secret).grant_read(self.worker_service_account)
        for arn in key_arns:
            grant_token_key(self, self.worker_service_account, arn)

    def _grant_model_access(
        self, serving: ServingSpec, token_key_arn: str | None, streamer_wheels: tuple[str, str] | None
    ) -> None:
        model = serving.model
        if model.hf_token_secret:
            # The CSI provider reads the secret with the mounting pod's Pod Identity role: the GPU
            # workers', for this secret alone (GetSecretValue, DescribeSecret), and its key if it is the customer's.
            imported_secret(self, "HfTokenSecret", model.hf_token_secret).grant_read(self.worker_service_account)
            if token_key_arn:
                grant_token_key(self, self.worker_service_account, token_key_arn)
        if model.is_s3:
            bucket_name, _, prefix = model.source.removeprefix("s3://").partition("/")
            bucket = s3.Bucket.from_bucket_name(self, "ModelBucket", bucket_name)
            objects = f"{prefix.strip('/')}/*" if prefix.strip("/") else "*"
            self.worker_service_account.add_to_principal_policy(
                iam.PolicyStatement(actions=["s3:GetObject"], resources=[bucket.arn_for_objects(objects)])
            )
            self.worker_service_account.add_to_principal_policy(
                iam.PolicyStatement(
                    actions=["s3:ListBucket"],
                    resources=[bucket.bucket_arn],
                    conditions={"StringLike": {"s3:prefix": [objects]}},
                )
            )
            acknowledge(
                self.worker_service_account,
                f"AwsSolutions-IAM5[Resource::arn:<AWS::Partition>:s3:::{bucket_name}/{objects}]",
                "A model mirror is many files under one prefix; the pods may only read that prefix.",
            )
        if streamer_wheels:
            bucket_name, prefix = streamer_wheels
            wheels = s3.Bucket.from_bucket_name(self, "StreamerWheelsBucket", bucket_name)
            self.worker_service_account.add_to_principal_policy(
                iam.PolicyStatement(actions=["s3:GetObject"], resources=[wheels.arn_for_objects(f"{prefix}/*")])
            )
            acknowledge(
                self.worker_service_account,
                f"AwsSolutions-IAM5[Resource::arn:<AWS::Partition>:s3:::{bucket_name}/{prefix}/*]",
                "The model streamer's wheels, one file per package under one prefix; the init container reads them.",
            )
