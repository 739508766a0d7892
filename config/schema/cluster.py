"""The EKS cluster: API endpoint access, node groups, autoscaling, add-ons, and the Helm charts it runs."""

from __future__ import annotations

import datetime as dt
from typing import Any, Literal

from pydantic import Field, field_validator, model_validator

from config import catalog, upgrade, versions
from config.schema.base import ADDON_VERSION, IAM_PRINCIPAL_ARN, LogRetentionDays, StrictModel, check_cidrs
from config.schema.deploy import UNRESOLVED_DEPLOYER_CIDR

# The VPC CNI release whose network policy agent enforces NetworkPolicy (v1.14.0-eksbuild.3):
# https://docs.aws.amazon.com/eks/latest/userguide/cni-network-policy.html
MIN_VPC_CNI_NETWORK_POLICY = (1, 14)


def _installed(distribution: str) -> bool:
    """Whether a package is installed, without importing it (aws_cdk's import starts a Node.js process)."""
    from importlib import metadata

    try:
        metadata.distribution(distribution)
    except metadata.PackageNotFoundError:
        return False
    return True


class EndpointAccessConfig(StrictModel):
    public: bool = Field(
        description="Expose the Kubernetes API endpoint publicly (restricted to public_cidrs).",
        default=True,
    )
    public_cidrs: list[str] = Field(
        description="CIDRs allowed to reach the public API endpoint. Required when public is true.",
        default_factory=list,
    )
    private: bool = Field(description="Also expose the API endpoint inside the VPC (nodes use it).", default=True)
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
        return check_cidrs(values, example="203.0.113.0/24")

    @model_validator(mode="after")
    def _reachable(self) -> EndpointAccessConfig:
        if not self.public and not self.private:
            raise ValueError("public and private are both false: the API would be unreachable")
        if self.public and not self.private:
            # The nodes reach the API through the private endpoint; a public one restricted to CIDRs
            # would shut them out, and aws_eks_v2 refuses it (CannotRestricPublicAccessEndpoint).
            raise ValueError(
                "public is true but private is false: the nodes could not reach an API restricted to "
                "public_cidrs; set private: true"
            )
        if self.public and not self.public_cidrs and not self.allow_deployer_address:
            raise ValueError(
                "public is true but public_cidrs is empty: list the CIDRs allowed to reach the "
                "API, set allow_deployer_address: true, or set public: false"
            )
        return self


class NodeGroupVersion(StrictModel):
    kubernetes_version: str | None = Field(
        default=None,
        description=(
            "The Kubernetes minor this group's nodes run; left out, the cluster's (cluster.kubernetes_version). "
            "At most three minors behind the cluster, never ahead. An upgrade needs none of these: `make deploy` "
            "moves the control plane first and then one node group per deploy (config/upgrade.py); set one to "
            "hold a group back."
        ),
        pattern=r"^1\.\d+$",
    )
    ami_release_version: str | None = Field(
        default=None,
        description=(
            "The EKS-optimized AL2023 AMI release this group's nodes run, e.g. 1.36.3-20260903; left out, the "
            "release config/versions.py pins for the group's Kubernetes minor, or the newer one the group already "
            "runs. Set it to take a newer release (rolls the group's nodes): `aws ssm get-parameter --name "
            "/aws/service/eks/optimized-ami/1.36/amazon-linux-2023/x86_64/nvidia/recommended/release_version` "
            "(standard instead of nvidia for the system group) names the newest. It must be a release of the "
            "group's Kubernetes minor."
        ),
        pattern=r"^1\.\d+\.\d+-\d{8}$",
    )


class NodeGroupSizing(StrictModel):
    min_size: int = Field(description="Fewest nodes the group scales down to.", ge=0)
    desired_size: int = Field(
        description=(
            "Nodes the group starts with when it is created. Once it exists Cluster Autoscaler owns its size: "
            "`make deploy` reads it and leaves it (change min_size or max_size to move it)."
        ),
        ge=0,
    )
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


class SystemNodeGroupConfig(NodeGroupSizing, RootVolume, NodeGroupVersion):
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


class GpuNodeGroupConfig(NodeGroupSizing, RootVolume, NodeGroupVersion):
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
        efa_types = [name for name, f in sorted(catalog.INSTANCES.items()) if f.supports_efa and f.gpu]
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
    system_node_group: SystemNodeGroupConfig = Field(description="CPU nodes for the KubeRay operator and the Ray head.")
    gpu_node_groups: GpuNodeGroups = Field(description="One EFA GPU node group per phase.")
    autoscaling: AutoscalingConfig = Field(
        default_factory=AutoscalingConfig,
        description="Cluster Autoscaler: GPU nodes per phase follow Ray's pending worker pods, from zero too.",
    )
    network_policies: bool = Field(
        default=True,
        description=(
            "Enforce Kubernetes NetworkPolicy with the VPC CNI (its add-on's enableNetworkPolicy, from add-on "
            "v1.14.0) and restrict who may connect to the serving namespace's pods: default deny, Ray's own "
            "traffic among the Ray pods, the dashboard from the KubeRay operator, each phase's NIXL ports from "
            "the other, Serve's port from the load balancer, the metrics port from the scraper "
            "(manifests/network_policies.py, docs/security.md)."
        ),
    )
    addon_versions: dict[Literal["vpc-cni", "kube-proxy", "coredns", "eks-pod-identity-agent"], str] = Field(
        default_factory=dict,
        description=(
            "Versions of EKS's managed add-ons that override config/versions.py's pins, e.g. {kube-proxy: "
            "v1.36.0-eksbuild.21}; each must be one EKS lists for kubernetes_version (`aws eks "
            "describe-addon-versions --kubernetes-version 1.36 --addon-name kube-proxy`) and not older than the "
            "cluster runs. Left out, an add-on runs the version pinned for the control plane's minor, or the newer "
            "one it already runs: a control plane upgrade moves the add-ons to the new minor's pins in the same "
            "deploy. Remove an override when you change kubernetes_version."
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

    @model_validator(mode="after")
    def _cni_enforces_policies(self) -> ClusterConfig:
        version = self.addon_versions.get("vpc-cni")
        if self.network_policies and version:
            major, minor = (int(part) for part in version.removeprefix("v").split(".")[:2])
            if (major, minor) < MIN_VPC_CNI_NETWORK_POLICY:
                raise ValueError(
                    f"network_policies is on, but addon_versions.vpc-cni {version} cannot enforce NetworkPolicy "
                    "(the VPC CNI's network policy agent arrived in v1.14.0); use a newer vpc-cni version or "
                    "leave it out (EKS's default for the cluster's version has it)"
                )
        return self

    @model_validator(mode="after")
    def _node_versions_within_skew(self) -> ClusterConfig:
        cluster = upgrade.minor(self.kubernetes_version)
        for group, version in self.node_group_versions().items():
            field = upgrade.GROUP_FIELDS[group]
            if upgrade.minor(version) > cluster:
                raise ValueError(
                    f"{field} {version} is newer than cluster.kubernetes_version {self.kubernetes_version}: nodes may "
                    f"not run ahead of the control plane; set {self.kubernetes_version} or leave it out"
                )
            if cluster - upgrade.minor(version) > upgrade.MAX_NODE_SKEW:
                raise ValueError(
                    f"{field} {version} is more than {upgrade.MAX_NODE_SKEW} minors behind cluster.kubernetes_version "
                    f"{self.kubernetes_version} (Kubernetes' version skew policy); set "
                    f"{upgrade.version_of(cluster - upgrade.MAX_NODE_SKEW)} or later"
                )
        return self

    @model_validator(mode="after")
    def _releases_pinned(self) -> ClusterConfig:
        for group, version in self.node_group_versions().items():
            release = self.node_groups()[group].ami_release_version
            field = upgrade.GROUP_FIELDS[group].replace("kubernetes_version", "ami_release_version")
            if release is not None and not release.startswith(f"{version}."):
                raise ValueError(
                    f"{field} {release} is not a release of Kubernetes {version}, which the group runs; set a {version} "
                    "release or leave it out"
                )
            if release is None and version not in versions.NODE_AMI_RELEASES:
                raise ValueError(
                    f"the {group} nodes run Kubernetes {version}, for which config/versions.py pins no AMI release "
                    f"(NODE_AMI_RELEASES); set {field} to a {version} release, or add the pin"
                )
        return self

    def node_groups(self) -> dict[str, NodeGroupVersion]:
        """Each node group's section, by the name the deploy facts use."""
        return {
            "system": self.system_node_group,
            "prefill": self.gpu_node_groups.prefill,
            "decode": self.gpu_node_groups.decode,
        }

    def node_group_versions(self) -> dict[str, str]:
        """Each node group's Kubernetes minor: its own, or the cluster's."""
        return {name: group.kubernetes_version or self.kubernetes_version for name, group in self.node_groups().items()}

    @field_validator("admin_principals")
    @classmethod
    def _arns(cls, values: list[str]) -> list[str]:
        for value in values:
            if not IAM_PRINCIPAL_ARN.match(value):
                raise ValueError(
                    f"{value!r} is not an IAM role or user ARN such as arn:aws:iam::123456789012:role/Admin"
                )
        return values


def _chart_version(pin: versions.HelmChartPin, of: str) -> Any:
    """A chart's version field: "Chart version of <of>", by default the version config/versions.py pins."""
    return Field(description=f"Chart version of {of}", default=pin.version)


class ChartVersions(StrictModel):
    nvidia_device_plugin: str = _chart_version(versions.NVIDIA_DEVICE_PLUGIN, "NVIDIA's device plugin.")
    efa_device_plugin: str = _chart_version(versions.EFA_DEVICE_PLUGIN, "the AWS EFA device plugin.")
    kuberay_operator: str = _chart_version(
        versions.KUBERAY_OPERATOR,
        "the KubeRay operator (its CRDs must match the RayService; Helm does not upgrade CRDs, "
        "`make upgrade-crds` does).",
    )
    secrets_store_csi_driver: str = _chart_version(
        versions.SECRETS_STORE_CSI_DRIVER,
        "the Secrets Store CSI driver (installed only for a gated model's token).",
    )
    secrets_store_csi_provider_aws: str = _chart_version(
        versions.SECRETS_STORE_CSI_PROVIDER_AWS,
        "AWS's Secrets Store CSI provider (installed only for a gated model's token).",
    )
    cluster_autoscaler: str = _chart_version(
        versions.CLUSTER_AUTOSCALER,
        "Cluster Autoscaler; the autoscaler release itself follows cluster.kubernetes_version (config/versions.py).",
    )
