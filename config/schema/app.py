"""The whole configuration of one environment: every section, and the rules that span them."""

from __future__ import annotations

from pydantic import Field, field_validator, model_validator

from config.schema import rules
from config.schema.base import StrictModel, dns_label
from config.schema.cluster import ChartVersions, ClusterConfig
from config.schema.deploy import AwsTarget
from config.schema.mirror import ModelMirrorConfig
from config.schema.network import NetworkConfig
from config.schema.observability import ObservabilityConfig
from config.schema.planner import PlannerSettings
from config.schema.ray_service import RayServiceConfig
from serve_app.spec import ServingSpec

# How long past the request timeout the old cluster of a NewCluster upgrade lives by default: its
# last requests end with the timeout, and their responses still have to leave.
DELETION_DELAY_MARGIN_S = 60


class AppConfig(StrictModel):
    name: str = Field(description=("Short DNS-1123 name of the deployment; prefixes the stack and the cluster name."))
    production: bool = Field(description="Marks a production environment; stricter checks apply.", default=False)
    aws: AwsTarget = Field(description="Where the stack is deployed.")
    network: NetworkConfig = Field(description="VPC layout.")
    cluster: ClusterConfig = Field(description="EKS cluster and node groups.")
    charts: ChartVersions = Field(
        description="Helm chart versions (defaults pinned in config/versions.py).",
        default_factory=ChartVersions,
    )
    tags: dict[str, str] = Field(description="Tags applied to every taggable resource.", default_factory=dict)
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
    def _cross_field_rules(self) -> AppConfig:
        # config/schema/rules.py, in its fixed order: the first problem is the one reported.
        problem = rules.first_problem(self)
        if problem:
            raise ValueError(problem)
        return self

    @property
    def mirror_bucket(self) -> str:
        return self.model_mirror.bucket_name or f"{self.name}-models-{self.aws.account}-{self.aws.region}"

    @property
    def mirror_kept_on_destroy(self) -> bool:
        """model_mirror.keep_on_destroy, or, when unset, whether this is a production environment."""
        keep = self.model_mirror.keep_on_destroy
        return self.production if keep is None else keep

    @property
    def deletion_delay_seconds(self) -> int:
        """ray_service.cluster_deletion_delay_seconds, or, when unset, a minute past the request timeout."""
        delay = self.ray_service.cluster_deletion_delay_seconds
        return int(self.serving.request_timeout_s) + DELETION_DELAY_MARGIN_S if delay is None else delay

    @property
    def gcs_fault_tolerant(self) -> bool:
        """ray_service.gcs_fault_tolerance.enabled, or, when unset, whether this is a production environment."""
        enabled = self.ray_service.gcs_fault_tolerance.enabled
        return self.production if enabled is None else enabled

    @property
    def gcs_store_multi_az(self) -> bool:
        """The store's multi_az, or, when unset, whether this is a production environment (False without a store)."""
        store = self.ray_service.gcs_fault_tolerance.store
        if store is None:
            return False
        return self.production if store.multi_az is None else store.multi_az

    @property
    def stack_name(self) -> str:
        return f"{self.name}-pd-serving"

    @property
    def cluster_name(self) -> str:
        return self.name
