"""The rules that span sections of :class:`AppConfig`, each a plain function of the whole config.

A rule returns what is wrong as one actionable line (the field, the problem, the fix), or None.
:data:`RULES` lists them in the order AppConfig applies them; the first problem stops validation, so
the order decides which message a config with several problems gets.
"""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Callable
from typing import TYPE_CHECKING

from config import catalog, versions
from config.schema.mirror import s3_bucket_name_problem
from config.schema.observability import AMP_MIN_SCRAPE_INTERVAL
from serve_app.spec import PHASES, REQUEST_ROUTER_RAY_CLASS, REQUEST_ROUTER_SINCE_RAY

if TYPE_CHECKING:
    from config.schema.app import AppConfig


def zones_in_region(config: AppConfig) -> str | None:
    """network.availability_zones must be zones of aws.region."""
    region = config.aws.region
    foreign = [az for az in config.network.availability_zones if not az.startswith(region)]
    if foreign:
        return (
            f"network.availability_zones {foreign} are not in aws.region {region}; use "
            f"zones such as {region}a, {region}b"
        )
    return None


# A registry host in ECR's own form: <account>.dkr.ecr.<region>.amazonaws.com[.cn]
ECR_HOST = re.compile(r"^(\d{12})\.dkr\.ecr\.")


def image_registry_in_region(config: AppConfig) -> str | None:
    """The serving image comes from aws.region's own Deep Learning Containers registry: opt-in regions
    serve the DLCs from accounts of their own, and a region without one has no copy of the image."""
    region, image = config.aws.region, config.ray_service.image
    registry = versions.dlc_registry(region)
    if versions.REGISTRY_PLACEHOLDER in image and registry is None:
        return (
            f"aws.region {region} has no AWS Deep Learning Containers registry (config/versions.py "
            "DLC_REGISTRY_ACCOUNTS, from aws/deep-learning-containers): deploy in a region that has one, or set "
            "ray_service.image to a copy of the image in a registry of yours"
        )
    found = ECR_HOST.match(image)
    dlc_accounts = set(versions.DLC_REGISTRY_ACCOUNTS.values())
    if found and found.group(1) in dlc_accounts and found.group(1) != versions.DLC_REGISTRY_ACCOUNTS.get(region):
        serves = versions.DLC_REGISTRY_ACCOUNTS.get(region)
        where = f"serves them from {serves}" if serves else "has no Deep Learning Containers registry"
        return (
            f"ray_service.image names the Deep Learning Containers registry of account {found.group(1)}, but aws.region "
            f"{region} {where}: write {versions.REGISTRY_PLACEHOLDER} for the registry host (the default image does)"
        )
    return None


def production_endpoint(config: AppConfig) -> str | None:
    """A production environment's public API endpoint is not open to the whole internet."""
    endpoint = config.cluster.endpoint
    if (
        config.production
        and endpoint.public
        and any(ipaddress.ip_network(c).prefixlen == 0 for c in endpoint.public_cidrs)
    ):
        return (
            "cluster.endpoint.public_cidrs contains 0.0.0.0/0 in a production environment; "
            "list your own CIDRs or set cluster.endpoint.public: false"
        )
    return None


def egress_for_charts_and_images(config: AppConfig) -> str | None:
    """The cluster needs a NAT gateway: charts and images come from outside the VPC endpoints' reach."""
    if config.network.nat_gateways == 0:
        # No VPC endpoint reaches public Helm repositories (github.io) or registries outside the
        # region's ECR (nvcr.io, quay.io, registry.k8s.io, another region's ECR).
        return (
            "network.nat_gateways is 0, but the Helm charts come from public chart repositories and the "
            "device plugins' and KubeRay's images from nvcr.io, quay.io and other regions' ECR, which no VPC "
            "endpoint reaches; set nat_gateways: 1"
        )
    return None


def s3_source_in_region(config: AppConfig) -> str | None:
    """An S3 model source other than the stack's mirror names its region, and it is aws.region."""
    model = config.serving.model
    if not model.is_s3:
        return None
    bucket = model.source.removeprefix("s3://").split("/", 1)[0]
    if config.model_mirror.enabled and bucket == config.mirror_bucket:
        return None
    if model.source_region is None:
        return (
            f"serving.model.source_region: required for an S3 source other than the stack's mirror ({bucket}): "
            f"an s3:// URI carries no region; set it (it must be {config.aws.region})"
        )
    if model.source_region != config.aws.region:
        return (
            f"serving.model.source {model.source} is in {model.source_region}, not {config.aws.region}: every new "
            f"replica would pull the weights across regions (slow, paid per GB); mirror the model into "
            f"{config.aws.region} (model_mirror, make mirror-model)"
        )
    return None


def mirror_name(config: AppConfig) -> str | None:
    """The mirror bucket's derived name (when bucket_name is left empty) is one S3 accepts."""
    if config.model_mirror.enabled and config.model_mirror.bucket_name is None:
        problem = s3_bucket_name_problem(config.mirror_bucket)
        if problem:
            return (
                f"model_mirror.bucket_name: the derived name {config.mirror_bucket!r} is one S3 refuses ({problem}); "
                "set model_mirror.bucket_name"
            )
    return None


def surge_needs_ray_2_60(config: AppConfig) -> str | None:
    """serving.<phase>.max_surge_percent only takes effect from Ray 2.60 on."""
    ray_version = tuple(int(p) for p in re.findall(r"\d+", config.ray_service.ray_version)[:2])
    for phase in ("prefill", "decode", "colocated"):
        if config.serving.phase(phase).max_surge_percent is not None and ray_version < (2, 60):
            return (
                f"serving.{phase}.max_surge_percent needs Ray 2.60 or newer (Serve starts replacements before it "
                f"stops old replicas from 2.60 on; 2.58 silently ignores the key), but ray_service.ray_version is "
                f"{config.ray_service.ray_version}: remove it, or use an image with Ray 2.60+ and set ray_version"
            )
    return None


def router_in_the_images_ray(config: AppConfig) -> str | None:
    """serving.<phase>.request_router names a router class the image's Ray ships."""
    ray_version = tuple(int(p) for p in re.findall(r"\d+", config.ray_service.ray_version)[:2])
    for phase in ("prefill", "decode", "colocated"):
        router = config.serving.phase(phase).request_router
        since = REQUEST_ROUTER_SINCE_RAY.get(router)
        if since and ray_version < since:
            oldest = ".".join(map(str, since))
            return (
                f"serving.{phase}.request_router {router} needs Ray {oldest} or newer (Ray Serve's "
                f"{REQUEST_ROUTER_RAY_CLASS[router]}), but ray_service.ray_version is {config.ray_service.ray_version}: "
                f"use power_of_two, or an image with Ray {oldest}+ and set ray_version"
            )
    return None


def token_secret_in_region(config: AppConfig) -> str | None:
    """A Hugging Face token secret given as an ARN lives in aws.region, where the pods read it."""
    secret = config.serving.model.hf_token_secret
    if secret and secret.startswith("arn:"):
        region = secret.split(":")[3]
        if region != config.aws.region:
            return (
                f"serving.model.hf_token_secret {secret} is in {region}; the pods read it in {config.aws.region}: "
                f"use a secret in {config.aws.region} (or a replica of it there)"
            )
    return None


def api_key_secrets_in_region(config: AppConfig) -> str | None:
    """API key secrets given as ARNs live in aws.region, where the GPU workers mount them."""
    for index, secret in enumerate(config.ray_service.endpoint.api_key_secrets):
        region = secret.split(":")[3] if secret.startswith("arn:") else config.aws.region
        if region != config.aws.region:
            return (
                f"ray_service.endpoint.api_key_secrets[{index}] {secret} is in {region}; the pods read it in "
                f"{config.aws.region}: use a secret in {config.aws.region} (or a replica of it there)"
            )
    return None


def amp_scrape_interval(config: AppConfig) -> str | None:
    """Amazon Managed Prometheus scrapers take no interval under AMP_MIN_SCRAPE_INTERVAL."""
    observability = config.observability
    if observability.backend == "amp" and observability.scrape_interval_seconds < AMP_MIN_SCRAPE_INTERVAL:
        return (
            f"observability.scrape_interval_seconds={observability.scrape_interval_seconds}, but Amazon Managed "
            f"Prometheus scrapers refuse intervals under {AMP_MIN_SCRAPE_INTERVAL} s; use 30 or 60"
        )
    return None


def serving_fits_node_groups(config: AppConfig) -> str | None:
    """The serving spec runs on the GPU node groups: CUDA, enough GPUs per engine, RDMA for GPU
    KV buffers, and room for max_replicas."""
    serving = config.serving
    if serving.device != "cuda":
        return "serving.device is cpu, which only `make local` runs; the cluster needs device: cuda"
    groups = config.cluster.gpu_node_groups
    phases = PHASES if serving.mode == "disaggregated" else ("colocated",)
    for phase in phases:
        spec = serving.phase(phase)
        nodes = [getattr(groups, p) for p in (PHASES if phase == "colocated" else (phase,))]
        for group in nodes:
            facts = catalog.INSTANCES[group.instance_type]
            if spec.tensor_parallel_size > facts.gpu_count:
                return (
                    f"serving.{phase}.tensor_parallel_size={spec.tensor_parallel_size} needs more "
                    f"GPUs than {group.instance_type} has ({facts.gpu_count}); lower it or use a "
                    "larger instance type"
                )
            if serving.kv_transfer.buffer_device == "cuda" and not facts.gpudirect_rdma:
                return (
                    f"serving.kv_transfer.buffer_device is cuda but {group.instance_type} has no "
                    "GPUDirect RDMA; set buffer_device: cpu (KV staged in host memory)"
                )
        capacity = sum(
            g.max_size * catalog.replicas_per_node(g.instance_type, spec.tensor_parallel_size, spec.gpu_fraction)
            for g in nodes
        )
        if spec.max_replicas > capacity:
            return (
                f"serving.{phase}.max_replicas={spec.max_replicas} can never be scheduled: the "
                f"node group holds at most {capacity} replicas of TP {spec.tensor_parallel_size}; "
                "lower max_replicas or raise the node group's max_size"
            )
    return None


def gcs_fault_tolerance_has_a_store(config: AppConfig) -> str | None:
    """GCS fault tolerance needs the store the stack provisions (KubeRay's embedded RocksDB backend sits
    behind a feature gate that is off in KubeRay 1.7.0)."""
    ft = config.ray_service.gcs_fault_tolerance
    if config.gcs_fault_tolerant and ft.store is None:
        why = "the default in production" if ft.enabled is None else "enabled: true"
        return (
            f"ray_service.gcs_fault_tolerance.store is empty, but fault tolerance is on ({why}): the GCS needs "
            "a store to keep its state in; set store (for example {node_type: cache.t4g.small}) or enabled: false"
        )
    return None


Rule = Callable[["AppConfig"], "str | None"]


# The order AppConfig applies them in (the order they were written in as its validators).
def deletion_delay_outlives_requests(config: AppConfig) -> str | None:
    """The old cluster of a NewCluster upgrade lives at least as long as a request may take."""
    delay, timeout = config.ray_service.cluster_deletion_delay_seconds, config.serving.request_timeout_s
    if delay is not None and delay < timeout:
        return (
            f"ray_service.cluster_deletion_delay_seconds is {delay}, shorter than serving.request_timeout_s "
            f"({timeout:g}): a NewCluster upgrade would cut requests Serve still allows when it deletes the old "
            f"cluster; set it to at least {timeout:g}, or leave it out ({timeout:g} + 60)"
        )
    return None


RULES: tuple[Rule, ...] = (
    zones_in_region,
    image_registry_in_region,
    production_endpoint,
    egress_for_charts_and_images,
    s3_source_in_region,
    mirror_name,
    surge_needs_ray_2_60,
    router_in_the_images_ray,
    token_secret_in_region,
    api_key_secrets_in_region,
    amp_scrape_interval,
    deletion_delay_outlives_requests,
    gcs_fault_tolerance_has_a_store,
    serving_fits_node_groups,
)


def first_problem(config: AppConfig) -> str | None:
    """The problem of the first rule in :data:`RULES` that ``config`` breaks, or None."""
    for rule in RULES:
        problem = rule(config)
        if problem:
            return problem
    return None
