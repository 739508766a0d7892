"""The GCS store token's rotation steps that `make deploy` takes itself (config/token_rotation.py): the
ElastiCache and Secrets Manager calls around `cdk deploy`, and what kubectl says about the mounts and
the RayClusters in between."""

from __future__ import annotations

import secrets
import string
from typing import Any

from config.schema import DeployedStoreToken, DeployFacts
from config.token_rotation import GENERATION_ANNOTATION, ROTATED_STAGE
from manifests.gcs_store import PROVIDER_CLASS
from verify.kube import Kube, KubeError

# ElastiCache's AUTH token: 16-128 printable characters, none of space, '"', '/' or '@'; letters and
# digits alone, as the stack's generated secret is.
TOKEN_ALPHABET = string.ascii_letters + string.digits
TOKEN_LENGTH = 64


def new_token() -> str:
    return "".join(secrets.choice(TOKEN_ALPHABET) for _ in range(TOKEN_LENGTH))


def _modify(elasticache: Any, group: str, token: str, strategy: str) -> None:
    elasticache.modify_replication_group(
        ReplicationGroupId=group, AuthToken=token, AuthTokenUpdateStrategy=strategy, ApplyImmediately=True
    )
    # CloudFormation's update of the group in this deploy, if any, would find it modifying.
    elasticache.get_waiter("replication_group_available").wait(
        ReplicationGroupId=group, WaiterConfig={"Delay": 15, "MaxAttempts": 80}
    )


def rotate(token: DeployedStoreToken, *, elasticache: Any, secretsmanager: Any) -> str:
    """ROTATE: ElastiCache accepts a new token beside the old one; the new one becomes the secret's
    current value, labelled until the SET. Returns the new version's id."""
    assert token.secret_arn and token.replication_group, "rotate needs the deployed stack's outputs"
    value = new_token()
    _modify(elasticache, token.replication_group, value, "ROTATE")
    put = secretsmanager.put_secret_value(
        SecretId=token.secret_arn, SecretString=value, VersionStages=["AWSCURRENT", ROTATED_STAGE]
    )
    return put["VersionId"]


def set_alone(token: DeployedStoreToken, *, elasticache: Any, secretsmanager: Any) -> None:
    """SET: the rotated token alone; the label goes."""
    assert token.secret_arn and token.replication_group and token.rotated_version, "set needs a rotated version"
    value = secretsmanager.get_secret_value(SecretId=token.secret_arn, VersionId=token.rotated_version)["SecretString"]
    _modify(elasticache, token.replication_group, value, "SET")
    secretsmanager.update_secret_version_stage(
        SecretId=token.secret_arn, VersionStage=ROTATED_STAGE, RemoveFromVersionId=token.rotated_version
    )


def head_generation(cluster: dict[str, Any]) -> int:
    """The token generation a RayCluster's head carries (1 when none)."""
    template = cluster.get("spec", {}).get("headGroupSpec", {}).get("template", {})
    return int((template.get("metadata") or {}).get("annotations", {}).get(GENERATION_ANNOTATION, "1"))


def mounts_hold(statuses: list[dict[str, Any]], version: str) -> bool:
    """Every mount of the token (a SecretProviderClassPodStatus of its SecretProviderClass) holds
    ``version``: the CSI driver records the secret version each mount last wrote."""
    mine = [s for s in statuses if s.get("status", {}).get("secretProviderClassName") == PROVIDER_CLASS]
    return all(
        obj.get("version") == version for status in mine for obj in status.get("status", {}).get("objects") or []
    )


def with_token_mounts(config: Any, facts: DeployFacts, kube: Kube | None) -> DeployFacts:
    """The facts with what the cluster says about a rotation in progress: whether every mount holds the
    rotated version, and which RayClusters carry an older generation than the config's. Unknown (None)
    when the cluster cannot be asked: the rotation then waits, and the output says why."""
    token = facts.store_token
    if token is None or token.rotated_version is None:
        return facts
    store = config.ray_service.gcs_fault_tolerance.store
    target = store.auth_token_generation if store else token.generation
    namespace = config.ray_service.namespace
    if kube is None:
        print("GCS store token: offline (TEMPLATE=): the mounts and RayClusters are not asked")
        return facts
    try:
        statuses = kube.get_json(["get", "secretproviderclasspodstatuses", "-n", namespace]).get("items", [])
        clusters = kube.get_json(["get", "rayclusters", "-n", namespace]).get("items", [])
    except KubeError as exc:
        print(f"GCS store token: cannot ask the cluster ({exc}); the rotation waits")
        return facts
    older = [c["metadata"]["name"] for c in clusters if head_generation(c) < target]
    synced = mounts_hold(statuses, token.rotated_version)
    return facts.model_copy(
        update={"store_token": token.model_copy(update={"mounts_synced": synced, "older_clusters": older})}
    )
