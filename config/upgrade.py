"""Kubernetes upgrades as EKS takes them: one minor at a time, the control plane (with its add-ons)
first, then one node group per deploy.

`make deploy` reads the deployed versions (``DeployFacts.kubernetes_version`` and
``node_group_versions``); the stack synthesizes the step that follows them, never more, and
`make preview` names the deploys still to come. The config says where to end up; the steps are
derived:

- EKS's UpdateClusterVersion moves a control plane one minor up, never down, and only once "all of
  your node groups' Kubernetes versions ... match the cluster's Kubernetes version"
  (https://docs.aws.amazon.com/eks/latest/APIReference/API_UpdateClusterVersion.html); a rollback
  is EKS's own feature, not an update (https://docs.aws.amazon.com/eks/latest/userguide/rollback-cluster.html).
- A managed node group's nodes are drained and replaced when its version moves, surging up to two
  extra instances into the zone while they roll
  (https://docs.aws.amazon.com/eks/latest/userguide/managed-node-update-behavior.html): one group per
  deploy keeps one phase rolling at a time, and the quota check counts that surge.
- Nodes may lag the control plane by up to three minors (Kubernetes' version skew policy for 1.28 and
  later), never lead it.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

# The order node groups are upgraded in: the system nodes (operator, head) first, so that the serving
# phases move under an operator that already runs on the new minor.
NODE_GROUP_ORDER = ("system", "prefill", "decode")
# Kubernetes' version skew policy: a kubelet up to three minors older than the API server (1.28+).
MAX_NODE_SKEW = 3
# Where each group's own version sits in the config, for the one-line refusals.
GROUP_FIELDS = {
    "system": "cluster.system_node_group.kubernetes_version",
    "prefill": "cluster.gpu_node_groups.prefill.kubernetes_version",
    "decode": "cluster.gpu_node_groups.decode.kubernetes_version",
}
CLUSTER_FIELD = "cluster.kubernetes_version"


class VersionStepRefused(ValueError):
    """A version change EKS would refuse: one line naming the field, the deployed value and the next step."""


def minor(version: str) -> int:
    """The minor of a "1.NN" version."""
    major, _, rest = version.partition(".")
    if major != "1" or not rest.isdigit():
        raise ValueError(f"{version!r} is not a Kubernetes minor such as 1.36")
    return int(rest)


def version_of(number: int) -> str:
    return f"1.{number}"


@dataclass(frozen=True)
class UpgradeStep:
    """The versions this deploy sets, what it moves, and the deploys that follow."""

    control_plane: str
    node_groups: dict[str, str]
    moves: str = ""  # what this deploy upgrades, in words; empty when no version moves
    then: tuple[str, ...] = field(default_factory=tuple)  # each later deploy, in words
    rolls: str | None = None  # the node group this deploy rolls to a new version, if any


def _lagging(group_targets: Mapping[str, str], deployed_groups: Mapping[str, str]) -> list[str]:
    return [
        group
        for group in NODE_GROUP_ORDER
        if group in deployed_groups
        and group in group_targets
        and minor(deployed_groups[group]) < minor(group_targets[group])
    ]


def upgrade_step(
    *,
    target: str,
    group_targets: Mapping[str, str],
    deployed: str | None,
    deployed_groups: Mapping[str, str],
) -> UpgradeStep:
    """The step this deploy takes from the deployed versions towards the config's.

    ``target`` is cluster.kubernetes_version, ``group_targets`` each group's version (the cluster's
    unless the group sets its own); ``deployed`` and ``deployed_groups`` are what runs now (None and
    {} before the first deploy, and a group missing from it is created at its target). Raises
    ``VersionStepRefused`` for a step EKS refuses."""
    if deployed is None:
        return UpgradeStep(control_plane=target, node_groups=dict(group_targets))
    want, runs = minor(target), minor(deployed)
    if want < runs:
        raise VersionStepRefused(
            f"{CLUSTER_FIELD} is {target} but the deployed cluster runs {deployed}: EKS never takes a control plane "
            f"back a minor by an update; keep {deployed}, or set {version_of(runs + 1)} to upgrade"
        )
    behind = [g for g in NODE_GROUP_ORDER if g in deployed_groups and minor(deployed_groups[g]) < runs]
    if want > runs and behind:
        raise VersionStepRefused(
            f"{CLUSTER_FIELD} is {target} but the deployed cluster runs {deployed} with the "
            f"{', '.join(f'{g} nodes at {deployed_groups[g]}' for g in behind)}: EKS upgrades a control plane only "
            f"once every node group runs its version; keep {deployed} and deploy until the node groups have caught up"
        )
    if want > runs + 1:
        raise VersionStepRefused(
            f"{CLUSTER_FIELD} is {target} but the deployed cluster runs {deployed}: EKS upgrades one minor at a time; "
            f"set {version_of(runs + 1)}, deploy until `make preview` shows no upgrade step left, then the next minor"
        )
    for group in NODE_GROUP_ORDER:
        if group in group_targets and group in deployed_groups:
            if minor(group_targets[group]) < minor(deployed_groups[group]):
                raise VersionStepRefused(
                    f"{GROUP_FIELDS[group]} is {group_targets[group]} but the {group} nodes run "
                    f"{deployed_groups[group]}: EKS never takes a node group back a minor; set {deployed_groups[group]} "
                    "or later"
                )
    kept = dict(deployed_groups)
    new_groups = {g: v for g, v in group_targets.items() if g not in deployed_groups}
    if want == runs + 1:
        later = [f"{g} nodes {deployed_groups[g]} -> {group_targets[g]}" for g in _lagging(group_targets, kept)]
        return UpgradeStep(
            control_plane=target,
            node_groups={**kept, **new_groups},
            moves=f"control plane {deployed} -> {target}",
            then=tuple(later),
        )
    lagging_groups = _lagging(group_targets, deployed_groups)
    if not lagging_groups:
        return UpgradeStep(control_plane=target, node_groups={**kept, **new_groups})
    first, *rest = lagging_groups
    return UpgradeStep(
        control_plane=target,
        node_groups={**kept, first: group_targets[first], **new_groups},
        moves=f"{first} nodes {deployed_groups[first]} -> {group_targets[first]}",
        rolls=first,
        then=tuple(f"{g} nodes {deployed_groups[g]} -> {group_targets[g]}" for g in rest),
    )


def step_of(cluster: Any, facts: Any) -> UpgradeStep:
    """The step from ``facts`` (``DeployFacts``: what runs now) towards ``cluster`` (``ClusterConfig``)."""
    return upgrade_step(
        target=cluster.kubernetes_version,
        group_targets=cluster.node_group_versions(),
        deployed=facts.kubernetes_version,
        deployed_groups=facts.node_group_versions,
    )


def remaining_steps(
    *, target: str, group_targets: Mapping[str, str], deployed: str | None, deployed_groups: Mapping[str, str]
) -> list[str]:
    """What each deploy from the deployed versions to the config's moves, in order (empty: nothing)."""
    steps: list[str] = []
    current, groups = deployed, dict(deployed_groups)
    for _ in range(len(NODE_GROUP_ORDER) + 1):  # the control plane, then each group at most once
        step = upgrade_step(target=target, group_targets=group_targets, deployed=current, deployed_groups=groups)
        if not step.moves:
            break
        steps.append(step.moves)
        current, groups = step.control_plane, {g: v for g, v in step.node_groups.items() if g in groups}
    return steps
