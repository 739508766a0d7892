"""The endpoint's API keys as Kubernetes objects: the SecretProviderClass that names the configured
Secrets Manager secrets, and where they appear in a GPU worker (a CSI volume at ``MOUNT_PATH``, one
file per secret, which the keyed ingress reads: ``serve_app/ingress.py``); and, with
``cache_isolation: per_key``, the cache-salt secret the stack generates, in a volume of its own
(every file of the keys' directory is a key).

Only the GPU workers mount them: the ingress replica runs there (it asks for a phase resource or a
CPU, which the head has none of), and a missing secret must not hold the head at ContainerCreating.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from manifests.hf_token import aws_secret_provider_class, mount_secrets

PROVIDER_CLASS = "api-keys"
VOLUME = "api-keys"
MOUNT_PATH = "/var/run/secrets/pd-serving/api-keys"


def file_name(index: int) -> str:
    return f"key-{index}"


def secret_provider_class(*, namespace: str, secrets: Sequence[str], region: str) -> dict[str, Any]:
    """Each secret of ``ray_service.endpoint.api_key_secrets`` as its own file (ASCP, Pod Identity)."""
    return aws_secret_provider_class(
        name=PROVIDER_CLASS,
        namespace=namespace,
        secrets={secret: file_name(index) for index, secret in enumerate(secrets)},
        region=region,
    )


def mount(group: dict[str, Any]) -> None:
    """The keys' CSI volume on a worker group's pods, read-only in the Ray container."""
    mount_secrets(group, volume=VOLUME, provider_class=PROVIDER_CLASS, mount_path=MOUNT_PATH)


SALT_PROVIDER_CLASS = "cache-salt"
SALT_VOLUME = "cache-salt"
SALT_MOUNT_PATH = "/var/run/secrets/pd-serving/cache-salt"
SALT_FILE = "salt"
SALT_PATH = f"{SALT_MOUNT_PATH}/{SALT_FILE}"


def salt_provider_class(*, namespace: str, secret: str, region: str) -> dict[str, Any]:
    """The cache-salt secret as the file ``SALT_FILE`` (ASCP, Pod Identity)."""
    return aws_secret_provider_class(
        name=SALT_PROVIDER_CLASS, namespace=namespace, secrets={secret: SALT_FILE}, region=region
    )


def mount_salt(group: dict[str, Any]) -> None:
    """The cache-salt secret's CSI volume on a worker group's pods, read-only in the Ray container."""
    mount_secrets(group, volume=SALT_VOLUME, provider_class=SALT_PROVIDER_CLASS, mount_path=SALT_MOUNT_PATH)
