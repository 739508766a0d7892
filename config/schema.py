"""The typed configuration of one environment.

One YAML file per environment under ``config/`` is loaded into :class:`AppConfig`. Every model is
frozen and rejects unknown keys, so a typo fails synth instead of being silently ignored.
Cross-field rules that would otherwise surface twenty minutes into ``cdk deploy`` live here.
"""

from __future__ import annotations

import datetime as dt
import ipaddress
import re
from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from config import catalog, versions
from cdk_constructs.kuberay_rules import MAX_RAY_SERVICE_NAME_LENGTH, is_dns1035_label
from config.observability import ADDON_VERSION, AMP_MIN_SCRAPE_INTERVAL, LogRetentionDays, ObservabilityConfig
from serve_app.spec import PHASES, ServingSpec

DNS_1123_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$")
PLACEHOLDER_ACCOUNT = "000000000000"
# Stands in for the deployer's address until `make deploy` resolves it: RFC 5737 TEST-NET-1,
# which no client comes from, so a template deployed without the guard fails closed.
UNRESOLVED_DEPLOYER_CIDR = "192.0.2.1/32"


def _installed(distribution: str) -> bool:
    """Whether a package is installed, without importing it (aws_cdk's import starts a Node.js process)."""
    from importlib import metadata

    try:
        metadata.distribution(distribution)
    except metadata.PackageNotFoundError:
        return False
    return True


class StrictModel(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


def dns_label(value: str) -> str:
    if not DNS_1123_LABEL.match(value):
        raise ValueError(
            f"{value!r} is not a valid DNS-1123 label: use at most 63 lower-case letters, "
            "digits and '-', starting and ending with a letter or digit"
        )
    return value


DnsLabel = Annotated[str, Field(min_length=1, max_length=63)]


class AwsTarget(StrictModel):
    account: str = Field(
        description=(
            "12-digit AWS account id to deploy into. The placeholder 000000000000 synthesizes "
            "offline but `make deploy` refuses it."
        ),
        pattern=r"^\d{12}$",
    )
    region: str = Field(
        description="AWS region, for example us-east-2.",
        pattern=r"^[a-z]{2}(-gov)?-[a-z]+-\d$",
    )


class NetworkConfig(StrictModel):
    vpc_cidr: str = Field(description="IPv4 CIDR of the VPC, /16 to /24.", default="10.40.0.0/16")
    availability_zones: list[str] = Field(
        description=(
            "Availability zones of the VPC (at least two: EKS requires it). They are written "
            "into the app's context so synth never looks them up."
        ),
        min_length=2,
    )
    gpu_availability_zone: str = Field(
        description=(
            "The one AZ that holds every GPU node: EFA traffic does not cross AZs and a cluster "
            "placement group lives in one AZ. Choose an AZ that has the GPU instance type."
        )
    )
    nat_gateways: int = Field(
        description="NAT gateways for the private subnets (1 is cheap, one per AZ is resilient).",
        ge=0,
        default=1,
    )
    interface_endpoints: list[
        Literal["ecr.api", "ecr.dkr", "sts", "eks", "eks-auth", "logs", "secretsmanager"]
    ] = Field(
        description=(
            "Interface VPC endpoints. ECR's two keep the multi-GB serving image off the NAT "
            "gateway; an S3 gateway endpoint (free) is always created for the image layers."
        ),
        default_factory=lambda: ["ecr.api", "ecr.dkr"],
    )
    flow_log_retention_days: LogRetentionDays = Field(
        description="Days to keep VPC flow logs (one of the periods CloudWatch Logs accepts).",
        default=30,
    )

    @field_validator("vpc_cidr")
    @classmethod
    def _cidr(cls, value: str) -> str:
        try:
            network = ipaddress.IPv4Network(value)
        except ValueError as exc:
            raise ValueError(f"{value!r} is not an IPv4 CIDR such as 10.40.0.0/16 ({exc})") from None
        if not 16 <= network.prefixlen <= 24:
            raise ValueError(f"{value} has prefix /{network.prefixlen}; use /16 to /24")
        return value

    @model_validator(mode="after")
    def _gpu_zone_in_vpc(self) -> NetworkConfig:
        if len(set(self.availability_zones)) != len(self.availability_zones):
            raise ValueError("availability_zones lists a zone twice; list each zone once")
        if self.gpu_availability_zone not in self.availability_zones:
            raise ValueError(
                f"gpu_availability_zone {self.gpu_availability_zone!r} is not one of "
                f"availability_zones {self.availability_zones}; pick one of those or add it"
            )
        if self.nat_gateways > len(self.availability_zones):
            raise ValueError(
                f"nat_gateways={self.nat_gateways} exceeds the {len(self.availability_zones)} "
                "availability zones; use at most one per zone"
            )
        return self


class EndpointAccessConfig(StrictModel):
    public: bool = Field(
        description="Expose the Kubernetes API endpoint publicly (restricted to public_cidrs).",
        default=True,
    )
    public_cidrs: list[str] = Field(
        description="CIDRs allowed to reach the public API endpoint. Required when public is true.",
        default_factory=list,
    )
    private: bool = Field(
        description="Also expose the API endpoint inside the VPC (nodes use it).", default=True
    )
    allow_deployer_address: bool = Field(
        default=False,
        description=(
            "`make deploy` adds the public IPv4 address it runs from (as a /32, looked up at deploy "
            "time, never at synth) to public_cidrs, so the person who deploys can use kubectl at once. "
            f"Offline synth puts {UNRESOLVED_DEPLOYER_CIDR} (RFC 5737, reaches nothing) in its place. "
            "Deploy again from a new address to move it."
        ),
    )

    @field_validator("public_cidrs")
    @classmethod
    def _cidrs(cls, values: list[str]) -> list[str]:
        for value in values:
            try:
                ipaddress.ip_network(value)
            except ValueError:
                raise ValueError(f"{value!r} is not a CIDR such as 203.0.113.0/24") from None
        return values

    @model_validator(mode="after")
    def _reachable(self) -> EndpointAccessConfig:
        if not self.public and not self.private:
            raise ValueError("public and private are both false: the API would be unreachable")
        if self.public and not self.public_cidrs and not self.allow_deployer_address:
            raise ValueError(
                "public is true but public_cidrs is empty: list the CIDRs allowed to reach the "
                "API, set allow_deployer_address: true, or set public: false"
            )
        return self


class NodeGroupSizing(StrictModel):
    min_size: int = Field(description="Fewest nodes the group scales down to.", ge=0)
    desired_size: int = Field(description="Nodes the group starts with.", ge=0)
    max_size: int = Field(description="Most nodes the group scales up to.", ge=1)

    @model_validator(mode="after")
    def _ordered(self):
        if not self.min_size <= self.desired_size <= self.max_size:
            raise ValueError(
                f"sizes must satisfy min_size <= desired_size <= max_size, got "
                f"{self.min_size} / {self.desired_size} / {self.max_size}; adjust them"
            )
        return self


class RootVolume(StrictModel):
    """The encrypted gp3 root volume of a node group, where images (and weights) land."""

    root_volume_iops: int = Field(
        default=6000,
        ge=3000,
        le=16000,
        description=(
            "gp3 IOPS of the root volume (3000 is gp3's baseline, included in its price; more is billed "
            "per IOPS-month). Image layers unpack as many small files."
        ),
    )
    root_volume_throughput_mibps: int = Field(
        default=500,
        ge=125,
        le=1000,
        description=(
            "gp3 throughput of the root volume in MiB/s. 125 (the baseline) makes a pull of the "
            "multi-GB serving image and of the weights take minutes; 500 cuts that about fourfold for "
            "about $15 per node-month. At most IOPS / 4."
        ),
    )

    @model_validator(mode="after")
    def _gp3_ratio(self):
        if self.root_volume_throughput_mibps * 4 > self.root_volume_iops:
            raise ValueError(
                f"root_volume_throughput_mibps={self.root_volume_throughput_mibps} needs at least "
                f"{self.root_volume_throughput_mibps * 4} root_volume_iops (gp3 allows 0.25 MiB/s per IOPS); "
                "raise the IOPS or lower the throughput"
            )
        return self


class SystemNodeGroupConfig(NodeGroupSizing, RootVolume):
    instance_type: str = Field(
        description="Instance type of the system nodes (KubeRay operator, Ray head).",
        default="m7i.xlarge",
    )
    root_volume_gib: int = Field(
        description=(
            "Encrypted gp3 root volume size. The Ray head runs here from the serving image, which is "
            f"tens of GB unpacked plus its compressed layers: at least {versions.SERVING_IMAGE_NODE_DISK_GIB} GiB."
        ),
        default=100,
    )

    @field_validator("root_volume_gib")
    @classmethod
    def _room_for_image(cls, value: int) -> int:
        if value < versions.SERVING_IMAGE_NODE_DISK_GIB:
            raise ValueError(
                f"root_volume_gib={value} leaves no room for the serving image that the Ray head pulls here "
                f"(tens of GB unpacked plus its compressed layers); use at least {versions.SERVING_IMAGE_NODE_DISK_GIB}"
            )
        return value


class GpuNodeGroupConfig(NodeGroupSizing, RootVolume):
    instance_type: str = Field(
        description="EFA-capable GPU instance type of this phase, for example g6.8xlarge.",
        default="g6.8xlarge",
    )
    root_volume_gib: int = Field(
        description="Encrypted gp3 root volume; the serving image alone is tens of GB, and weights land here.",
        default=200,
        ge=200,
    )

    @field_validator("instance_type")
    @classmethod
    def _efa_capable(cls, value: str) -> str:
        facts = catalog.INSTANCES.get(value)
        efa_types = [
            name for name, f in sorted(catalog.INSTANCES.items()) if f.supports_efa and f.gpu
        ]
        if facts is None:
            raise ValueError(
                f"{value!r} is not in the instance table (config/catalog.py); use one of "
                f"{', '.join(efa_types)} or add its facts there"
            )
        if not facts.gpu:
            raise ValueError(f"{value} has no GPU; use one of {', '.join(efa_types)}")
        if not facts.supports_efa:
            raise ValueError(
                f"{value} does not support EFA, which carries the KV cache between phases; use "
                f"one of {', '.join(efa_types)}"
            )
        return value


class GpuNodeGroups(StrictModel):
    prefill: GpuNodeGroupConfig = Field(description="Nodes that run the prefill engines.")
    decode: GpuNodeGroupConfig = Field(description="Nodes that run the decode engines.")


class AutoscalingConfig(StrictModel):
    scale_down_idle_minutes: int = Field(
        default=10,
        ge=1,
        le=1440,
        description=(
            "Minutes a node stays unneeded before Cluster Autoscaler removes it; Ray's idle timeout for "
            "worker pods (autoscalerOptions.idleTimeoutSeconds) is set to the same, so an idle GPU worker "
            "pod goes first and its node follows."
        ),
    )


class ClusterConfig(StrictModel):
    kubernetes_version: str = Field(
        description=(
            "EKS Kubernetes version. It must still be creatable on EKS and have its CDK kubectl "
            "layer installed (aws-cdk.lambda-layer-kubectl-v<minor>)."
        ),
        default=versions.DEFAULT_KUBERNETES_VERSION,
    )
    endpoint: EndpointAccessConfig = Field(description="Kubernetes API endpoint access.")
    admin_principals: list[str] = Field(
        description=(
            "IAM role or user ARNs granted cluster admin through EKS access entries. A role ARN "
            "includes its path (SSO roles: arn:aws:iam::<account>:role/aws-reserved/sso.amazonaws.com/"
            "<region>/AWSReservedSSO_…); `aws iam get-role --role-name NAME` prints it."
        ),
        default_factory=list,
    )
    grant_deployer_admin: bool = Field(
        default=True,
        description=(
            "`make deploy` resolves the IAM role or user that runs it (at deploy time, from your "
            "credentials) and grants it cluster admin, so whoever deploys can use kubectl. Another "
            "person's later deploy moves that grant to them: list lasting admins in admin_principals."
        ),
    )
    log_retention_days: LogRetentionDays = Field(
        default=30,
        description=(
            "Days to keep the EKS control-plane logs and the logs of the stack's own Lambda functions "
            "(kubectl handler, custom-resource providers); all are deleted with the stack."
        ),
    )
    metadata_hop_limit: int = Field(
        description=(
            "IMDSv2 hop limit on every node. 1 keeps pods away from the node role; workloads "
            "get credentials from EKS Pod Identity instead."
        ),
        default=1,
        ge=1,
        le=2,
    )
    system_node_group: SystemNodeGroupConfig = Field(
        description="CPU nodes for the KubeRay operator and the Ray head."
    )
    gpu_node_groups: GpuNodeGroups = Field(description="One EFA GPU node group per phase.")
    autoscaling: AutoscalingConfig = Field(
        default_factory=AutoscalingConfig,
        description="Cluster Autoscaler: GPU nodes per phase follow Ray's pending worker pods, from zero too.",
    )
    addon_versions: dict[Literal["vpc-cni", "kube-proxy", "coredns", "eks-pod-identity-agent"], str] = Field(
        default_factory=dict,
        description=(
            "Versions of EKS's managed add-ons, e.g. {kube-proxy: v1.35.3-eksbuild.2}; each must be one EKS lists "
            "for kubernetes_version (`aws eks describe-addon-versions --kubernetes-version 1.36 --addon-name "
            "kube-proxy`). Left out, EKS installs its default for the cluster's version. Set them again when "
            "you change kubernetes_version."
        ),
    )

    @field_validator("kubernetes_version")
    @classmethod
    def _creatable(cls, value: str) -> str:
        release = versions.KUBERNETES_RELEASES.get(value)
        if release is None:
            raise ValueError(
                f"Kubernetes {value} is unknown; use one of "
                f"{', '.join(versions.KUBERNETES_RELEASES)} (default {versions.DEFAULT_KUBERNETES_VERSION})"
            )
        end = release.end_of_extended_support
        if end is not None and end <= dt.date.today():
            raise ValueError(
                f"EKS no longer creates Kubernetes {value} clusters (extended support ended "
                f"{end.isoformat()}); use {versions.DEFAULT_KUBERNETES_VERSION}"
            )
        if value not in versions.CLUSTER_AUTOSCALER_RELEASES:
            raise ValueError(
                f"Kubernetes {value} has no Cluster Autoscaler release pinned in config/versions.py "
                f"(CLUSTER_AUTOSCALER_RELEASES); add the latest cluster-autoscaler-{value}.x or use "
                f"{versions.DEFAULT_KUBERNETES_VERSION}"
            )
        if not _installed(release.layer_package):
            raise ValueError(
                f"Kubernetes {value} needs the kubectl layer package {release.layer_package}, "
                f"which is not installed; add it to requirements.txt or use "
                f"{versions.DEFAULT_KUBERNETES_VERSION}"
            )
        return value

    @field_validator("addon_versions")
    @classmethod
    def _addon_versions(cls, values: dict[str, str]) -> dict[str, str]:
        for name, version in values.items():
            if not ADDON_VERSION.match(version):
                raise ValueError(
                    f"{name}: {version!r} is not an EKS add-on version such as v1.35.3-eksbuild.2; list them with "
                    f"`aws eks describe-addon-versions --addon-name {name}`"
                )
        return values

    @field_validator("admin_principals")
    @classmethod
    def _arns(cls, values: list[str]) -> list[str]:
        for value in values:
            if not re.match(r"^arn:aws[a-z-]*:iam::\d{12}:(role|user)/[\w+=,.@/-]+$", value):
                raise ValueError(
                    f"{value!r} is not an IAM role or user ARN such as "
                    "arn:aws:iam::123456789012:role/Admin"
                )
        return values


class ChartVersions(StrictModel):
    nvidia_device_plugin: str = Field(
        description="Chart version of NVIDIA's device plugin.",
        default=versions.NVIDIA_DEVICE_PLUGIN.version,
    )
    efa_device_plugin: str = Field(
        description="Chart version of the AWS EFA device plugin.",
        default=versions.EFA_DEVICE_PLUGIN.version,
    )
    kuberay_operator: str = Field(
        description=(
            "Chart version of the KubeRay operator (its CRDs must match the RayService; Helm does not "
            "upgrade CRDs, `make upgrade-crds` does)."
        ),
        default=versions.KUBERAY_OPERATOR.version,
    )
    secrets_store_csi_driver: str = Field(
        description="Chart version of the Secrets Store CSI driver (installed only for a gated model's token).",
        default=versions.SECRETS_STORE_CSI_DRIVER.version,
    )
    secrets_store_csi_provider_aws: str = Field(
        description="Chart version of AWS's Secrets Store CSI provider (installed only for a gated model's token).",
        default=versions.SECRETS_STORE_CSI_PROVIDER_AWS.version,
    )
    cluster_autoscaler: str = Field(
        description=(
            "Chart version of Cluster Autoscaler; the autoscaler release itself follows "
            "cluster.kubernetes_version (config/versions.py)."
        ),
        default=versions.CLUSTER_AUTOSCALER.version,
    )


VERSIONED_TAG = re.compile(r"(^|[^0-9])v?\d+\.\d+(\.\d+)?([^0-9]|$)")


class HeadResources(StrictModel):
    cpu: str = Field(default="2", description="CPU request (and limit) of the Ray head pod.")
    memory: str = Field(default="8Gi", description="Memory request (and limit) of the Ray head pod.")


class EndpointExposure(StrictModel):
    internal_nlb: bool = Field(
        default=False,
        description=(
            "Expose the OpenAI endpoint on an internal Network Load Balancer (installs the AWS "
            "Load Balancer Controller). Off: cluster-internal only, reach it by port-forward."
        ),
    )
    allowed_cidrs: list[str] = Field(
        default_factory=list,
        description="CIDRs allowed to reach the internal NLB (required when internal_nlb is on).",
    )

    @model_validator(mode="after")
    def _cidrs(self) -> EndpointExposure:
        for value in self.allowed_cidrs:
            try:
                ipaddress.ip_network(value)
            except ValueError:
                raise ValueError(f"allowed_cidrs: {value!r} is not a CIDR such as 10.0.0.0/8") from None
        if self.internal_nlb and not self.allowed_cidrs:
            raise ValueError(
                "internal_nlb is on but allowed_cidrs is empty; list the CIDRs that may call the endpoint"
            )
        return self


class RayServiceConfig(StrictModel):
    namespace: str = Field(default="llm", description="Kubernetes namespace of the RayService.")
    name: str = Field(
        default="pd-llm",
        description=(
            "Name of the RayService object: a DNS-1035 label of at most 47 characters, as KubeRay "
            "requires. Its Services are <name>-serve-svc and <name>-head-svc."
        ),
    )
    image: str = Field(
        default=f"{versions.SERVING_IMAGE_REPOSITORY}:{versions.SERVING_IMAGE_TAG}",
        description=(
            "Serving image with Ray, vLLM, NIXL and the EFA userspace; `{region}` is replaced "
            "by aws.region. Must carry a version tag or a digest."
        ),
    )
    ray_version: str = Field(
        default=versions.SERVING_IMAGE_RAY_VERSION,
        description="The Ray version inside the image (KubeRay's rayVersion must equal it).",
    )
    rollout: Literal["in_place", "new_cluster"] = Field(
        default="new_cluster",
        description=(
            "How a change of serve_app's code or of the serving spec rolls out. in_place: Ray Serve "
            "replaces the replicas of the running cluster; Ray 2.58 stops old replicas before it starts "
            "new ones, so a phase with one replica is offline for a model load (minutes on a GPU). "
            "new_cluster: the change also changes the RayCluster spec (an annotation with a hash of the "
            "Serve config), so KubeRay's NewCluster upgrade builds a second cluster, moves traffic once its "
            "app is healthy and deletes the old one after rayClusterDeletionDelaySeconds; no phase is ever "
            "without a ready replica, at the price of a second set of nodes during the rollout."
        ),
    )
    cluster_deletion_delay_seconds: int = Field(
        default=120,
        ge=0,
        le=3600,
        description=(
            "After a NewCluster switch, how long the old RayCluster lives on to finish the requests it already "
            "has (KubeRay's rayClusterDeletionDelaySeconds); keep it above your longest request."
        ),
    )
    head: HeadResources = Field(default_factory=HeadResources, description="Ray head pod size.")
    endpoint: EndpointExposure = Field(
        default_factory=EndpointExposure, description="How clients reach the endpoint."
    )

    @field_validator("namespace")
    @classmethod
    def _label(cls, value: str) -> str:
        return dns_label(value)

    @field_validator("name")
    @classmethod
    def _kuberay_name(cls, value: str) -> str:
        # KubeRay's ValidateRayServiceMetadata: a DNS-1035 label of at most 47 characters (its
        # RayCluster gets a 6-character suffix and its Service "-serve-svc" on top).
        if len(value) > MAX_RAY_SERVICE_NAME_LENGTH or is_dns1035_label(value):
            raise ValueError(
                f"{value!r} is a name KubeRay refuses; use a DNS-1035 label of at most "
                f"{MAX_RAY_SERVICE_NAME_LENGTH} characters: lower-case letters, digits and '-', starting with "
                "a letter and ending with a letter or digit, for example pd-llm"
            )
        return value

    @field_validator("image")
    @classmethod
    def _versioned(cls, value: str) -> str:
        if "@sha256:" in value:
            return value
        repository, _, tag = value.rpartition(":")
        if not repository or "/" in tag or not VERSIONED_TAG.search(tag):
            raise ValueError(
                f"image {value!r} has no version tag; pin a versioned tag such as "
                f"{versions.SERVING_IMAGE_TAG} or a @sha256 digest (floating tags change under you)"
            )
        return value

    def image_for(self, region: str) -> str:
        return self.image.replace("{region}", region)


S3_BUCKET_NAME = re.compile(r"^[a-z0-9][a-z0-9.-]*[a-z0-9]$")


class ModelMirrorConfig(StrictModel):
    enabled: bool = Field(
        default=False,
        description=(
            "Create an S3 bucket for model weights, readable by the Ray pods and writable by `make mirror-model`'s "
            "Job. Point serving.model.source at s3://<bucket>/<model_id> once the model is mirrored."
        ),
    )
    bucket_name: str | None = Field(
        default=None,
        description="The bucket's name; left empty: <name>-models-<account>-<region>, which is unique per account.",
    )
    keep_on_destroy: bool | None = Field(
        default=None,
        description=(
            "Keep the bucket and its weights when the stack is destroyed (copying a model again takes an hour). "
            "Left empty: kept in production, emptied and deleted elsewhere."
        ),
    )

    @field_validator("bucket_name")
    @classmethod
    def _s3_name(cls, value: str | None) -> str | None:
        if value is None:
            return value
        problem = s3_bucket_name_problem(value)
        if problem:
            raise ValueError(f"{value!r} is a name S3 refuses: {problem}")
        return value


def s3_bucket_name_problem(name: str) -> str | None:
    """S3's bucket naming rules (general purpose buckets), as a fix to apply, or None."""
    if not 3 <= len(name) <= 63:
        return "use 3-63 characters"
    if not S3_BUCKET_NAME.match(name):
        return "use lower-case letters, digits, '.' and '-', starting and ending with a letter or digit"
    if ".." in name:
        return "no two dots in a row"
    if re.fullmatch(r"\d+\.\d+\.\d+\.\d+", name):
        return "not an IP address"
    if name.startswith(("xn--", "sthree-", "amzn-s3-demo-")):
        return "do not start with 'xn--', 'sthree-' or 'amzn-s3-demo-'"
    if name.endswith(("-s3alias", "--ol-s3", ".mrap", "--x-s3", "--table-s3")):
        return "do not end with '-s3alias', '--ol-s3', '.mrap', '--x-s3' or '--table-s3'"
    return None


class PlannerSettings(StrictModel):
    max_transfer_share: float = Field(
        default=0.25,
        gt=0,
        le=1,
        description="Largest share of prefill time that moving the KV cache may take before the plan warns.",
    )
    fail_on_transfer_share: bool = Field(
        default=False, description="Fail synth (instead of warning) when the share is exceeded."
    )
    typical_prompt_tokens: int = Field(
        default=4096, ge=1, description="Prompt length the verdict is judged at."
    )
    typical_output_tokens: int = Field(
        default=256, ge=1, description="Output length the verdict is judged at."
    )
    prefill_mfu: float = Field(
        default=0.35,
        gt=0,
        le=1,
        description="Share of the GPU's peak BF16 FLOPS a prefill reaches; calibrate from a GPU run.",
    )
    network_efficiency: float = Field(
        default=0.7,
        gt=0,
        le=1,
        description="Share of the instance's network bandwidth a KV transfer reaches.",
    )
    runtime_overhead_gib: float = Field(
        default=1.5,
        ge=0,
        description="GPU memory per GPU taken by CUDA context, activations and CUDA graphs.",
    )
    # Time to a new serving replica: each step an estimate to calibrate with a real deploy
    # (`make verify` reports how long the last replica took).
    node_boot_seconds: float = Field(
        default=90,
        gt=0,
        description=(
            "EC2 launch to a Ready Kubernetes node for a new GPU node. AWS publishes no figure; field reports "
            "of autoscaler-driven scale-ups give 45-90 s for the node (the upper end is used)."
        ),
    )
    image_compressed_gib: float = Field(
        default=12.6,
        gt=0,
        description=(
            "Compressed size of the serving image. AWS publishes none for the Ray LLM DLC; vLLM's CUDA image "
            "is about 12.6 GB (vllm-project/vllm#27154), and the DLC carries vLLM, Ray and EFA."
        ),
    )
    image_unpacked_gib: float = Field(
        default=28.6,
        gt=0,
        description=(
            "Unpacked size of the serving image on the node (vLLM's CUDA image: 28.6 GB, vllm-project/vllm#22377). "
            "A pull writes the compressed layers and the unpacked snapshot to the root volume."
        ),
    )
    hf_download_mibps: float = Field(
        default=475,
        gt=0,
        description=(
            "Download rate of model files from Hugging Face through the NAT gateway (about 500 MB/s, where the "
            "hf_transfer README places the plain client's ceiling; a NAT gateway gives 5 Gbps, scaling to 100)."
        ),
    )
    s3_stream_gbps: float | None = Field(
        default=None,
        gt=0,
        description=(
            "Rate of streaming safetensors from the S3 mirror into the engine. Left empty: the node's network "
            "bandwidth × network_efficiency (Run:ai Model Streamer's S3 benchmark loads Llama-3-8B, 15 GB, in "
            "4.9 s at concurrency 32, so the network is the limit)."
        ),
    )
    engine_start_seconds: float = Field(
        default=80,
        gt=0,
        description=(
            "vLLM engine start after the weights are loaded: torch.compile (66.5 s for an 8B model on an L4, "
            "vllm-project/vllm#20264) plus CUDA graph capture and KV-cache allocation."
        ),
    )


class AppConfig(StrictModel):
    name: str = Field(
        description=(
            "Short DNS-1123 name of the deployment; prefixes the stack and the cluster name."
        )
    )
    production: bool = Field(
        description="Marks a production environment; stricter checks apply.", default=False
    )
    aws: AwsTarget = Field(description="Where the stack is deployed.")
    network: NetworkConfig = Field(description="VPC layout.")
    cluster: ClusterConfig = Field(description="EKS cluster and node groups.")
    charts: ChartVersions = Field(
        description="Helm chart versions (defaults pinned in config/versions.py).",
        default_factory=ChartVersions,
    )
    tags: dict[str, str] = Field(
        description="Tags applied to every taggable resource.", default_factory=dict
    )
    ray_service: RayServiceConfig = Field(
        default_factory=RayServiceConfig, description="The RayService that runs the serving app."
    )
    serving: ServingSpec = Field(description="What is served and how (serve_app's spec).")
    planner: PlannerSettings = Field(
        default_factory=PlannerSettings, description="Thresholds of the deployment planner."
    )
    model_mirror: ModelMirrorConfig = Field(
        default_factory=ModelMirrorConfig,
        description="The stack's own S3 mirror of model weights (`make mirror-model` fills it).",
    )
    observability: ObservabilityConfig = Field(
        default_factory=ObservabilityConfig,
        description="Where Ray's and vLLM's Prometheus metrics are scraped to, and the per-phase dashboard.",
    )

    @field_validator("name")
    @classmethod
    def _name(cls, value: str) -> str:
        if len(value) > 40:
            raise ValueError(f"{value!r} is {len(value)} characters; use at most 40 so derived names fit")
        return dns_label(value)

    @model_validator(mode="after")
    def _zones_in_region(self) -> AppConfig:
        region = self.aws.region
        foreign = [az for az in self.network.availability_zones if not az.startswith(region)]
        if foreign:
            raise ValueError(
                f"network.availability_zones {foreign} are not in aws.region {region}; use "
                f"zones such as {region}a, {region}b"
            )
        return self

    @model_validator(mode="after")
    def _production_endpoint(self) -> AppConfig:
        endpoint = self.cluster.endpoint
        if self.production and endpoint.public and any(
            ipaddress.ip_network(c).prefixlen == 0 for c in endpoint.public_cidrs
        ):
            raise ValueError(
                "cluster.endpoint.public_cidrs contains 0.0.0.0/0 in a production environment; "
                "list your own CIDRs or set cluster.endpoint.public: false"
            )
        return self

    @model_validator(mode="after")
    def _egress_for_charts_and_images(self) -> AppConfig:
        if self.network.nat_gateways == 0:
            # No VPC endpoint reaches public Helm repositories (github.io) or registries outside the
            # region's ECR (nvcr.io, quay.io, registry.k8s.io, another region's ECR).
            raise ValueError(
                "network.nat_gateways is 0, but the Helm charts come from public chart repositories and the "
                "device plugins' and KubeRay's images from nvcr.io, quay.io and other regions' ECR, which no VPC "
                "endpoint reaches; set nat_gateways: 1"
            )
        return self

    @field_validator("tags")
    @classmethod
    def _tags(cls, tags: dict[str, str]) -> dict[str, str]:
        for key, value in tags.items():
            if key.lower().startswith("aws:"):
                raise ValueError(f"key {key!r} starts with 'aws:', which AWS reserves for its own tags; rename it")
            if not 1 <= len(key) <= 128 or len(value) > 256:
                raise ValueError(f"{key!r}: tag keys take 1-128 characters and values at most 256; shorten it")
        return tags

    @model_validator(mode="after")
    def _s3_source_in_region(self) -> AppConfig:
        model = self.serving.model
        if not model.is_s3:
            return self
        bucket = model.source.removeprefix("s3://").split("/", 1)[0]
        if self.model_mirror.enabled and bucket == self.mirror_bucket:
            return self
        if model.source_region is None:
            raise ValueError(
                f"serving.model.source_region: required for an S3 source other than the stack's mirror ({bucket}): "
                f"an s3:// URI carries no region; set it (it must be {self.aws.region})"
            )
        if model.source_region != self.aws.region:
            raise ValueError(
                f"serving.model.source {model.source} is in {model.source_region}, not {self.aws.region}: every new "
                f"replica would pull the weights across regions (slow, paid per GB); mirror the model into "
                f"{self.aws.region} (model_mirror, make mirror-model)"
            )
        return self

    @model_validator(mode="after")
    def _mirror_name(self) -> AppConfig:
        if self.model_mirror.enabled and self.model_mirror.bucket_name is None:
            problem = s3_bucket_name_problem(self.mirror_bucket)
            if problem:
                raise ValueError(
                    f"model_mirror.bucket_name: the derived name {self.mirror_bucket!r} is one S3 refuses ({problem}); "
                    "set model_mirror.bucket_name"
                )
        return self

    @property
    def mirror_bucket(self) -> str:
        return self.model_mirror.bucket_name or f"{self.name}-models-{self.aws.account}-{self.aws.region}"

    @property
    def mirror_kept_on_destroy(self) -> bool:
        """model_mirror.keep_on_destroy, or, when unset, whether this is a production environment."""
        keep = self.model_mirror.keep_on_destroy
        return self.production if keep is None else keep

    @model_validator(mode="after")
    def _surge_needs_ray_2_60(self) -> AppConfig:
        ray_version = tuple(int(p) for p in re.findall(r"\d+", self.ray_service.ray_version)[:2])
        for phase in ("prefill", "decode", "colocated"):
            if self.serving.phase(phase).max_surge_percent is not None and ray_version < (2, 60):
                raise ValueError(
                    f"serving.{phase}.max_surge_percent needs Ray 2.60 or newer (Serve starts replacements before it "
                    f"stops old replicas from 2.60 on; 2.58 silently ignores the key), but ray_service.ray_version is "
                    f"{self.ray_service.ray_version}: remove it, or use an image with Ray 2.60+ and set ray_version"
                )
        return self

    @model_validator(mode="after")
    def _token_secret_in_region(self) -> AppConfig:
        secret = self.serving.model.hf_token_secret
        if secret and secret.startswith("arn:"):
            region = secret.split(":")[3]
            if region != self.aws.region:
                raise ValueError(
                    f"serving.model.hf_token_secret {secret} is in {region}; the pods read it in {self.aws.region}: "
                    f"use a secret in {self.aws.region} (or a replica of it there)"
                )
        return self

    @model_validator(mode="after")
    def _amp_scrape_interval(self) -> AppConfig:
        observability = self.observability
        if observability.backend == "amp" and observability.scrape_interval_seconds < AMP_MIN_SCRAPE_INTERVAL:
            raise ValueError(
                f"observability.scrape_interval_seconds={observability.scrape_interval_seconds}, but Amazon Managed "
                f"Prometheus scrapers refuse intervals under {AMP_MIN_SCRAPE_INTERVAL} s; use 30 or 60"
            )
        return self

    @model_validator(mode="after")
    def _serving_fits_node_groups(self) -> AppConfig:
        serving = self.serving
        if serving.device != "cuda":
            raise ValueError(
                "serving.device is cpu, which only `make local` runs; the cluster needs device: cuda"
            )
        groups = self.cluster.gpu_node_groups
        phases = PHASES if serving.mode == "disaggregated" else ("colocated",)
        for phase in phases:
            spec = serving.phase(phase)
            nodes = [getattr(groups, p) for p in (PHASES if phase == "colocated" else (phase,))]
            for group in nodes:
                facts = catalog.INSTANCES[group.instance_type]
                if spec.tensor_parallel_size > facts.gpu_count:
                    raise ValueError(
                        f"serving.{phase}.tensor_parallel_size={spec.tensor_parallel_size} needs more "
                        f"GPUs than {group.instance_type} has ({facts.gpu_count}); lower it or use a "
                        "larger instance type"
                    )
                if serving.kv_transfer.buffer_device == "cuda" and not facts.gpudirect_rdma:
                    raise ValueError(
                        f"serving.kv_transfer.buffer_device is cuda but {group.instance_type} has no "
                        "GPUDirect RDMA; set buffer_device: cpu (KV staged in host memory)"
                    )
            capacity = sum(
                g.max_size * catalog.replicas_per_node(g.instance_type, spec.tensor_parallel_size, spec.gpu_fraction)
                for g in nodes
            )
            if spec.max_replicas > capacity:
                raise ValueError(
                    f"serving.{phase}.max_replicas={spec.max_replicas} can never be scheduled: the "
                    f"node group holds at most {capacity} replicas of TP {spec.tensor_parallel_size}; "
                    "lower max_replicas or raise the node group's max_size"
                )
        return self

    @property
    def stack_name(self) -> str:
        return f"{self.name}-pd-serving"

    @property
    def cluster_name(self) -> str:
        return self.name


class DeployFacts(StrictModel):
    """What `make deploy` learns from AWS at deploy time and passes in; empty at offline synth."""

    deployer_principal: str | None = Field(
        default=None,
        description="IAM role (with its path) or user ARN of whoever runs `make deploy`.",
        pattern=r"^arn:aws[a-z-]*:iam::\d{12}:(role|user)/[\w+=,.@/-]+$",
    )
    deployer_cidr: str | None = Field(
        default=None, description="The public IPv4 address `make deploy` runs from, as a /32."
    )

    @field_validator("deployer_cidr")
    @classmethod
    def _single_address(cls, value: str | None) -> str | None:
        if value is not None and ipaddress.IPv4Network(value).prefixlen != 32:
            raise ValueError(f"deployer_cidr {value} is not a single IPv4 address (/32)")
        return value
