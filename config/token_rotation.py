"""The GCS store's AUTH token rotation, in the steps ElastiCache allows, one per deploy.

ElastiCache changes a replication group's AUTH token with ModifyReplicationGroup: ``ROTATE`` adds the
new token beside the old one (both accepted), and ``SET``, allowed only after a ROTATE, keeps the new
one alone (https://docs.aws.amazon.com/AmazonElastiCache/latest/dg/auth.html). CloudFormation's
``AWS::ElastiCache::ReplicationGroup`` has no update strategy and reads its dynamic reference only when
the resource updates, so the template never carries the change: `make deploy` makes the calls, and the
template's reference resolves to the new value of the same secret afterwards.

Raising ``ray_service.gcs_fault_tolerance.store.auth_token_generation`` by one starts it:

1. ``rotate``: ROTATE with a new token, which becomes the secret's current value, labelled
   ``ROTATED_STAGE`` until the SET. The running head keeps the old token, still accepted.
2. ``wait``: the Secrets Store CSI driver re-reads mounted secrets on its rotation poll and updates the
   Kubernetes Secret that the head's ``REDIS_PASSWORD`` comes from; each mount's
   SecretProviderClassPodStatus names the secret version it holds. Until every mount holds the new
   one, a head would start with the old token.
3. ``restart``: the head's pod template carries the new generation, so KubeRay builds a new
   RayCluster (a NewCluster upgrade: the old one serves until the new one does), whose head starts
   with the new token.
4. ``set``: once no RayCluster of an older generation is left, SET: the old token is refused, and the
   label goes.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

# The annotation on the head's pod template that carries the token generation (left out at 1, so that
# a stack deployed before rotation existed sees no change).
GENERATION_ANNOTATION = "pd-serving/gcs-auth-token-generation"
# The Secrets Manager staging label on the token version that ElastiCache accepts beside the old one,
# from the ROTATE until the SET.
ROTATED_STAGE = "PDSERVING_ROTATED"
FIELD = "ray_service.gcs_fault_tolerance.store.auth_token_generation"

Action = Literal["none", "rotate", "wait", "restart", "set", "hold"]


class RotationRefused(ValueError):
    """A generation change the steps cannot take: one line naming the field, the deployed generation and
    the next allowed value."""


@dataclass(frozen=True)
class RotationStep:
    """What this deploy does about the store's token, the generation the head's pod template carries, and
    why, in words."""

    action: Action
    head_generation: int
    says: str = ""


def rotation_step(
    *,
    target: int,
    deployed: int,
    rotated_version: str | None,
    mounts_synced: bool | None,
    older_clusters: list[str] | None,
) -> RotationStep:
    """The step from what runs towards ``target`` (the config's generation).

    ``deployed`` is the generation the deployed head carries; ``rotated_version`` the secret version
    labelled ``ROTATED_STAGE`` (a ROTATE not yet followed by a SET), None when there is none or it could
    not be read; ``mounts_synced`` whether every mount of the token holds that version and
    ``older_clusters`` the RayClusters of an older generation than ``target``, each None when the cluster
    could not be asked."""
    if target < deployed:
        raise RotationRefused(
            f"{FIELD} is {target} but the deployed head runs generation {deployed}: a token generation never goes "
            f"back; keep {deployed}"
        )
    if target > deployed + 1:
        raise RotationRefused(
            f"{FIELD} is {target} but the deployed head runs generation {deployed}: the token rotates one generation "
            f"at a time; set {deployed + 1}"
        )
    if target == deployed + 1:
        if rotated_version is None:
            return RotationStep(
                "rotate",
                deployed,
                "this deploy rotates the GCS store's AUTH token (ElastiCache ROTATE: the old and the new token are "
                "both accepted) and makes the new one the secret's value; the head keeps the old one for now",
            )
        if not mounts_synced:
            why = "the cluster could not be asked" if mounts_synced is None else "not every mount holds it yet"
            return RotationStep(
                "wait",
                deployed,
                f"the rotated token waits for the Secrets Store CSI driver's rotation poll ({why}): deploy again "
                "once it has run (within the hour)",
            )
        return RotationStep(
            "restart",
            target,
            f"the head moves to token generation {target}: KubeRay builds a new RayCluster whose head starts with "
            "the new token, and the old one serves until then",
        )
    if rotated_version is None:
        return RotationStep("none", target)
    if older_clusters is None or older_clusters:
        who = "the cluster could not be asked" if older_clusters is None else f"{', '.join(older_clusters)} still runs"
        return RotationStep(
            "hold",
            target,
            f"the old GCS store token stays accepted ({who}); the next deploy after the old RayCluster is gone sets "
            "the new one alone",
        )
    return RotationStep(
        "set",
        target,
        "this deploy sets the GCS store's new AUTH token alone (ElastiCache SET): the old one is refused from now",
    )


def rotation_of(target: int, token: Any) -> RotationStep:
    """The step for the config's generation ``target`` and the deploy facts' ``store_token`` (None before
    the first deploy, and offline: the config's generation stands)."""
    if token is None:
        return RotationStep("none", target)
    return rotation_step(
        target=target,
        deployed=token.generation,
        rotated_version=token.rotated_version,
        mounts_synced=token.mounts_synced,
        older_clusters=token.older_clusters,
    )
