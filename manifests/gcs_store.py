"""GCS fault tolerance as Kubernetes data: the RayCluster's ``gcsFaultToleranceOptions``, the
SecretProviderClass that syncs the store's AUTH token into a Kubernetes Secret, and the CSI volume
the head mounts so that the sync happens.

How the token reaches the GCS, by reference only. KubeRay 1.7.0 (``configureRedisFT``,
ray-operator/controllers/ray/common/pod.go) puts ``redisPassword`` into the head container as
``REDIS_PASSWORD`` (``value`` or ``valueFrom``, as given) and sets ``rayStartParams['redis-password']
= '$REDIS_PASSWORD'``; the head's ``ray start`` expands it. ``valueFrom.secretKeyRef`` needs a
Kubernetes Secret, and the token lives in Secrets Manager. The Secrets Store CSI driver makes that
Secret from the mounted object (``secretObjects``; driver v1.6.0, docs/book/src/topics/
sync-as-kubernetes-secret.md): ``NodePublishVolume`` writes a SecretProviderClassPodStatus and its
controller creates the Secret, owned by the mounting pods, so it exists only while a pod mounts the
volume ("The secrets will only sync once you start a pod mounting the secrets"). The head mounts it
itself: the kubelet mounts volumes before it starts the container and resolves the env var then; if
the controller has not written the Secret yet, the container waits in CreateContainerConfigError and
the kubelet retries. KubeRay's Redis cleanup Job is built from the head's pod template
(``buildRedisCleanupJob``), so it runs as the head's service account, whose role alone reads the
token, mounts the volume too and finds the Secret after the head is gone.
The token is never a template value, an env value in a manifest or a Serve config entry.
"""

from __future__ import annotations

from typing import Any

from config.versions import SERVING_IMAGE_CA_BUNDLE
from manifests.hf_token import aws_secret_provider_class, mount_secrets

PROVIDER_CLASS = "gcs-store-auth"
# The Kubernetes Secret the driver syncs, and its key: what redisPassword's secretKeyRef names.
SECRET_NAME = "gcs-store-auth"
SECRET_KEY = "auth-token"
VOLUME = "gcs-store-auth"
MOUNT_PATH = "/var/run/secrets/gcs-store"
FILE_NAME = "auth-token"
# The port the ElastiCache replication group listens on (its security group admits only this).
STORE_PORT = 6379
# rediss://: Ray's GCS turns TLS on from the scheme (ray/_private/services.py, get_address, in Ray
# 2.58.0), and so does KubeRay's Redis cleanup Job (use_ssl=parsed.scheme=='rediss').
TLS_SCHEME = "rediss"
# Ray's system config REDIS_CA_CERT, read from the environment: the CA file the GCS (and KubeRay's
# cleanup Job, built from the head's pod template) verifies the store's certificate with. Unset,
# the BoringSSL linked into gcs_server falls back to its own default file (/etc/ssl/cert.pem), not
# the image's bundle; Ray's KubeRay GCS fault-tolerance guide sets it for a managed Redis.
CA_CERT_ENV = "RAY_REDIS_CA_CERT"


def redis_address(host: str) -> str:
    """KubeRay's ``redisAddress`` for the store's primary endpoint (a CloudFormation token at synth)."""
    return f"{TLS_SCHEME}://{host}:{STORE_PORT}"


def tls_env(address: str, ca_bundle: str = SERVING_IMAGE_CA_BUNDLE) -> list[dict[str, str]]:
    """The head's environment for the store at ``address``: the image's CA bundle (``ca_bundle``, the
    serving image's facts) when the address turns TLS on (``rediss://``), nothing for a plain one (the
    local server's loopback Redis)."""
    if not address.startswith(f"{TLS_SCHEME}://"):
        return []
    return [{"name": CA_CERT_ENV, "value": ca_bundle}]


def fault_tolerance_options(host: str) -> dict[str, Any]:
    """``gcsFaultToleranceOptions`` (backend redis, KubeRay's default) for the store at ``host``.

    ``externalStorageNamespace`` is left out on purpose: KubeRay then uses the RayCluster's UID
    (``configureRedisFT``), so the two clusters of a NewCluster upgrade never share GCS keys, and
    the cleanup Job of the old one deletes only its own.
    """
    return {
        "redisAddress": redis_address(host),
        "redisPassword": {"valueFrom": {"secretKeyRef": {"name": SECRET_NAME, "key": SECRET_KEY}}},
    }


def secret_provider_class(*, namespace: str, secret_arn: str, region: str) -> dict[str, Any]:
    """The SecretProviderClass that mounts the store's AUTH token (ASCP, Pod Identity) and syncs it
    into the Kubernetes Secret ``SECRET_NAME``; ``secret_arn`` is the stack's secret (a token at synth)."""
    return aws_secret_provider_class(
        name=PROVIDER_CLASS,
        namespace=namespace,
        secrets={secret_arn: FILE_NAME},
        region=region,
        secret_objects=[
            {"secretName": SECRET_NAME, "type": "Opaque", "data": [{"objectName": FILE_NAME, "key": SECRET_KEY}]}
        ],
    )


def mount_on_head(head: dict[str, Any], *, address: str, ca_bundle: str) -> None:
    """The CSI volume on the head pod (and so on KubeRay's cleanup Job), which makes the driver sync
    the Secret that ``REDIS_PASSWORD`` is read from; and the image's CA bundle for the store at ``address``."""
    mount_secrets(head, volume=VOLUME, provider_class=PROVIDER_CLASS, mount_path=MOUNT_PATH)
    head["template"]["spec"]["containers"][0].setdefault("env", []).extend(tls_env(address, ca_bundle))
