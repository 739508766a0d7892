"""A gated model's token as Kubernetes objects: the SecretProviderClass that names the secret, the
values of the CSI driver's and AWS provider's charts, and where the token appears in a pod (the CSI
volume, its mount and HF_TOKEN_PATH).

No CDK here, so that the mirror Job's manifest and `make verify` use the same names as the Ray
pods (``cdk_constructs.hf_token`` installs the charts and the SecretProviderClass).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import yaml

PROVIDER_CLASS = "hf-token"
VOLUME = "hf-token"
MOUNT_PATH = "/var/run/secrets/huggingface"
FILE_NAME = "token"
TOKEN_PATH = f"{MOUNT_PATH}/{FILE_NAME}"
CSI_DRIVER = "secrets-store.csi.k8s.io"
ROTATION_POLL_INTERVAL = "3600s"
# Every node that runs Ray pods: the system nodes (head) and the tainted GPU nodes (workers).
EVERYWHERE = [{"operator": "Exists"}]


def csi_volume(name: str, provider_class: str) -> dict[str, Any]:
    """A read-only CSI volume of the Secrets Store driver for one SecretProviderClass."""
    return {
        "name": name,
        "csi": {"driver": CSI_DRIVER, "readOnly": True, "volumeAttributes": {"secretProviderClass": provider_class}},
    }


def mount_secrets(group: dict[str, Any], *, volume: str, provider_class: str, mount_path: str) -> None:
    """A SecretProviderClass's files in a Ray group's pods, read-only in the Ray container."""
    pod = group["template"]["spec"]
    pod.setdefault("volumes", []).append(csi_volume(volume, provider_class))
    pod["containers"][0].setdefault("volumeMounts", []).append(
        {"name": volume, "mountPath": mount_path, "readOnly": True}
    )


def pod_volume() -> dict[str, Any]:
    return csi_volume(VOLUME, PROVIDER_CLASS)


def container_mount() -> dict[str, Any]:
    return {"name": VOLUME, "mountPath": MOUNT_PATH, "readOnly": True}


def container_env() -> dict[str, str]:
    return {"name": "HF_TOKEN_PATH", "value": TOKEN_PATH}


def aws_secret_provider_class(
    *,
    name: str,
    namespace: str,
    secrets: Mapping[str, str],
    region: str,
    secret_objects: list[dict[str, Any]] | None = None,
) -> dict[str, Any]:
    """A SecretProviderClass of AWS's provider (ASCP) that mounts each Secrets Manager secret of
    ``secrets`` (name or ARN -> file name) as a file, read with the mounting pod's Pod Identity role;
    ``secret_objects`` also syncs them into Kubernetes Secrets (the driver's ``syncSecret``)."""
    objects = [
        {"objectName": secret, "objectType": "secretsmanager", "objectAlias": alias}
        for secret, alias in secrets.items()
    ]
    spec: dict[str, Any] = {"provider": "aws"}
    if secret_objects:
        spec["secretObjects"] = secret_objects
    spec["parameters"] = {
        "objects": yaml.safe_dump(objects, sort_keys=False),
        "usePodIdentity": "true",
        "region": region,
    }
    return {
        "apiVersion": "secrets-store.csi.x-k8s.io/v1",
        "kind": "SecretProviderClass",
        "metadata": {"name": name, "namespace": namespace},
        "spec": spec,
    }


def secret_provider_class(*, namespace: str, secret: str, region: str) -> dict[str, Any]:
    """The SecretProviderClass that names exactly the configured secret (ASCP, Pod Identity)."""
    return aws_secret_provider_class(
        name=PROVIDER_CLASS, namespace=namespace, secrets={secret: FILE_NAME}, region=region
    )


def driver_values(*, sync_secrets: bool = False) -> dict[str, Any]:
    """The driver chart's values; ``sync_secrets`` lets it create the Kubernetes Secrets that a
    SecretProviderClass's ``secretObjects`` name (its ClusterRole then covers Secrets), which only GCS
    fault tolerance needs (``manifests.gcs_store``)."""
    values: dict[str, Any] = {
        "linux": {"tolerations": EVERYWHERE},
        # Pod Identity: the provider exchanges a token of this audience for the pod's role.
        "tokenRequests": [{"audience": "sts.amazonaws.com"}, {"audience": "pods.eks.amazonaws.com"}],
        "enableSecretRotation": True,
        "rotationPollInterval": ROTATION_POLL_INTERVAL,
    }
    if sync_secrets:
        values["syncSecret"] = {"enabled": True}
    return values


def provider_values(region: str) -> dict[str, Any]:
    return {
        # The driver is installed (and pinned) on its own.
        "secrets-store-csi-driver": {"install": False},
        # Its default tolerates nothing: on the tainted GPU nodes the mount would fail.
        "tolerations": EVERYWHERE,
        "awsRegion": region,
    }
