"""The RayService that runs the serving app: its name, image, rollout, head pod and endpoint."""

from __future__ import annotations

import re
from typing import Literal

from pydantic import Field, field_validator, model_validator

from config import versions
from config.schema.base import StrictModel, check_cidrs, dns_label
from kuberay.apimachinery import dns1035_label_errors
from kuberay.rules import MAX_RAY_SERVICE_NAME_LENGTH

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
        check_cidrs(self.allowed_cidrs, example="10.0.0.0/8", prefix="allowed_cidrs: ")
        if self.internal_nlb and not self.allowed_cidrs:
            raise ValueError("internal_nlb is on but allowed_cidrs is empty; list the CIDRs that may call the endpoint")
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
    endpoint: EndpointExposure = Field(default_factory=EndpointExposure, description="How clients reach the endpoint.")

    @field_validator("namespace")
    @classmethod
    def _label(cls, value: str) -> str:
        return dns_label(value)

    @field_validator("name")
    @classmethod
    def _kuberay_name(cls, value: str) -> str:
        # KubeRay's ValidateRayServiceMetadata: a DNS-1035 label of at most 47 characters (its
        # RayCluster gets a 6-character suffix and its Service "-serve-svc" on top).
        if len(value) > MAX_RAY_SERVICE_NAME_LENGTH or dns1035_label_errors(value):
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
