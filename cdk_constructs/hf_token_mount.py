"""Where a gated model's token appears in a pod: the CSI volume, its mount and HF_TOKEN_PATH.

No CDK here, so that the mirror Job's manifest and `make verify` use the same names as the Ray
pods (``cdk_constructs.hf_token`` installs the driver and the SecretProviderClass they name).
"""

from __future__ import annotations

from typing import Any

PROVIDER_CLASS = "hf-token"
VOLUME = "hf-token"
MOUNT_PATH = "/var/run/secrets/huggingface"
FILE_NAME = "token"
TOKEN_PATH = f"{MOUNT_PATH}/{FILE_NAME}"
CSI_DRIVER = "secrets-store.csi.k8s.io"


def pod_volume() -> dict[str, Any]:
    return {
        "name": VOLUME,
        "csi": {"driver": CSI_DRIVER, "readOnly": True, "volumeAttributes": {"secretProviderClass": PROVIDER_CLASS}},
    }


def container_mount() -> dict[str, Any]:
    return {"name": VOLUME, "mountPath": MOUNT_PATH, "readOnly": True}


def container_env() -> dict[str, str]:
    return {"name": "HF_TOKEN_PATH", "value": TOKEN_PATH}
