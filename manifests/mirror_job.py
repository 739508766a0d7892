"""The Kubernetes objects of a mirror run: the job script as a ConfigMap and the Job that runs it.

No CDK here: ``make mirror-model`` renders them from the config and applies them with kubectl.
"""

from __future__ import annotations

import shlex
from pathlib import Path
from typing import Any

from config.schema import AppConfig
from config.versions import (
    MIRROR_JOB_IMAGE,
    MIRROR_JOB_PACKAGES,
    MODEL_STREAMER_PACKAGES,
    MODEL_STREAMER_SHA256,
)
from manifests.contract import MIRROR_SERVICE_ACCOUNT, STREAMER_WHEELS_PREFIX, SYSTEM_NODE_SELECTOR
from manifests.hf_token import TOKEN_PATH, container_mount, pod_volume
from manifests.ray_service import NO_CAPABILITIES, RUNTIME_DEFAULT_SECCOMP

# The Job's own program, shipped to the pod as a ConfigMap.
JOB_SCRIPT = Path(__file__).resolve().parent.parent / "mirror" / "job.py"
# The Ray pods' token volume, mount and path: the same SecretProviderClass serves the Job.
TOKEN_VOLUME = pod_volume()
TOKEN_MOUNT = container_mount()


WHEELS_DIR = "/tmp/wheels"


def streamer_download_script(directory: str, *, platform: str, python: str) -> str:
    """pip downloads the model streamer's wheels for the serving image's Python and platform (the image's
    facts), each checked against its pinned hash, so that the GPU workers can install them from the mirror."""
    lines = " ".join(
        shlex.quote(f"{package} --hash=sha256:{MODEL_STREAMER_SHA256[package]}") for package in MODEL_STREAMER_PACKAGES
    )
    requirements = f"{directory}.txt"
    return (
        f"printf '%s\\n' {lines} > {shlex.quote(requirements)} && "
        "pip download --quiet --no-cache-dir --disable-pip-version-check --no-deps --only-binary=:all: "
        f"--require-hashes --platform {platform} --python-version {python} --implementation cp "
        f"-d {shlex.quote(directory)} -r {shlex.quote(requirements)}"
    )


def job_name(config: AppConfig) -> str:
    return f"mirror-{config.serving.model.model_id.replace('.', '-').replace('_', '-').lower()}"[:63].rstrip("-")


def manifests(config: AppConfig, *, repo: str, prefix: str, revision: str = "main") -> list[dict[str, Any]]:
    namespace = config.ray_service.namespace
    name = job_name(config)
    gated = bool(config.serving.model.hf_token_secret)
    image_facts = config.ray_service.serving_image_facts()
    env = [{"name": "AWS_REGION", "value": config.aws.region}, {"name": "HF_HUB_DISABLE_PROGRESS_BARS", "value": "1"}]
    if gated:
        env.append({"name": "HF_TOKEN_PATH", "value": TOKEN_PATH})
    script = " && ".join(
        [
            f"pip install --quiet --no-cache-dir --no-deps {' '.join(MIRROR_JOB_PACKAGES)}",
            streamer_download_script(
                WHEELS_DIR, platform=image_facts.wheel_platform, python=image_facts.python_version
            ),
            "python /mirror/job.py "
            + shlex.join(
                [
                    *("--repo", repo, "--revision", revision, "--bucket", config.mirror_bucket, "--prefix", prefix),
                    *("--wheels", WHEELS_DIR, "--wheels-prefix", STREAMER_WHEELS_PREFIX),
                ]
            ),
        ]
    )
    container = {
        "name": "mirror",
        "image": MIRROR_JOB_IMAGE,
        "command": ["/bin/sh", "-c", script],
        "env": env,
        "resources": {"requests": {"cpu": "1", "memory": "2Gi"}, "limits": {"memory": "4Gi"}},
        "securityContext": dict(NO_CAPABILITIES),
        "volumeMounts": [
            {"name": "script", "mountPath": "/mirror", "readOnly": True},
            {"name": "scratch", "mountPath": "/tmp"},
            *([TOKEN_MOUNT] if gated else []),
        ],
    }
    pod_spec = {
        "serviceAccountName": MIRROR_SERVICE_ACCOUNT,
        # Pod Identity and the CSI driver get tokens of their own; nothing here calls the Kubernetes API.
        "automountServiceAccountToken": False,
        "securityContext": dict(RUNTIME_DEFAULT_SECCOMP),
        "restartPolicy": "Never",
        "nodeSelector": dict(SYSTEM_NODE_SELECTOR),
        "containers": [container],
        "volumes": [
            {"name": "script", "configMap": {"name": name}},
            # One model file at a time lands here before its upload (the largest shard, a few GB).
            {"name": "scratch", "emptyDir": {"sizeLimit": "40Gi"}},
            *([TOKEN_VOLUME] if gated else []),
        ],
    }
    return [
        {
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": {"name": name, "namespace": namespace},
            "data": {"job.py": JOB_SCRIPT.read_text()},
        },
        {
            "apiVersion": "batch/v1",
            "kind": "Job",
            "metadata": {
                "name": name,
                "namespace": namespace,
                "labels": {"app.kubernetes.io/name": MIRROR_SERVICE_ACCOUNT},
            },
            "spec": {
                # A retry resumes where the last attempt stopped (objects already in S3 are skipped).
                "backoffLimit": 3,
                "ttlSecondsAfterFinished": 86400,
                "template": {"metadata": {"labels": {"app.kubernetes.io/name": "model-mirror"}}, "spec": pod_spec},
            },
        },
    ]
