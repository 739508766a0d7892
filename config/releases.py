"""The add-on and node AMI releases a deploy sets: the pins in config/versions.py as floors.

A pin only says "at least this": the cluster may run something newer, because EKS created it with its
default of the day or someone took a release by hand (`aws eks update-addon`, `update-nodegroup-version`).
`make deploy` reads what runs (``DeployFacts.addon_versions``, ``node_ami_releases``) and the template sets
the newer of the two, so a pin never takes an add-on or a node group back. A version the config sets
itself (``cluster.addon_versions``, a node group's ``ami_release_version``) is taken as it is, and refused
when it is older than what runs.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from config import versions
from config.upgrade import GROUP_FIELDS, NODE_GROUP_ORDER, UpgradeStep, VersionStepRefused

ADDON_RELEASE = re.compile(r"^v(\d+)\.(\d+)\.(\d+)-eksbuild\.(\d+)$")
# k8s_major.k8s_minor.k8s_patch-release_date (https://docs.aws.amazon.com/eks/latest/userguide/eks-linux-ami-versions.html)
AMI_RELEASE = re.compile(r"^(1\.\d+)\.(\d+)-(\d{8})$")


def addon_order(version: str) -> tuple[int, ...]:
    """A sortable form of an EKS add-on version such as v1.36.0-eksbuild.14."""
    match = ADDON_RELEASE.match(version)
    if match is None:
        raise ValueError(f"{version!r} is not an EKS add-on version such as v1.36.0-eksbuild.14")
    return tuple(int(part) for part in match.groups())


def ami_parts(release: str) -> tuple[str, str, str]:
    """(Kubernetes minor, patch, release date) of an AMI release such as 1.36.3-20260903."""
    match = AMI_RELEASE.match(release)
    if match is None:
        raise ValueError(f"{release!r} is not an EKS AMI release version such as 1.36.3-20260903")
    minor, patch, date = match.groups()
    return minor, patch, date


def ami_minor(release: str) -> str:
    """The Kubernetes minor of an AMI release such as 1.36.3-20260903."""
    return ami_parts(release)[0]


def ami_order(release: str) -> tuple[int, ...]:
    """A sortable form of an AMI release: the Kubernetes minor, the release date, then the patch."""
    minor, patch, date = ami_parts(release)
    return (*(int(part) for part in minor.split(".")), int(date), int(patch))


def addon_versions(*, control_plane: str, overrides: Mapping[str, str], live: Mapping[str, str]) -> dict[str, str]:
    """Each managed add-on's version for a control plane at ``control_plane``: the config's override, else the
    newer of the pin and what runs. An add-on with neither pin nor live version is left to EKS's default."""
    pins = versions.EKS_ADDON_RELEASES.get(control_plane, {})
    chosen: dict[str, str] = {}
    for name in versions.EKS_ADDONS:
        running = live.get(name)
        if name in overrides:
            wanted = overrides[name]
            if running and addon_order(wanted) < addon_order(running):
                raise VersionStepRefused(
                    f"cluster.addon_versions.{name} is {wanted} but the cluster runs {running}: an older version would "
                    f"take the add-on back; set {running} or later, or remove it"
                )
            chosen[name] = wanted
            continue
        candidates = [v for v in (pins[name].version if name in pins else None, running) if v]
        if candidates:
            chosen[name] = max(candidates, key=addon_order)
    return chosen


def release_pin(cluster: Any, group: str, kubernetes_version: str) -> str | None:
    """The release ``group`` is pinned to at ``kubernetes_version``: its ami_release_version when that is a
    release of the minor, else config/versions.py's (None where neither names one)."""
    override = cluster.node_groups()[group].ami_release_version
    if override is not None and ami_minor(override) == kubernetes_version:
        return override
    pin = versions.NODE_AMI_RELEASES.get(kubernetes_version)
    return pin.version if pin else None


def ami_release(
    *, field: str, kubernetes_version: str, override: str | None, live: str | None, unpinned: bool = False
) -> str | None:
    """The AMI release a node group at ``kubernetes_version`` runs after this deploy, or None to leave
    ReleaseVersion out of the template.

    ``field`` names the override in refusals, ``override`` is the group's ami_release_version, ``live`` the
    release the group runs now, ``unpinned`` says the deployed template leaves ReleaseVersion out. Such a group
    keeps it out while the release stays what runs: adding the property at the value the group already has
    would send EKS an update to the release it runs."""
    # An override names a release of the group's configured minor; while an upgrade has not brought the
    # group there yet, the pins of the minor it runs in this deploy apply.
    if override is not None and ami_minor(override) == kubernetes_version:
        if live and ami_minor(live) == kubernetes_version and ami_order(override) < ami_order(live):
            raise VersionStepRefused(
                f"{field} is {override} but the nodes run {live}: an older release would take them back; set {live} "
                "or later, or remove it"
            )
        chosen: str | None = override
    else:
        pin = versions.NODE_AMI_RELEASES.get(kubernetes_version)
        candidates = [r for r in (pin.version if pin else None, live) if r and ami_minor(r) == kubernetes_version]
        chosen = max(candidates, key=ami_order) if candidates else None
    if unpinned and chosen == live:
        return None
    return chosen


@dataclass(frozen=True)
class NodeReleases:
    """The AMI release each node group gets in this deploy (None: ReleaseVersion left out), the group it rolls
    to a new release, if any, and the groups whose new release waits for a later deploy."""

    releases: dict[str, str | None]
    rolls: str | None = None
    then: tuple[str, ...] = field(default_factory=tuple)


def node_releases(cluster: Any, step: UpgradeStep, facts: Any) -> NodeReleases:
    """Each node group's AMI release for this deploy: one group rolls per deploy, like a Kubernetes step, and
    none while the step moves a Kubernetes version (the group it moves takes its new minor's release).
    ``cluster`` is the ClusterConfig, ``facts`` the DeployFacts."""
    sections = cluster.node_groups()
    moving = step.moves != ""
    releases: dict[str, str | None] = {}
    rolls: str | None = step.rolls
    waiting: list[str] = []
    for group in NODE_GROUP_ORDER:
        live = facts.node_ami_releases.get(group)
        unpinned = group in facts.ami_release_unpinned
        field_name = GROUP_FIELDS[group].replace("kubernetes_version", "ami_release_version")
        wanted = ami_release(
            field=field_name,
            kubernetes_version=step.node_groups[group],
            override=sections[group].ami_release_version,
            live=live,
            unpinned=unpinned,
        )
        if live is None and unpinned:
            releases[group] = None  # what it runs cannot be read: it keeps that, whatever it is
        elif live is None or group == step.rolls or wanted in (None, live):
            releases[group] = wanted
        elif moving or rolls is not None:
            releases[group] = None if unpinned else live
            waiting.append(f"{group} nodes to AMI release {wanted}")
        else:
            releases[group] = wanted
            rolls = group
    return NodeReleases(releases=releases, rolls=rolls if rolls != step.rolls else None, then=tuple(waiting))
