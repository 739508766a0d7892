"""Where the serving metrics go: CloudWatch Container Insights, Amazon Managed Prometheus, or nowhere."""

from __future__ import annotations

import re
from typing import Literal

from pydantic import Field, field_validator, model_validator

from config.schema.base import ADDON_VERSION, LogRetentionDays, StrictModel

# Scrapes must divide a CloudWatch minute so that a dashboard's per-minute sum of a gauge can be
# turned back into one reading (sum / scrapes per minute).
SCRAPE_INTERVALS = (10, 15, 20, 30, 60)
# AMP user guide, "Scraper limitations": a managed scraper refuses scrape intervals under 30 s.
AMP_MIN_SCRAPE_INTERVAL = 30
WORKSPACE_ARN = re.compile(r"^arn:aws[a-z-]*:aps:[a-z0-9-]+:\d{12}:workspace/ws-[0-9a-f-]+$")


class ObservabilityConfig(StrictModel):
    backend: Literal["none", "cloudwatch", "amp"] = Field(
        # amp by default: only it keeps the latency histograms (TTFT, TPOT, KV transfer time).
        default="amp",
        description=(
            "Where Ray's and vLLM's Prometheus metrics go. cloudwatch: the Container Insights "
            "add-on's agent scrapes them into CloudWatch (gauges and counters only: the agent drops "
            "Prometheus histograms, so no TTFT/TPOT/NIXL percentiles). amp: an Amazon Managed "
            "Prometheus scraper keeps everything, with a Grafana dashboard in the repository. "
            "none: nothing is collected."
        ),
    )
    scrape_interval_seconds: int = Field(
        default=30,
        description=(
            f"Seconds between scrapes of every Ray pod; one of {', '.join(map(str, SCRAPE_INTERVALS))} "
            f"(with backend amp at least {AMP_MIN_SCRAPE_INTERVAL}: managed scrapers refuse shorter intervals)."
        ),
    )
    log_retention_days: LogRetentionDays = Field(
        default=30,
        description=(
            "Days to keep the log group this backend writes to (the agent's Prometheus EMF events, "
            "or the AMP scraper's own logs)."
        ),
    )
    amp_workspace_arn: str | None = Field(
        default=None,
        description=(
            "Existing Amazon Managed Prometheus workspace to write into (backend amp only); "
            "left empty, the stack creates one."
        ),
    )
    cloudwatch_addon_version: str | None = Field(
        default=None,
        description=(
            "Version of the amazon-cloudwatch-observability add-on, for example v4.5.0-eksbuild.1; "
            "left empty, EKS installs its default for the cluster's Kubernetes version."
        ),
    )

    @field_validator("scrape_interval_seconds")
    @classmethod
    def _interval(cls, value: int) -> int:
        if value not in SCRAPE_INTERVALS:
            raise ValueError(
                f"scrape_interval_seconds={value} does not divide a CloudWatch minute evenly; use one of "
                f"{', '.join(map(str, SCRAPE_INTERVALS))}"
            )
        return value

    @field_validator("amp_workspace_arn")
    @classmethod
    def _workspace_arn(cls, value: str | None) -> str | None:
        if value is not None and not WORKSPACE_ARN.match(value):
            raise ValueError(
                f"amp_workspace_arn {value!r} is not a workspace ARN such as "
                "arn:aws:aps:us-east-2:123456789012:workspace/ws-0123abcd-4567-89ef-0123-456789abcdef; "
                "copy it from `aws amp list-workspaces` or leave it empty to create one"
            )
        return value

    @field_validator("cloudwatch_addon_version")
    @classmethod
    def _addon_version(cls, value: str | None) -> str | None:
        if value is not None and not ADDON_VERSION.match(value):
            raise ValueError(
                f"cloudwatch_addon_version {value!r} is not an EKS add-on version such as "
                "v4.5.0-eksbuild.1; list them with `aws eks describe-addon-versions "
                "--addon-name amazon-cloudwatch-observability`"
            )
        return value

    @model_validator(mode="after")
    def _backend_fields(self) -> ObservabilityConfig:
        if self.amp_workspace_arn and self.backend != "amp":
            raise ValueError(
                f"amp_workspace_arn is set but backend is {self.backend}; set backend: amp or remove amp_workspace_arn"
            )
        if self.cloudwatch_addon_version and self.backend != "cloudwatch":
            raise ValueError(
                f"cloudwatch_addon_version is set but backend is {self.backend}; set backend: "
                "cloudwatch or remove cloudwatch_addon_version"
            )
        return self
