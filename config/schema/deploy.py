"""Where the stack goes, and what `make deploy` resolves at deploy time (never at synth)."""

from __future__ import annotations

import ipaddress
from typing import Annotated, Literal

from pydantic import Field, NonNegativeInt, PositiveInt, StringConstraints, field_validator

from config.schema.base import IAM_PRINCIPAL_ARN, StrictModel

PLACEHOLDER_ACCOUNT = "000000000000"
# The stack's managed node groups, as the deploy facts name them (the phases are serve_app.spec's).
NodeGroupName = Literal["system", "prefill", "decode"]
# Stands in for the deployer's address until `make deploy` resolves it: RFC 5737 TEST-NET-1,
# which no client comes from, so a template deployed without the guard fails closed.
UNRESOLVED_DEPLOYER_CIDR = "192.0.2.1/32"
KMS_KEY_ARN = r"^arn:aws[a-z-]*:kms:[a-z0-9-]+:\d{12}:key/(mrk-)?[0-9a-f-]+$"


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


class DeployedGcsStore(StrictModel):
    """The GCS store's replication group as the deployed template holds it, and whether the deployed
    RayService keeps its GCS there."""

    node_type: str = Field(description="CacheNodeType of the deployed replication group.")
    nodes: PositiveInt = Field(description="NumCacheClusters: the primary and its replicas.")
    failover: bool = Field(description="AutomaticFailoverEnabled (MultiAZEnabled follows it).")
    in_use: bool = Field(
        description=(
            "The deployed RayService carries gcsFaultToleranceOptions: the RayCluster it serves from keeps its "
            "GCS in this store until KubeRay deletes that cluster."
        )
    )


class DeployedStoreToken(StrictModel):
    """Where the GCS store's AUTH token rotation stands (config/token_rotation.py)."""

    secret_arn: str | None = Field(
        default=None, description="The token's secret (the stack's output GcsStoreAuthTokenSecret); None offline."
    )
    replication_group: str | None = Field(
        default=None, description="The store's replication group id (output GcsStoreReplicationGroup); None offline."
    )
    generation: PositiveInt = Field(
        default=1, description="The token generation the deployed head's pod template carries (1 when none)."
    )
    rotated_version: str | None = Field(
        default=None,
        description=(
            "The secret version labelled PDSERVING_ROTATED (secretsmanager:DescribeSecret): ElastiCache accepts it "
            "beside the old token until a SET."
        ),
    )
    mounts_synced: bool | None = Field(
        default=None,
        description=(
            "Every mount of the token holds the rotated version (kubectl: SecretProviderClassPodStatus); None "
            "when the cluster could not be asked."
        ),
    )
    older_clusters: list[str] | None = Field(
        default=None,
        description=(
            "RayClusters whose head carries an older token generation than the config's (kubectl); None when the "
            "cluster could not be asked."
        ),
    )


class DeployFacts(StrictModel):
    """What `make deploy` learns from AWS at deploy time and passes in; empty at offline synth."""

    deployer_principal: str | None = Field(
        default=None,
        description="IAM role (with its path) or user ARN of whoever runs `make deploy`.",
        pattern=IAM_PRINCIPAL_ARN.pattern,
    )
    deployer_cidr: str | None = Field(
        default=None, description="The public IPv4 address `make deploy` runs from, as a /32."
    )
    node_group_sizes: dict[NodeGroupName, NonNegativeInt] = Field(
        default_factory=dict,
        description=(
            "The desired size each node group of the deployed stack has now (eks:DescribeNodegroup). A group "
            "listed here exists, so Cluster Autoscaler owns its size: the template leaves DesiredSize out "
            "(CloudFormation then changes nothing), unless the size is outside the new min_size..max_size."
        ),
    )
    kubernetes_version: str | None = Field(
        default=None,
        description=(
            "The Kubernetes minor the deployed control plane runs (eks:DescribeCluster, else the deployed "
            "template). A version moves one minor per deploy, the control plane before the node groups "
            "(config/upgrade.py)."
        ),
        pattern=r"^1\.\d+$",
    )
    node_group_versions: dict[NodeGroupName, Annotated[str, StringConstraints(pattern=r"^1\.\d+$")]] = Field(
        default_factory=dict,
        description=(
            "The Kubernetes minor each deployed node group runs (eks:DescribeNodegroup, else the deployed "
            "template): one group moves per deploy, after the control plane."
        ),
    )
    addon_versions: dict[str, str] = Field(
        default_factory=dict,
        description=(
            "The version each EKS managed add-on runs (eks:DescribeAddon, else the deployed template's): the "
            "pins in config/versions.py are floors, so an add-on that runs a newer version keeps it."
        ),
    )
    node_ami_releases: dict[NodeGroupName, Annotated[str, StringConstraints(pattern=r"^1\.\d+\.\d+-\d{8}$")]] = Field(
        default_factory=dict,
        description=(
            "The AMI release each node group runs (eks:DescribeNodegroup releaseVersion, else the deployed "
            "template's ReleaseVersion): a group that runs a newer release than the pin keeps it."
        ),
    )
    ami_release_unpinned: list[NodeGroupName] = Field(
        default_factory=list,
        description=(
            "Node groups the deployed template creates without ReleaseVersion: the property is added only when "
            "the group's release moves, never at the release it already runs."
        ),
    )
    worker_replicas: dict[Literal["prefill", "decode"], NonNegativeInt] = Field(
        default_factory=dict,
        description=(
            "The worker replicas each phase of the serving RayCluster has now (Ray's autoscaler's, read with "
            "kubectl). The RayService's worker groups start at them, within min..max, so a NewCluster upgrade "
            "builds the new cluster at the size that serves, not at the config's; KubeRay's cluster hash "
            "leaves replicas out, so this never starts an upgrade itself."
        ),
    )
    replaced_node_groups: list[NodeGroupName] = Field(
        default_factory=list,
        description=(
            "Node groups this deploy replaces (the CDK CLI's diff says so): a new group must be created with a "
            "size, and it starts at the old group's, so the phase keeps its capacity."
        ),
    )
    access_entry_ids: dict[str, str] = Field(
        default_factory=dict,
        description=(
            "Principal ARN -> logical id of its access entry in the deployed template. An entry keeps its "
            "logical id for as long as its principal is an admin, so removing another principal never moves it "
            "(CloudFormation would create the moved entry first, and EKS refuses a second entry for a principal)."
        ),
    )
    cluster_has_bootstrap_admin: bool = Field(
        default=False,
        description=(
            "The deployed cluster was created without BootstrapClusterCreatorAdminPermissions false, so its "
            "creator (the CloudFormation execution role) holds a cluster-admin access entry. The property can only "
            "be set at creation: the template keeps leaving it out rather than replace the cluster."
        ),
    )
    placement_group_tags: dict[str, str] | None = Field(
        default=None,
        description=(
            "The tags the deployed GPU placement group carries (an earlier release tagged it). Its tags cannot "
            "change without replacing it, and every GPU node with it: they are kept as they are."
        ),
    )
    gcs_store: DeployedGcsStore | None = Field(
        default=None,
        description=(
            "The GCS store of the deployed template. ElastiCache turns automatic failover on only once a "
            "replica exists, and removes the last replica only once failover is off: the stack steps through "
            "two nodes without failover, one deploy at a time. While the deployed RayService keeps its GCS in "
            "the store, turning fault tolerance off keeps the store for one more deploy."
        ),
    )
    store_token: DeployedStoreToken | None = Field(
        default=None,
        description=(
            "The GCS store's AUTH token as it stands (the guard, the deployed template and kubectl): its rotation "
            "moves one step per deploy."
        ),
    )
    secrets_store_in_use: bool = Field(
        default=False,
        description=(
            "The deployed RayService's pods mount volumes through the Secrets Store CSI driver: its charts stay "
            "for this deploy even when nothing new needs them, so that the serving pods' volumes can unmount."
        ),
    )
    adopted_log_groups: list[str] = Field(
        default_factory=list,
        description=(
            "Container Insights log groups that exist outside the deployed stack (the running add-on's agents "
            "made them, and recreate one within seconds of its deletion): this deploy imports them as they are "
            "(cdk deploy --import-existing-resources); the next one encrypts them, sets their retention and lets "
            "destroy delete them."
        ),
    )
    hf_token_kms_key_arn: str | None = Field(
        default=None,
        description=(
            "The customer-managed KMS key the gated model's token secret is encrypted with "
            "(secretsmanager:DescribeSecret); the GPU workers' role may then decrypt with it through Secrets Manager."
        ),
        pattern=KMS_KEY_ARN,
    )
    api_key_kms_key_arns: list[Annotated[str, StringConstraints(pattern=KMS_KEY_ARN)]] = Field(
        default_factory=list,
        description=(
            "The customer-managed KMS keys the endpoint's API key secrets are encrypted with "
            "(secretsmanager:DescribeSecret); the GPU workers' role may then decrypt with them through Secrets Manager."
        ),
    )

    @field_validator("deployer_cidr")
    @classmethod
    def _single_address(cls, value: str | None) -> str | None:
        if value is not None and ipaddress.IPv4Network(value).prefixlen != 32:
            raise ValueError(f"deployer_cidr {value} is not a single IPv4 address (/32)")
        return value
