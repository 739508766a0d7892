"""The typed configuration of one environment.

One YAML file per environment under ``config/`` is loaded into :class:`AppConfig`. Every model is
frozen and rejects unknown keys, so a typo fails synth instead of being silently ignored.
Cross-field rules that would otherwise surface twenty minutes into ``cdk deploy`` live here.

One module per section: ``base`` (the strict model and shared types), ``deploy`` (target account
and region, what `make deploy` resolves), ``network``, ``cluster`` (endpoint, node groups,
autoscaling, add-ons, chart versions), ``ray_service``, ``mirror``, ``planner``, ``observability``,
``app`` (:class:`AppConfig`) and ``rules`` (its cross-field rules, in the order they apply).
Everything is imported from here: ``from config.schema import AppConfig``.
"""

from config.schema.app import AppConfig
from config.schema.base import (
    ADDON_VERSION,
    DNS_1123_LABEL,
    IAM_PRINCIPAL_ARN,
    LogRetentionDays,
    StrictModel,
    check_cidrs,
    dns_label,
)
from config.schema.cluster import (
    AutoscalingConfig,
    ChartVersions,
    ClusterConfig,
    EndpointAccessConfig,
    GpuNodeGroupConfig,
    GpuNodeGroups,
    NodeGroupSizing,
    RootVolume,
    SystemNodeGroupConfig,
)
from config.schema.deploy import (
    PLACEHOLDER_ACCOUNT,
    UNRESOLVED_DEPLOYER_CIDR,
    AwsTarget,
    DeployedGcsStore,
    DeployedStoreToken,
    DeployFacts,
    NodeGroupName,
)
from config.schema.mirror import S3_BUCKET_NAME, ModelMirrorConfig, s3_bucket_name_problem
from config.schema.network import NetworkConfig
from config.schema.observability import (
    AMP_MIN_SCRAPE_INTERVAL,
    SCRAPE_INTERVALS,
    WORKSPACE_ARN,
    ObservabilityConfig,
)
from config.schema.planner import PlannerSettings
from config.schema.ray_service import (
    VERSIONED_TAG,
    EndpointExposure,
    GcsFaultToleranceConfig,
    GcsStoreConfig,
    HeadResources,
    RayServiceConfig,
)

__all__ = [
    "ADDON_VERSION",
    "AMP_MIN_SCRAPE_INTERVAL",
    "DNS_1123_LABEL",
    "IAM_PRINCIPAL_ARN",
    "PLACEHOLDER_ACCOUNT",
    "S3_BUCKET_NAME",
    "SCRAPE_INTERVALS",
    "UNRESOLVED_DEPLOYER_CIDR",
    "VERSIONED_TAG",
    "WORKSPACE_ARN",
    "AppConfig",
    "AutoscalingConfig",
    "AwsTarget",
    "ChartVersions",
    "ClusterConfig",
    "DeployFacts",
    "DeployedGcsStore",
    "DeployedStoreToken",
    "NodeGroupName",
    "EndpointAccessConfig",
    "EndpointExposure",
    "GcsFaultToleranceConfig",
    "GcsStoreConfig",
    "GpuNodeGroupConfig",
    "GpuNodeGroups",
    "HeadResources",
    "LogRetentionDays",
    "ModelMirrorConfig",
    "NetworkConfig",
    "NodeGroupSizing",
    "ObservabilityConfig",
    "PlannerSettings",
    "RayServiceConfig",
    "RootVolume",
    "StrictModel",
    "SystemNodeGroupConfig",
    "check_cidrs",
    "dns_label",
    "s3_bucket_name_problem",
]
