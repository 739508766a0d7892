"""The one class of change a deploy makes, and the updates CloudFormation would refuse half-way.

Every edit of a config lands in exactly one class, the most disruptive that applies:

- in place: resources updated where they stand; serving goes on (a Serve redeploy included);
- nodes roll: a node group's nodes are drained and replaced, one at a time or as a new group;
- new Ray cluster: KubeRay builds a second RayCluster and switches to it;
- stateful replacement: something that holds state is replaced or removed (ALLOW_REPLACEMENT=1);
- two deploys: CloudFormation would refuse the update as one step; a first deploy must come before;
- refused: no deploy can make this change to the running stack (it rolls back whatever the order).

The rules below are the update rules that CloudFormation's resource schemas do not carry; each
names its source.
"""

from __future__ import annotations

from enum import IntEnum
from typing import Any

from preview.cdk_diff import ResourceChange
from preview.spec import physical_name


class ChangeClass(IntEnum):
    IN_PLACE = 0
    NODES_ROLL = 1
    NEW_RAY_CLUSTER = 2
    STATEFUL_REPLACEMENT = 3
    TWO_DEPLOYS = 4
    REFUSED = 5

    @property
    def label(self) -> str:
        return self.name.lower().replace("_", " ").replace("ray", "Ray")


def classify(preview: Any) -> ChangeClass:
    """The most disruptive class a preview (``preview.serving.Preview``) shows."""
    if preview.refused:
        return ChangeClass.REFUSED
    if preview.two_deploys:
        return ChangeClass.TWO_DEPLOYS
    if preview.stateful:
        return ChangeClass.STATEFUL_REPLACEMENT
    if any(line.startswith("new cluster") for line in preview.ray_service):
        return ChangeClass.NEW_RAY_CLUSTER
    if any(word in line for line in preview.nodes for word in ("nodes rolled", "nodes replaced", "may be replaced")):
        return ChangeClass.NODES_ROLL
    return ChangeClass.IN_PLACE


def named_replacements(old: dict, new: dict, changes: list[ResourceChange]) -> list[str]:
    """Replacements of a resource the template names itself. CloudFormation creates the replacement
    before it deletes the old one, so the name is taken: "CloudFormation cannot update a stack when a
    custom-named resource requires replacing" (AWS CloudFormation User Guide, "Name type"). No order of
    deploys helps while the name stays."""
    found = []
    for change in changes:
        if not (change.replaced or change.may_be_replaced):
            continue
        before = old.get("Resources", {}).get(change.logical_id, {}).get("Properties", {})
        after = new.get("Resources", {}).get(change.logical_id, {}).get("Properties", {})
        name = physical_name(change.type, after)
        if name is not None and name == physical_name(change.type, before):
            found.append(
                f"{change.type} {change.logical_id} would be replaced ({change.impact}) but keeps its name "
                f"{'/'.join(map(str, name[1:]))}: CloudFormation cannot replace a custom-named resource, and the "
                "update rolls back"
            )
    return found


def moved_names(old: dict, new: dict, changes: list[ResourceChange]) -> list[str]:
    """A named resource that leaves one logical id for another in the same deploy: CloudFormation creates
    the new one (the name still taken: AlreadyExists) before it deletes the old. Deploy once without the
    resource, then with it."""
    removed = {
        physical_name(c.type, old.get("Resources", {}).get(c.logical_id, {}).get("Properties", {})): c.logical_id
        for c in changes
        if c.op == "-"
    }
    found = []
    for change in changes:
        if change.op != "+":
            continue
        name = physical_name(change.type, new.get("Resources", {}).get(change.logical_id, {}).get("Properties", {}))
        if name is not None and name in removed:
            found.append(
                f"{change.type} {'/'.join(map(str, name[1:]))} moves from {removed[name]} to {change.logical_id}: "
                "CloudFormation creates the new one while the old one still holds the name, and the update rolls "
                "back; deploy once with the resource removed, then again with it"
            )
    return found
