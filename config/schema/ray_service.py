"""The RayService that runs the serving app: its name, image, rollout, head pod and endpoint."""

from __future__ import annotations

import re
from typing import Literal

from pydantic import Field, field_validator, model_validator

from config import catalog, versions
from config.schema.base import StrictModel, check_cidrs, dns_label
from kuberay.apimachinery import dns1035_label_errors
from kuberay.rules import MAX_RAY_SERVICE_NAME_LENGTH
from serve_app.spec import secret_reference_problem

VERSIONED_TAG = re.compile(r"(^|[^0-9])v?\d+\.\d+(\.\d+)?([^0-9]|$)")
# The shapes API keys come in (OpenAI's sk-…, a long unbroken run of base64 or hex), which a secret's
# name, made of words and separators, has no reason to take: such a value is a key pasted in place of
# the name. (`make deploy`'s guard also finds that a named secret does not exist.)
LOOKS_LIKE_A_KEY = re.compile(r"^(sk-\S{8,}|[A-Za-z0-9+=]{32,})$")
# Enough to rotate: the key in use and its successor, with room for a client that moves late.
MAX_API_KEY_SECRETS = 4


class HeadResources(StrictModel):
    # The head serves no requests and hosts no replica (num-cpus 0, out of the serve Service). What
    # it still runs: the GCS, the raylet, the dashboard and its agents, the Serve controller, an idle
    # Serve proxy (Ray starts one on the controller's node whatever proxy_location says) and Serve's
    # build_serve_application task (num_cpus=0, so it lands beside the controller), which imports
    # vLLM and torch to build the P/D graph: about 1 GiB steady, 3-4 GiB while a config deploys.
    # KubeRay's autoscaler runs in its own sidecar container with its own 500m / 512Mi.
    cpu: str = Field(
        default="2",
        description=(
            "CPU request (and limit) of the Ray head pod: the GCS, dashboard and Serve controller need well "
            "under one core; the second absorbs a config deploy's app build."
        ),
    )
    memory: str = Field(
        default="8Gi",
        description=(
            "Memory request (and limit) of the Ray head pod: about 1 GiB steady, 3-4 GiB while Serve builds "
            "the app (vLLM imported); 8Gi keeps an out-of-memory kill, a head restart, far away."
        ),
    )


class GcsStoreConfig(StrictModel):
    """The Amazon ElastiCache (Valkey) replication group the stack provisions for the GCS."""

    node_type: str = Field(
        default="cache.t4g.small",
        description=(
            "ElastiCache node type (config/catalog.py CACHE_NODES, with prices). The GCS keeps cluster "
            "metadata only (actors, placement groups, Serve's checkpoints): megabytes, so the smallest "
            "burstable nodes are enough."
        ),
    )
    multi_az: bool | None = Field(
        default=None,
        description=(
            "A replica in a second availability zone with automatic failover (twice the node price). "
            "Left empty: on in production, a single node elsewhere."
        ),
    )
    auth_token_generation: int = Field(
        default=1,
        ge=1,
        description=(
            "Raise by one to rotate the store's AUTH token. `make deploy` then takes ElastiCache's steps, one "
            "per deploy, and `make preview` says which comes next: ROTATE (a new token beside the old, both "
            "accepted, the new one in the secret); once every mount of the secret holds it, a NewCluster "
            "upgrade whose head starts with it; once the old RayCluster is gone, SET (the old token refused). "
            "The serving GCS stays up throughout (config/token_rotation.py)."
        ),
    )

    @field_validator("node_type")
    @classmethod
    def _known_node_type(cls, value: str) -> str:
        if value not in catalog.CACHE_NODES:
            raise ValueError(
                f"{value!r} is not in config/catalog.py CACHE_NODES; use one of {', '.join(sorted(catalog.CACHE_NODES))}"
            )
        return value


class GcsFaultToleranceConfig(StrictModel):
    """KubeRay's GCS fault tolerance: the GCS keeps its state in an external store, so a head restart
    keeps the workers and their replicas."""

    enabled: bool | None = Field(
        default=None,
        description=(
            "Keep the GCS's state in an ElastiCache store the stack provisions, so a head restart (OOM, node "
            "loss, upgrade) keeps every worker and replica. Left empty: on in production, off elsewhere."
        ),
    )
    store: GcsStoreConfig | None = Field(
        default_factory=GcsStoreConfig,
        description="The store the stack provisions for it (required when fault tolerance is on).",
    )


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
    api_key_secrets: list[str] = Field(
        default_factory=list,
        max_length=MAX_API_KEY_SECRETS,
        description=(
            "Secrets Manager secrets (names in aws.region, or complete ARNs) that each hold one API key for "
            "the OpenAI endpoint: a request without `Authorization: Bearer <one of them>` gets HTTP 401. "
            "The GPU workers mount them through the CSI driver, read with their own Pod Identity role; no "
            "value is ever in the config, a template or the Serve config. Several at once rotate a key: add "
            "the new secret, deploy, move the clients, remove the old one, deploy. Empty: no key is asked for, "
            "which with internal_nlb needs open_to_vpc_without_key."
        ),
    )
    cache_isolation: Literal["per_key", "shared"] = Field(
        default="per_key",
        description=(
            "With api_key_secrets: per_key gives each key its own prefix cache (the ingress sets vLLM's "
            "cache_salt from the key, under a secret the stack generates), so no key holder can time whether "
            "another key's prompts are cached (vLLM's CVE-2025-46570). shared lets every key hit every "
            "prefix, for keys that are all one tenant's (a shared system prompt is then computed once for "
            "all). Without api_key_secrets there is one tenant, and the cache is shared."
        ),
    )
    open_to_vpc_without_key: bool = Field(
        default=False,
        description=(
            "With internal_nlb and no api_key_secrets, serve the endpoint to every address in the VPC without "
            "asking for a key, on purpose: the NLB shares the pods' subnets, so no network policy can keep a "
            "pod of any namespace from Serve's port. Without it, such a config is refused."
        ),
    )

    @model_validator(mode="after")
    def _cidrs(self) -> EndpointExposure:
        check_cidrs(self.allowed_cidrs, example="10.0.0.0/8", prefix="allowed_cidrs: ")
        if self.internal_nlb and not self.allowed_cidrs:
            raise ValueError("internal_nlb is on but allowed_cidrs is empty; list the CIDRs that may call the endpoint")
        if self.internal_nlb and not self.api_key_secrets and not self.open_to_vpc_without_key:
            raise ValueError(
                "internal_nlb is on without api_key_secrets, so any pod in the VPC could call the GPUs; name a key's "
                "secret in api_key_secrets, or set open_to_vpc_without_key: true to serve the VPC without a key"
            )
        if self.open_to_vpc_without_key and self.api_key_secrets:
            raise ValueError("open_to_vpc_without_key is set but api_key_secrets asks for a key; remove one of the two")
        return self

    @field_validator("api_key_secrets")
    @classmethod
    def _secret_references(cls, values: list[str]) -> list[str]:
        for index, value in enumerate(values):
            field = f"entry {index}"
            if LOOKS_LIKE_A_KEY.match(value):
                raise ValueError(
                    f"{field} looks like an API key, not the name of a secret: a key never goes into the config; "
                    "put it in Secrets Manager (`aws secretsmanager create-secret --name NAME --secret-string …`) "
                    "and name the secret here"
                )
            problem = secret_reference_problem(field, value)
            if problem:
                raise ValueError(problem)
        if len(set(values)) != len(values):
            raise ValueError("a secret is named twice; list each once")
        return values


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
            "Serving image with Ray, vLLM, NIXL and the EFA userspace; `{registry}` is replaced by aws.region's "
            "AWS Deep Learning Containers registry (its account differs in opt-in regions: config/versions.py "
            "DLC_REGISTRY_ACCOUNTS), `{region}` by aws.region. Must carry a version tag or a digest. An image "
            "config/versions.py does not know (SERVING_IMAGES) needs image_python_version, image_ca_bundle and "
            "image_wheel_platform."
        ),
    )
    # What the stack must know of the image and cannot ask it at synth: config/versions.py's SERVING_IMAGES
    # says for the images it knows; for any other image these say, all three.
    image_python_version: str | None = Field(
        default=None,
        description=(
            "The image's Python, major.minor (e.g. 3.13): the model streamer's wheels are fetched for it. "
            "Needed for an image config/versions.py does not know; otherwise its table says."
        ),
        pattern=r"^3\.\d+$",
    )
    image_ca_bundle: str | None = Field(
        default=None,
        description=(
            "Path of the image OS's CA bundle (Amazon Linux, RHEL: /etc/pki/tls/certs/ca-bundle.crt; Debian, "
            "Ubuntu: /etc/ssl/certs/ca-certificates.crt): the GCS verifies the store's TLS certificate with it. "
            "Needed for an image config/versions.py does not know; otherwise its table says."
        ),
        pattern=r"^/",
    )
    image_wheel_platform: str | None = Field(
        default=None,
        description=(
            "pip's platform tag for the image's C library (e.g. manylinux_2_34_x86_64 for glibc 2.34): the model "
            "streamer's wheels are fetched for it. Needed for an image config/versions.py does not know; "
            "otherwise its table says."
        ),
        pattern=r"^manylinux_\d+_\d+_(x86_64|aarch64)$",
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
    cluster_deletion_delay_seconds: int | None = Field(
        default=None,
        ge=0,
        le=3600,
        description=(
            "After a NewCluster switch, how long the old RayCluster lives on to finish the requests it already "
            "has (KubeRay's rayClusterDeletionDelaySeconds). Left empty: serving.request_timeout_s plus 60 s. "
            "Shorter than the request timeout is refused: a generation Serve still allows would be cut when "
            "the old cluster goes."
        ),
    )
    auth_token_generation: int = Field(
        default=1,
        ge=1,
        description=(
            "Ray's token authentication is always on (KubeRay's authOptions, mode token): KubeRay makes a "
            "random token for each RayCluster, in a Secret the cluster owns, and every Ray process, the "
            "autoscaler and KubeRay's own calls to the dashboard use it. Raise this number to rotate the "
            "token: it goes onto every pod template, so the next deploy is a NewCluster upgrade, with a new "
            "cluster and a new token, and the old one goes with the old cluster."
        ),
    )
    head: HeadResources = Field(default_factory=HeadResources, description="Ray head pod size.")
    gcs_fault_tolerance: GcsFaultToleranceConfig = Field(
        default_factory=GcsFaultToleranceConfig,
        description="GCS fault tolerance with an external store (KubeRay's gcsFaultToleranceOptions).",
    )
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

    @model_validator(mode="after")
    def _image_known_or_described(self) -> RayServiceConfig:
        stated = {
            "image_python_version": self.image_python_version,
            "image_ca_bundle": self.image_ca_bundle,
            "image_wheel_platform": self.image_wheel_platform,
        }
        missing = [name for name, value in stated.items() if value is None]
        if missing and versions.known_image(self.image) is None:
            raise ValueError(
                f"image {self.image!r} is not one config/versions.py knows (SERVING_IMAGES: "
                f"{', '.join(versions.SERVING_IMAGES)}): set ray_service.{', '.join(missing)} for it, or use a known image"
            )
        return self

    def serving_image_facts(self) -> versions.ServingImageFacts:
        """The image's facts: those the config states, the rest from config/versions.py's table."""
        known = versions.known_image(self.image)
        return versions.ServingImageFacts(
            python_version=self.image_python_version or (known.python_version if known else ""),
            ca_bundle=self.image_ca_bundle or (known.ca_bundle if known else ""),
            wheel_platform=self.image_wheel_platform or (known.wheel_platform if known else ""),
        )

    def image_for(self, region: str) -> str:
        registry = versions.dlc_registry(region)
        image = self.image.replace(versions.REGISTRY_PLACEHOLDER, registry) if registry else self.image
        return image.replace("{region}", region)
