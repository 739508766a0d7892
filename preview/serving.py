"""The CDK CLI's diff read in the terms a platform engineer thinks in: what holds state and is
replaced, which phase loses its nodes, which rollout the RayService gets, who gains or loses
cluster admin, and what an hour costs before and after."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from config import catalog
from config.releases import ami_order, release_pin
from config.schema import DeployedGcsStore
from config.upgrade import NODE_GROUP_ORDER, remaining_steps
from config.versions import (
    CLUSTER_AUTOSCALER,
    CLUSTER_AUTOSCALER_RELEASES,
    KUBERAY_OPERATOR,
    SECRETS_STORE_CSI_DRIVER,
    SECRETS_STORE_CSI_PROVIDER_AWS,
)
from consumers.template import HELM_CHART_TYPE, manifests
from kuberay.oracle import cluster_spec_hash
from manifests.contract import PHASE_LABEL
from manifests.hf_token import CSI_DRIVER
from preview.cdk_diff import ResourceChange
from preview.classes import ChangeClass, classify, moved_names, named_replacements
from preview.spec import nested_replacements, stateful_types

# Types that hold running state CloudFormation's specification does not mark (its isStateful covers
# data stores): a cluster's objects, a node group's pods and loaded models, a workspace's metrics.
RUNNING_STATE = {"AWS::EKS::Cluster", "AWS::EKS::Nodegroup", "AWS::APS::Workspace"}
# What is lost when CloudFormation replaces (creates anew, then deletes) or removes one, for the types
# this stack has; any other stateful type loses "what it holds".
LOSS = {
    "AWS::EKS::Cluster": "every node, pod and Kubernetes object, and the API endpoint: serving stops until a new "
    "cluster is built and serves",
    "AWS::EKS::Nodegroup": "the group's nodes: their pods restart elsewhere, GPU workers load the model again",
    "AWS::S3::Bucket": "the objects in it (the mirrored weights; make mirror-model copies them again)",
    "AWS::KMS::Key": "the key, once its deletion window ends: what it encrypted can no longer be read",
    "AWS::Logs::LogGroup": "the log events in it",
    "AWS::APS::Workspace": "the metrics stored in the Prometheus workspace",
    "AWS::ElastiCache::ReplicationGroup": "the GCS state kept in it: a RayCluster's GCS exits when its store "
    "goes, and its workers' raylets follow after the reconnect timeout (600 s)",
    "AWS::SecretsManager::Secret": "the secret's value (a generated one cannot be had back): whoever reads it, "
    "the store's AUTH token, gets a new one",
}
# What a pod's Secrets Store volume mounts and unmounts through: the driver and AWS's provider.
CSI_CHARTS = {SECRETS_STORE_CSI_DRIVER.chart, SECRETS_STORE_CSI_PROVIDER_AWS.chart}
REPLICATION_GROUP = "AWS::ElastiCache::ReplicationGroup"
# A node group property whose change makes EKS roll the group's nodes (drain and replace, one at a time).
ROLLING_PROPERTIES = {"LaunchTemplate", "ReleaseVersion", "Version", "AmiType"}
RAY_SERVICE = "RayService"
SECRET_PROVIDER_CLASS = "SecretProviderClass"
RAY_SERVICE_PATH = "manifest-RayService/Resource"
# How to remove what the serving cluster still uses without cutting it.
IN_USE = (
    "; the serving RayCluster uses it: in two deploys, `make deploy` keeps it while the deployed RayService "
    "uses it (KubeRay moves serving to the new cluster meanwhile) and removes it in the deploy after"
)


def stateful_loss(resource_type: str) -> str | None:
    """What replacing or removing a resource of this type loses; None for a type without state."""
    if resource_type not in RUNNING_STATE and resource_type not in stateful_types():
        return None
    return LOSS.get(resource_type, "what it holds (CloudFormation's resource specification marks the type stateful)")


@dataclass
class Preview:
    stateful: list[str] = field(default_factory=list)  # loud: what is replaced or removed, and what is lost
    store: list[str] = field(default_factory=list)
    # A Kubernetes upgrade step, an add-on or AMI release moving, and the deploys after them.
    upgrade: list[str] = field(default_factory=list)
    nodes: list[str] = field(default_factory=list)
    ray_service: list[str] = field(default_factory=list)
    access: list[str] = field(default_factory=list)
    charts: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    # Updates CloudFormation would refuse half-way: those a first deploy makes possible, and those none does.
    two_deploys: list[str] = field(default_factory=list)
    refused: list[str] = field(default_factory=list)
    cost: str = ""
    other: int = 0
    changes: list[ResourceChange] = field(default_factory=list)  # the CLI's, nested replacements marked

    @property
    def needs_confirmation(self) -> bool:
        """Something that holds state would be replaced or removed."""
        return bool(self.stateful)

    @property
    def change_class(self) -> ChangeClass:
        return classify(self)

    def lines(self) -> list[str]:
        out: list[str] = []
        for title, items in (
            ("Refused: no deploy can make this change", self.refused),
            ("Needs two deploys", self.two_deploys),
            ("Replaced or removed, with what is lost", self.stateful),
            ("GCS store", self.store),
            ("Kubernetes, add-ons and node AMIs", self.upgrade),
            ("GPU and system nodes", self.nodes),
            ("RayService", self.ray_service),
            ("Cluster admin access", self.access),
            ("Helm charts", self.charts),
            ("Warnings", self.warnings),
        ):
            if items:
                out.append(f"{title}:")
                out += [f"  - {item}" for item in items]
        if self.cost:
            out.append(f"Cost per hour: {self.cost}")
        if self.other:
            out.append(f"{self.other} other resource(s) change; the CDK diff lists them.")
        if not out:
            return ["No change."]
        return [f"Class of change: {self.change_class.label}", *out]


def _resources(template: dict, kind: str) -> dict[str, dict]:
    return {k: r for k, r in template.get("Resources", {}).items() if r.get("Type") == kind}


def _group_name(resource: dict) -> str:
    labels = resource.get("Properties", {}).get("Labels") or {}
    return labels.get(PHASE_LABEL) or labels.get("role") or "a node group"


def _ref(value: Any) -> str | None:
    if isinstance(value, dict):
        if "Ref" in value:
            return value["Ref"]
        if "Fn::GetAtt" in value:
            return value["Fn::GetAtt"][0]
    return None


def _principal(value: Any) -> str:
    if isinstance(value, str):
        return value
    ref = _ref(value)
    return f"the role {ref} of this stack" if ref else json.dumps(value)


def ray_service_of(template: dict) -> dict | None:
    for _, item in manifests(template):
        if item.get("kind") == RAY_SERVICE:
            return item
    return None


def _price(instance_types: list[str]) -> float | None:
    facts = [catalog.INSTANCES.get(t) for t in instance_types]
    return facts[0].price_per_hour if facts and facts[0] else None


def node_group_sizes(template: dict) -> dict[str, int]:
    """Each node group's size as the template last set it (its DesiredSize, or, once the template leaves
    the size to Cluster Autoscaler, its MinSize): offline, the best guess of the size it has now."""
    sizes = {}
    for group in _resources(template, "AWS::EKS::Nodegroup").values():
        scaling = group.get("Properties", {}).get("ScalingConfig") or {}
        size = scaling.get("DesiredSize", scaling.get("MinSize"))
        if isinstance(size, int):
            sizes[_group_name(group)] = size
    return sizes


def kubernetes_versions(template: dict) -> tuple[str | None, dict[str, str]]:
    """The control plane's Kubernetes minor and each node group's, as the template sets them (a group
    without Version runs the minor it was created at, which the template cannot say)."""
    cluster = next(
        (r.get("Properties", {}).get("Version") for r in _resources(template, "AWS::EKS::Cluster").values()), None
    )
    groups = {
        _group_name(group): version
        for group in _resources(template, "AWS::EKS::Nodegroup").values()
        if isinstance(version := group.get("Properties", {}).get("Version"), str)
    }
    return (cluster if isinstance(cluster, str) else None), groups


def releases_in(template: dict) -> tuple[dict[str, str], dict[str, str], list[str]]:
    """What the template pins besides the minors: ({add-on: AddonVersion}, {node group: ReleaseVersion}, the
    node groups it leaves without ReleaseVersion)."""
    addons = {
        name: version
        for addon in _resources(template, "AWS::EKS::Addon").values()
        if isinstance(name := addon.get("Properties", {}).get("AddonName"), str)
        and isinstance(version := addon["Properties"].get("AddonVersion"), str)
    }
    releases: dict[str, str] = {}
    unpinned: list[str] = []
    for group in _resources(template, "AWS::EKS::Nodegroup").values():
        release = group.get("Properties", {}).get("ReleaseVersion")
        if isinstance(release, str):
            releases[_group_name(group)] = release
        else:
            unpinned.append(_group_name(group))
    return addons, releases, unpinned


def access_entry_ids(template: dict) -> dict[str, str]:
    """Principal ARN -> the logical id of its access entry, for the entries that name an ARN."""
    return {
        principal: logical_id
        for logical_id, entry in _resources(template, "AWS::EKS::AccessEntry").items()
        if isinstance(principal := entry.get("Properties", {}).get("PrincipalArn"), str)
    }


def creator_is_admin(template: dict) -> bool:
    """The template's cluster leaves its creator (CloudFormation's execution role) a cluster admin."""
    for cluster in _resources(template, "AWS::EKS::Cluster").values():
        access = cluster.get("Properties", {}).get("AccessConfig") or {}
        return access.get("BootstrapClusterCreatorAdminPermissions", True) is not False
    return False


def placement_group_tags(template: dict) -> dict[str, str] | None:
    """The tags of the template's placement group, when it has literal ones."""
    for group in _resources(template, "AWS::EC2::PlacementGroup").values():
        tags = group.get("Properties", {}).get("Tags") or []
        if tags and all(isinstance(t.get("Key"), str) and isinstance(t.get("Value"), str) for t in tags):
            return {t["Key"]: t["Value"] for t in tags}
    return None


def _references(value: Any) -> set[str]:
    """The logical ids ``value`` names through Ref or Fn::GetAtt."""
    if isinstance(value, dict):
        found = {ref} if (ref := _ref(value)) else set()
        return found.union(*(_references(v) for v in value.values()))
    if isinstance(value, list):
        return set().union(*(_references(v) for v in value))
    return set()


def _cluster_pod_specs(cluster_spec: dict) -> list[dict]:
    """The pod specs of a RayCluster spec (a RayService's rayClusterConfig, or a RayCluster's spec)."""
    groups = [cluster_spec.get("headGroupSpec") or {}, *(cluster_spec.get("workerGroupSpecs") or [])]
    return [group.get("template", {}).get("spec", {}) for group in groups]


def _pod_templates(ray_service: dict) -> list[dict]:
    return _cluster_pod_specs(ray_service.get("spec", {}).get("rayClusterConfig", {}))


def _csi_volumes(pod_spec: dict) -> list[dict]:
    """The volumes a pod (or pod template) spec mounts through the Secrets Store CSI driver."""
    return [v for v in pod_spec.get("volumes") or [] if (v.get("csi") or {}).get("driver") == CSI_DRIVER]


def _secrets_store_classes(ray_service: dict) -> set[str]:
    """The SecretProviderClasses the RayService's pods mount through the Secrets Store CSI driver."""
    return {
        volume["csi"].get("volumeAttributes", {}).get("secretProviderClass", "")
        for pod in _pod_templates(ray_service)
        for volume in _csi_volumes(pod)
    }


def secrets_store_mounted(template: dict) -> bool:
    """The template's RayService mounts volumes through the Secrets Store CSI driver."""
    ray_service = ray_service_of(template)
    return bool(ray_service and _secrets_store_classes(ray_service))


def secrets_store_installed(template: dict) -> bool:
    """The template installs the Secrets Store CSI driver's charts."""
    return any(
        r.get("Properties", {}).get("Chart") in CSI_CHARTS for r in _resources(template, HELM_CHART_TYPE).values()
    )


def live_users(rayclusters: list[dict], pods: list[dict]) -> tuple[list[str], list[str]]:
    """(RayClusters that keep their GCS in the external store, RayClusters and pods that mount through the
    Secrets Store CSI driver), from what the cluster lists now: an old RayCluster that KubeRay has not
    deleted yet, and a pod still Terminating, count as much as the one that serves."""
    gcs, csi = [], []
    for cluster in rayclusters:
        name = cluster.get("metadata", {}).get("name", "?")
        spec = cluster.get("spec", {})
        if "gcsFaultToleranceOptions" in spec:
            gcs.append(f"RayCluster {name}")
        if any(_csi_volumes(pod_spec) for pod_spec in _cluster_pod_specs(spec)):
            csi.append(f"RayCluster {name}")
    for pod in pods:
        if _csi_volumes(pod.get("spec", {})):
            csi.append(f"pod {pod.get('metadata', {}).get('name', '?')}")
    return gcs, csi


def used_by_serving(template: dict) -> set[str]:
    """Logical ids of the resources the template's RayService reaches: those its manifest names (the
    GCS store's endpoint, a model bucket) and those named by the SecretProviderClasses its pods mount
    (the store's AUTH token)."""
    resources = template.get("Resources", {})
    items = manifests(template)
    serving = [(logical_id, item) for logical_id, item in items if item.get("kind") == RAY_SERVICE]
    if not serving:
        return set()
    logical_id, ray_service = serving[0]
    used = _references(resources[logical_id]["Properties"]["Manifest"])
    mounted = _secrets_store_classes(ray_service)
    for class_id, item in items:
        if item.get("kind") == SECRET_PROVIDER_CLASS and item.get("metadata", {}).get("name") in mounted:
            used |= _references(resources[class_id]["Properties"]["Manifest"])
    return used


def deployed_gcs_store(template: dict) -> DeployedGcsStore | None:
    """The template's GCS store (its replication group's shape), and whether its RayService keeps the
    GCS there."""
    for group in _resources(template, REPLICATION_GROUP).values():
        props = group.get("Properties", {})
        ray_service = ray_service_of(template) or {}
        return DeployedGcsStore(
            node_type=props.get("CacheNodeType", ""),
            nodes=int(props.get("NumCacheClusters", 1)),
            failover=props.get("AutomaticFailoverEnabled") is True,
            in_use="gcsFaultToleranceOptions" in ray_service.get("spec", {}).get("rayClusterConfig", {}),
        )
    return None


def replaced_node_groups(new: dict, changes: list[ResourceChange]) -> list[str]:
    """The node groups the CDK CLI's diff says this deploy replaces (or may replace)."""
    groups = _resources(new, "AWS::EKS::Nodegroup")
    return sorted(
        _group_name(groups[c.logical_id])
        for c in changes
        if c.logical_id in groups and c.op == "~" and (c.replaced or c.may_be_replaced)
    )


def _group_cost(template: dict, other: dict) -> float:
    """What the node groups cost per hour at their sizes; a group whose size the template leaves to the
    autoscaler is priced at the size the other template gives it."""
    total = 0.0
    other_sizes = node_group_sizes(other)
    for group in _resources(template, "AWS::EKS::Nodegroup").values():
        props = group.get("Properties", {})
        scaling = props.get("ScalingConfig") or {}
        size = scaling.get("DesiredSize", other_sizes.get(_group_name(group), scaling.get("MinSize", 0)))
        total += (_price(props.get("InstanceTypes") or []) or 0.0) * size
    return total


def _gpu_instance(template: dict, phase: str) -> tuple[str, float]:
    for group in _resources(template, "AWS::EKS::Nodegroup").values():
        if _group_name(group) == phase:
            types = group["Properties"].get("InstanceTypes") or ["?"]
            return types[0], _price(types) or 0.0
    return "?", 0.0


def _roll_effect(name: str) -> str:
    if name == "system":
        return (
            "each is drained and replaced; the KubeRay operator, the Ray head and the add-ons move, and a moved "
            "head restarts the Ray cluster's workers with it"
        )
    return f"each is drained and replaced; with one node, {name} is offline while its replica moves and loads the model"


def _autoscaler_values_follow_the_minor(change: ResourceChange, old: dict, new: dict, minors: tuple[str, str]) -> bool:
    """The Cluster Autoscaler chart's values differ only by the image tag its release table gives each minor."""
    before = old.get("Resources", {}).get(change.logical_id, {}).get("Properties", {})
    after = new.get("Resources", {}).get(change.logical_id, {}).get("Properties", {})
    if after.get("Chart") != CLUSTER_AUTOSCALER.chart or set(change.properties) - {"Values"}:
        return False
    tags = [CLUSTER_AUTOSCALER_RELEASES.get(m) for m in minors]
    if None in tags:
        return False
    return json.dumps(before.get("Values")).replace(str(tags[0]), str(tags[1])) == json.dumps(after.get("Values"))


def _part_of_the_version_step(change: ResourceChange, old: dict, new: dict, minors: tuple[str, str]) -> bool:
    """A change the Kubernetes minor itself makes: the control plane's and the node groups' Version (and AMI
    release), the add-ons' versions, the kubectl layer that matches the minor, the autoscaler's image."""
    props = set(change.properties)
    if change.op != "~":
        return False
    if change.type == "AWS::EKS::Cluster":
        return props <= {"Version"}
    if change.type == "AWS::EKS::Nodegroup":
        return props <= {"Version", "ReleaseVersion"}
    if change.type == "AWS::EKS::Addon":
        return props <= {"AddonVersion"}
    if change.type == "AWS::Lambda::LayerVersion":
        description = str(new.get("Resources", {}).get(change.logical_id, {}).get("Properties", {}).get("Description"))
        return "kubectl" in description.lower()
    if change.type == HELM_CHART_TYPE:
        return _autoscaler_values_follow_the_minor(change, old, new, minors)
    return False


def _upgrade_lines(old: dict, new: dict, changes: list[ResourceChange], preview: Preview, config: Any) -> None:
    """A Kubernetes upgrade step (config/upgrade.py): what moves now, the deploys that follow, and any other
    change in the same deploy, which the upgrade step refuses to carry."""
    before, before_groups = kubernetes_versions(old)
    after, after_groups = kubernetes_versions(new)
    moved = [
        g for g in NODE_GROUP_ORDER if g in before_groups and after_groups.get(g, before_groups[g]) != before_groups[g]
    ]
    control_plane_moves = bool(before and after and before != after)
    if not (control_plane_moves or moved):
        return
    if control_plane_moves:
        stay = sorted(set(after_groups.values()))
        addons = [c.logical_id for c in changes if c.type == "AWS::EKS::Addon"]
        preview.upgrade.append(
            f"control plane: Kubernetes {before} -> {after}, upgraded in place by EKS (the API stays up); "
            f"the node groups stay at {', '.join(stay) or before} in this deploy; "
            + (
                f"{len(addons)} add-on(s) move to the versions pinned for {after} (config/versions.py)"
                if addons
                else f"the add-ons already run versions at or above those pinned for {after}"
            )
        )
    for group in moved:
        preview.upgrade.append(
            f"{group} nodes: Kubernetes {before_groups[group]} -> {after_groups[group]} (rolled below)"
        )
    if config is not None and after:
        cluster = config.cluster
        later = remaining_steps(
            target=cluster.kubernetes_version,
            group_targets=cluster.node_group_versions(),
            deployed=after,
            deployed_groups={g: v for g, v in after_groups.items() if g in before_groups},
        )
        if later:
            preview.upgrade.append("then one `make deploy` each, with no other edit: " + "; ".join(later))
        else:
            preview.upgrade.append("the last step of the upgrade: every node group then runs the control plane's minor")
    minors = (before or after or "", after or before or "")
    others = [c.logical_id for c in changes if not _part_of_the_version_step(c, old, new, minors)]
    if others:
        shown = ", ".join(others[:5]) + (f" and {len(others) - 5} more" if len(others) > 5 else "")
        preview.two_deploys.append(
            f"a Kubernetes upgrade step goes alone, and this deploy also changes {shown}: deploy the other edits first "
            "with the versions that run now, or after the upgrade's last step"
        )


def _release_lines(old: dict, new: dict, changes: list[ResourceChange], preview: Preview, config: Any) -> None:
    """An AMI release roll (config/releases.py): the group it rolls, the groups that follow one deploy each,
    and what EKS will not take in the same update of a node group."""
    _, old_releases, _ = releases_in(old)
    _, new_releases, _ = releases_in(new)
    _, old_groups = kubernetes_versions(old)
    _, new_groups = kubernetes_versions(new)
    rolled = [
        g
        for g in NODE_GROUP_ORDER
        if g in old_groups
        and old_groups.get(g) == new_groups.get(g)
        and new_releases.get(g) not in (None, old_releases.get(g))
    ]
    for group in rolled:
        before = old_releases.get(group, "the release it runs")
        preview.upgrade.append(f"{group} nodes: AMI release {before} -> {new_releases[group]} (rolled below)")
    if rolled and config is not None:
        waiting = [
            g
            for g in NODE_GROUP_ORDER
            if g in new_releases
            and (pinned := release_pin(config.cluster, g, new_groups.get(g, ""))) is not None
            and ami_order(pinned) > ami_order(new_releases[g])
        ]
        if waiting:
            preview.upgrade.append(
                "then one `make deploy` each, with no other edit: "
                + "; ".join(
                    f"{g} nodes to AMI release {release_pin(config.cluster, g, new_groups[g])}" for g in waiting
                )
            )
    old_addons, _, _ = releases_in(old)
    new_addons, _, _ = releases_in(new)
    control_plane_moves = kubernetes_versions(old)[0] != kubernetes_versions(new)[0]
    for name in sorted(set(old_addons) | set(new_addons)):
        runs, moves_to = old_addons.get(name), new_addons.get(name)
        if moves_to is not None and runs != moves_to and not control_plane_moves:
            preview.upgrade.append(
                f"add-on {name}: {runs or 'the version it runs'} -> {moves_to}, updated in place by EKS"
            )
    for change in changes:
        if change.type == "AWS::EKS::Nodegroup" and change.op == "~":
            # A Version change with other edits is the upgrade step's refusal (_upgrade_lines).
            others = sorted(set(change.properties) - {"ReleaseVersion"})
            if "ReleaseVersion" in change.properties and others and "Version" not in others:
                preview.two_deploys.append(
                    f"{change.logical_id} changes ReleaseVersion together with {', '.join(others)}: EKS refuses "
                    '"Version and ReleaseVersion updates ... combined with other updates"; deploy the other edits '
                    "first, then the release"
                )


def _node_lines(old: dict, new: dict, changes: dict[str, ResourceChange], preview: Preview) -> None:
    old_groups, new_groups = _resources(old, "AWS::EKS::Nodegroup"), _resources(new, "AWS::EKS::Nodegroup")
    changed_templates = {c.logical_id for c in changes.values() if c.type == "AWS::EC2::LaunchTemplate" and c.op == "~"}
    for logical_id in sorted(set(old_groups) | set(new_groups)):
        group = new_groups.get(logical_id) or old_groups[logical_id]
        name = _group_name(group)
        change = changes.get(logical_id)
        template_id = _ref((group.get("Properties", {}).get("LaunchTemplate") or {}).get("Id"))
        if change is None and template_id not in changed_templates:
            continue
        if change and change.op == "+":
            preview.nodes.append(f"{name}: a new node group")
            continue
        if change and change.op == "-":
            preview.nodes.append(f"{name}: the node group is deleted; its nodes are drained and terminated")
            continue
        if change and (change.replaced or change.may_be_replaced):
            why = ", ".join(p for p, impact in change.properties.items() if "replace" in impact) or "its properties"
            verb = "replaced" if change.replaced else "may be replaced"
            preview.nodes.append(
                f"{name}: nodes {verb} ({why}): a new group is created, then the old one's nodes are drained and "
                f"terminated; {name}'s replicas restart on the new nodes and load the model again"
            )
            continue
        rolling = sorted(set(change.properties if change else {}) & ROLLING_PROPERTIES)
        if template_id in changed_templates:
            rolling = [*rolling, "its launch template"]
        if rolling:
            preview.nodes.append(f"{name}: nodes rolled one at a time ({', '.join(rolling)}): {_roll_effect(name)}")
        old_scaling = old_groups.get(logical_id, {}).get("Properties", {}).get("ScalingConfig") or {}
        new_scaling = new_groups.get(logical_id, {}).get("Properties", {}).get("ScalingConfig") or {}
        bounds = [
            f"{key.removesuffix('Size').lower()} {old_scaling.get(key)} -> {new_scaling.get(key)}"
            for key in ("MinSize", "MaxSize")
            if old_scaling.get(key) != new_scaling.get(key)
        ]
        if bounds:
            preview.nodes.append(f"{name}: scaling bounds {', '.join(bounds)}; no node is replaced")
        before_size, after_size = old_scaling.get("DesiredSize"), new_scaling.get("DesiredSize")
        resized = before_size != after_size
        if after_size is None and before_size is not None:
            preview.nodes.append(
                f"{name}: the template stops setting DesiredSize ({before_size}): EKS keeps the group's size, which "
                "Cluster Autoscaler owns from now on; no node is added or removed for it"
            )
        elif after_size is not None and after_size != before_size:
            preview.warnings.append(
                f"{name}: DesiredSize {'unset' if before_size is None else before_size} -> {after_size}: EKS resizes "
                "the group to it at once, terminating nodes above it while they serve (the group's size now is "
                "outside the new min_size..max_size)"
            )
        if not (rolling or bounds or resized) and change:
            props = ", ".join(change.properties) or "metadata"
            preview.nodes.append(f"{name}: updated in place ({props}); no node is replaced")


def _ray_service_lines(old: dict, new: dict, preview: Preview, config: Any) -> None:
    before, after = ray_service_of(old), ray_service_of(new)
    if before == after:
        return
    if before is None:
        preview.ray_service.append("created: the cluster starts, loads the model and serves")
        return
    if after is None:
        preview.ray_service.append("deleted: serving stops")
        return
    old_spec, new_spec = before["spec"], after["spec"]
    strategy = (new_spec.get("upgradeStrategy") or {}).get("type", "NewCluster")
    spec_changes = cluster_spec_hash(old_spec["rayClusterConfig"]) != cluster_spec_hash(new_spec["rayClusterConfig"])
    operator = _chart_versions(old).get(KUBERAY_OPERATOR.chart), _chart_versions(new).get(KUBERAY_OPERATOR.chart)
    if spec_changes and strategy == "NewCluster" and operator[0] and operator[1] and operator[0] != operator[1]:
        # KubeRay v1.7.0, ray-operator/controllers/ray/rayservice_controller.go: shouldUpdateCluster is true for
        # the active cluster whenever its ray.io/kuberay-version annotation differs from the running operator's
        # (:1363-1366), and reconcileRayCluster then writes the goal spec into that cluster in place
        # (modifyRayCluster, :1442-1467) and refreshes its hash annotation, so no new cluster follows.
        preview.two_deploys.append(
            f"the KubeRay operator moves {operator[0]} -> {operator[1]} while the RayCluster spec changes: the new "
            "operator's first reconcile sees an older ray.io/kuberay-version on the serving cluster and writes the new "
            "spec into it in place (its pods keep the old one) instead of building a new cluster; deploy the chart "
            "bump first (`make upgrade-crds` before it) with the spec that runs, then the spec change"
        )
    if spec_changes:
        if strategy == "NewCluster":
            preview.ray_service.append(_new_cluster_line(new, new_spec, config))
        else:
            preview.ray_service.append(
                f"the cluster spec changes but upgradeStrategy is {strategy}: KubeRay does not roll it; the running "
                "cluster keeps the old spec"
            )
    elif old_spec.get("serveConfigV2") != new_spec.get("serveConfigV2"):
        preview.ray_service.append(
            "in place: Serve redeploys the app on the running cluster; each phase's replicas are replaced and load "
            "the model, so a phase with one replica is offline for a model load"
        )
    else:
        changed = sorted(
            key
            for key in set(old_spec) | set(new_spec)
            if key not in ("rayClusterConfig", "serveConfigV2") and old_spec.get(key) != new_spec.get(key)
        )
        if old_spec["rayClusterConfig"] != new_spec["rayClusterConfig"]:
            changed.append("worker replica bounds")
        if before.get("metadata") != after.get("metadata"):
            changed.append("metadata")
        preview.ray_service.append(f"{', '.join(changed) or 'nothing KubeRay reads'}: no rollout, no model load")


def _new_cluster_line(new: dict, spec: dict, config: Any) -> str:
    extra, cost = [], 0.0
    for group in spec["rayClusterConfig"].get("workerGroupSpecs") or []:
        phase = group.get("groupName", "").removesuffix("-gpu")
        count = int(group.get("replicas", group.get("minReplicas", 0)) or 0)
        instance, price = _gpu_instance(new, phase)
        extra.append(f"{count} {phase} ({instance})")
        cost += count * price
    minutes = ""
    if config is not None:
        try:
            from planner.from_config import plan_config

            scaling = plan_config(config).scaling
            times = [t[0].total for t in getattr(scaling, "replica_times", {}).values() if t]
            if times:
                minutes = f" for about {max(times) / 60:.0f} minutes (the planner's time to a serving replica)"
        except Exception as error:  # the plan is a courtesy here; the diff stands without it
            minutes = f" (no planner estimate: {error})"
    return (
        f"new cluster: KubeRay builds a second RayCluster with {', '.join(extra)} GPU worker(s), as many extra "
        f"GPU nodes{minutes}, about ${cost:.2f}/h more while both run, then switches the Service and deletes the "
        f"old cluster after rayClusterDeletionDelaySeconds ({spec.get('rayClusterDeletionDelaySeconds', 60)} s)"
    )


def _access_lines(old: dict, new: dict, changes: dict[str, ResourceChange], preview: Preview) -> None:
    old_entries = {
        k: _principal(r["Properties"]["PrincipalArn"]) for k, r in _resources(old, "AWS::EKS::AccessEntry").items()
    }
    new_entries = {
        k: _principal(r["Properties"]["PrincipalArn"]) for k, r in _resources(new, "AWS::EKS::AccessEntry").items()
    }
    for principal in sorted(set(new_entries.values()) - set(old_entries.values())):
        preview.access.append(f"gains cluster admin: {principal}")
    for principal in sorted(set(old_entries.values()) - set(new_entries.values())):
        preview.access.append(f"loses cluster admin: {principal}")
    # CloudFormation creates an entry before it deletes the one it replaces or drops, and EKS refuses
    # a second entry for a principal ("can't be included in more than one access entry").
    for logical_id, principal in new_entries.items():
        change = changes.get(logical_id)
        created = change is not None and (change.op == "+" or change.replaced)
        held_elsewhere = [k for k, p in old_entries.items() if p == principal and k != logical_id]
        if created and held_elsewhere:
            preview.warnings.append(
                f"the access entry for {principal} moves from {held_elsewhere[0]} to {logical_id}: CloudFormation "
                "creates the new entry before it deletes the old one, EKS refuses a second entry for the same "
                "principal, and the update rolls back"
            )


def _creator_admin_line(new: dict, preview: Preview, config: Any) -> None:
    if not creator_is_admin(new):
        return
    cluster = config.cluster_name if config is not None else "<cluster>"
    account = config.aws.account if config is not None else "<account>"
    region = config.aws.region if config is not None else "<region>"
    preview.warnings.append(
        "the cluster was created with its creator as an admin: CloudFormation's execution role holds a "
        "cluster-admin access entry outside the stack (it can only be turned off at creation); remove it with "
        f"`aws eks delete-access-entry --cluster-name {cluster} --region {region} --principal-arn "
        f"arn:aws:iam::{account}:role/cdk-hnb659fds-cfn-exec-role-{account}-{region}` (the default bootstrap's role)"
    )


def _chart_versions(template: dict) -> dict[str, str]:
    return {
        r["Properties"]["Chart"]: r["Properties"].get("Version", "")
        for r in _resources(template, "Custom::AWSCDK-EKS-HelmChart").values()
    }


def _chart_lines(old: dict, new: dict, preview: Preview) -> None:
    before, after = _chart_versions(old), _chart_versions(new)
    for chart in sorted(set(before) | set(after)):
        if chart not in before:
            preview.charts.append(f"{chart} {after[chart]}: installed")
        elif chart not in after:
            preview.charts.append(f"{chart} {before[chart]}: uninstalled")
        elif before[chart] != after[chart]:
            note = "; run `make upgrade-crds` first (Helm never upgrades CRDs)" if chart == "kuberay-operator" else ""
            preview.charts.append(f"{chart}: {before[chart]} -> {after[chart]} (helm upgrade){note}")


def _mount_driver_lines(old: dict, changes: list[ResourceChange], preview: Preview) -> None:
    """A Secrets Store chart removed while the deployed RayService's pods mount through it: the
    kubelet unmounts a CSI volume through its driver, so those pods would stay Terminating."""
    if not secrets_store_mounted(old):
        return
    charts = _resources(old, HELM_CHART_TYPE)
    for change in changes:
        chart = charts.get(change.logical_id, {}).get("Properties", {}).get("Chart")
        if change.op == "-" and chart in CSI_CHARTS:
            preview.stateful.append(
                f"REMOVED: the {chart} chart {change.logical_id}: the serving RayCluster's pods mount secrets "
                "through it, and without it their volumes cannot unmount (the pods stay Terminating); in two "
                "deploys: `make deploy` keeps it while the deployed RayService mounts through it and removes it "
                "in the deploy after"
            )


def _store_shape(template: dict) -> tuple[int, bool] | None:
    store = deployed_gcs_store(template)
    return (store.nodes, store.failover) if store else None


def _on_off(flag: bool) -> str:
    return "on" if flag else "off"


def _store_lines(old: dict, new: dict, preview: Preview, config: Any) -> None:
    """The GCS store's replica and failover, one step at a time (``cdk_constructs.gcs_store.replication_step``
    cites ElastiCache's rule), and a store kept one deploy longer for the cluster that serves."""
    before, after = _store_shape(old), _store_shape(new)
    if before and after and before != after:
        (nodes_before, failover_before), (nodes_after, failover_after) = before, after
        change = (
            f"NumCacheClusters {nodes_before} -> {nodes_after}, automatic failover "
            f"{_on_off(failover_before)} -> {_on_off(failover_after)}"
        )
        if failover_after and not failover_before and nodes_before < 2:
            preview.two_deploys.append(
                f'GCS store: {change} in one update, which ElastiCache refuses ("must have at least one read '
                f'replica to enable autofailover"); deploy first with NumCacheClusters {nodes_after}, failover off '
                "(`make deploy` takes that step itself from the deployed template)"
            )
        elif failover_before and nodes_after < 2:
            preview.two_deploys.append(
                f"GCS store: {change} in one update, which ElastiCache refuses (no removing the last replica while "
                f"failover is on); deploy first with NumCacheClusters {nodes_before}, failover off (`make deploy` "
                "takes that step itself from the deployed template)"
            )
        else:
            preview.store.append(f"{change}: updated in place; the primary keeps serving the GCS")
    if after and config is not None and config.gcs_fault_tolerant:
        target = (2, True) if config.gcs_store_multi_az else (1, False)
        if after != target:
            preview.store.append(
                f"the next `make deploy` goes on to NumCacheClusters {target[0]}, automatic failover "
                f"{_on_off(target[1])}: ElastiCache takes a replica and failover one update at a time"
            )
    old_store, new_store = deployed_gcs_store(old), deployed_gcs_store(new)
    if old_store and old_store.in_use and new_store and not new_store.in_use:
        preview.store.append(
            "kept for this deploy: the RayCluster serving now keeps its GCS there until KubeRay deletes it after "
            "the switch to the new cluster; a later `make deploy` removes the store and its AUTH token (with "
            "ALLOW_REPLACEMENT=1) once kubectl lists no RayCluster that uses it"
        )


def _where(change: ResourceChange) -> str:
    return f" ({change.path})" if change.path else ""


def mark_nested_replacements(old: dict, new: dict, changes: list[ResourceChange]) -> None:
    """Marks the updates that a nested property turns into a replacement (``preview/spec.py``), which the
    CLI's diff shows as plain updates."""
    old_resources, new_resources = old.get("Resources", {}), new.get("Resources", {})
    for change in changes:
        if change.op != "~" or change.replaced:
            continue
        nested = nested_replacements(
            change.type,
            old_resources.get(change.logical_id, {}).get("Properties", {}),
            new_resources.get(change.logical_id, {}).get("Properties", {}),
        )
        if nested:
            change.properties.update(nested)
            worst = "replace" if "replace" in nested.values() else "may be replaced"
            change.impact = f"{worst} (nested: {', '.join(sorted(nested))}, by CloudFormation's resource specification)"


def summarize(old: dict, new: dict, changes: list[ResourceChange], *, config: Any = None) -> Preview:
    mark_nested_replacements(old, new, changes)
    preview = Preview(changes=changes)
    by_id = {c.logical_id: c for c in changes}
    old_resources = old.get("Resources", {})
    in_use = used_by_serving(old)
    for change in changes:
        loss = stateful_loss(change.type)
        if loss is None:
            continue
        serving = IN_USE if change.logical_id in in_use else ""
        if change.replaced or change.may_be_replaced:
            verb = "REPLACED" if change.replaced else "MAY BE REPLACED"
            preview.stateful.append(f"{verb}: {change.type} {change.logical_id}{_where(change)}: {loss}{serving}")
        elif change.op == "-":
            policy = old_resources.get(change.logical_id, {}).get("DeletionPolicy", "Delete")
            if policy == "Retain":
                preview.warnings.append(
                    f"{change.type} {change.logical_id} leaves the stack but is kept (DeletionPolicy Retain)"
                )
            else:
                preview.stateful.append(f"REMOVED: {change.type} {change.logical_id}{_where(change)}: {loss}{serving}")
    preview.refused += named_replacements(old, new, changes)
    preview.two_deploys += moved_names(old, new, changes)
    _mount_driver_lines(old, changes, preview)
    _store_lines(old, new, preview, config)
    _node_lines(old, new, by_id, preview)
    _upgrade_lines(old, new, changes, preview, config)
    _release_lines(old, new, changes, preview, config)
    _ray_service_lines(old, new, preview, config)
    _access_lines(old, new, by_id, preview)
    _creator_admin_line(new, preview, config)
    _chart_lines(old, new, preview)
    explained = {"AWS::EKS::Nodegroup", "AWS::EKS::AccessEntry", HELM_CHART_TYPE}
    preview.other = sum(
        1
        for c in changes
        if c.type not in explained and stateful_loss(c.type) is None and not c.path.endswith(RAY_SERVICE_PATH)
    )
    before, after = _group_cost(old, new), _group_cost(new, old)
    if round(before, 4) != round(after, 4):
        preview.cost = f"node groups ${before:.2f} -> ${after:.2f} (at their desired sizes, on-demand)"
    return preview
