"""The resource changes between two templates, decided by CloudFormation's own resource schemas.

The CDK CLI's diff is the authority on what a deploy replaces, but one run costs seconds of Node
start-up, so a rehearsal of hundreds of edits cannot pay it for each. This reads the same facts
from the registry schemas that cfn-lint bundles (``createOnlyProperties``: a change replaces the
resource; ``conditionalCreateOnlyProperties``: it may, depending on other properties or the update
strategy) and returns the changes in the CLI's shape (``preview.cdk_diff.ResourceChange``), so that
``preview.serving.summarize`` reads both alike. A test holds a representative of each change class
against the CLI's own diff.
"""

from __future__ import annotations

from functools import cache
from typing import Any

from preview.cdk_diff import ResourceChange

# The schemas are the same in every commercial region for the types this stack uses.
SCHEMA_REGION = "us-east-1"
# What CloudFormation compares on update besides Properties; Metadata (the CDK's path) changes nothing.
COMPARED_KEYS = ("Properties", "DependsOn", "DeletionPolicy", "UpdateReplacePolicy", "Condition")


@cache
def schema(resource_type: str) -> dict[str, Any]:
    """The registry schema of a resource type (empty for custom resources and unknown types)."""
    from cfnlint.schema import PROVIDER_SCHEMA_MANAGER, ResourceNotFoundError

    try:
        return PROVIDER_SCHEMA_MANAGER.get_resource_schema(SCHEMA_REGION, resource_type).schema
    except ResourceNotFoundError:
        return {}


def _pointers(resource_type: str, key: str) -> list[tuple[str, ...]]:
    return [tuple(p.removeprefix("/properties/").split("/")) for p in schema(resource_type).get(key, [])]


def create_only(resource_type: str) -> list[tuple[str, ...]]:
    """Property paths whose change replaces the resource."""
    return _pointers(resource_type, "createOnlyProperties")


def conditionally_create_only(resource_type: str) -> list[tuple[str, ...]]:
    """Property paths whose change may replace the resource (e.g. an AuthToken without its update strategy)."""
    return _pointers(resource_type, "conditionalCreateOnlyProperties")


def primary_identifier(resource_type: str) -> list[tuple[str, ...]]:
    return _pointers(resource_type, "primaryIdentifier")


def _at(properties: Any, path: tuple[str, ...]) -> Any:
    for part in path:
        if part == "*" or not isinstance(properties, dict):
            return properties
        properties = properties.get(part)
    return properties


def physical_name(resource_type: str, properties: dict) -> tuple | None:
    """The name the template gives the resource itself (its primary identifier, when every part is a
    literal): CloudFormation cannot replace a resource so named, nor create a second one beside it."""
    parts = primary_identifier(resource_type)
    if not parts:
        return None
    values = tuple(_at(properties, path) for path in parts)
    if all(isinstance(v, (str, int)) for v in values):
        return (resource_type, *values)
    return None


def _impact(resource_type: str, old: dict, new: dict) -> tuple[str, dict[str, str]]:
    properties: dict[str, str] = {}
    for name in sorted(set(old) | set(new)):
        if old.get(name) != new.get(name):
            properties[name] = ""
    worst = ""
    for paths, label, level in (
        (conditionally_create_only(resource_type), "may cause replacement", "may be replaced"),
        (create_only(resource_type), "requires replacement", "replace"),
    ):
        for path in paths:
            if _at(old, path) != _at(new, path):
                if len(path) > 1:
                    properties.pop(path[0], None)
                properties[".".join(path)] = label
                worst = level
    return worst, properties


def _references(value: Any) -> set[str]:
    """The logical ids a template value points at (Ref, Fn::GetAtt, ${id} in Fn::Sub)."""
    found: set[str] = set()
    if isinstance(value, dict):
        if isinstance(value.get("Ref"), str):
            found.add(value["Ref"])
        getatt = value.get("Fn::GetAtt")
        if isinstance(getatt, list) and getatt:
            found.add(str(getatt[0]))
        elif isinstance(getatt, str):
            found.add(getatt.split(".")[0])
        sub = value.get("Fn::Sub")
        text = sub[0] if isinstance(sub, list) and sub else sub
        if isinstance(text, str):
            found |= {part.split("}")[0].split(".")[0] for part in text.split("${")[1:]}
        for item in value.values():
            found |= _references(item)
    elif isinstance(value, list):
        for item in value:
            found |= _references(item)
    return found


def _propagate_replacements(new: dict, found: list[ResourceChange]) -> None:
    """A replaced resource gets a new physical id, so every create-only property that refers to it
    changes at deploy time although the template's text does not: that resource is replaced too (the
    CDK CLI's diff propagates replacements the same way)."""
    by_id = {c.logical_id: c for c in found}
    resources = new.get("Resources", {})
    replaced = {c.logical_id for c in found if c.op == "~" and "replace" in c.impact}
    grew = True
    while grew:
        grew = False
        for logical_id, resource in resources.items():
            change = by_id.get(logical_id)
            if change is not None and (change.op == "+" or "replace" in change.impact):
                continue
            kind = resource.get("Type", "")
            properties = resource.get("Properties") or {}
            hit = [
                ".".join(path)
                for path in create_only(kind) + conditionally_create_only(kind)
                if _references(_at(properties, path)) & replaced
            ]
            if not hit:
                continue
            if change is None:
                path = (resource.get("Metadata") or {}).get("aws:cdk:path") or ""
                change = ResourceChange(op="~", type=kind, path=path, logical_id=logical_id)
                found.append(change)
                by_id[logical_id] = change
            change.impact = "may be replaced"
            change.properties.update(dict.fromkeys(hit, "may cause replacement"))
            replaced.add(logical_id)
            grew = True


def changes(old: dict, new: dict) -> list[ResourceChange]:
    """Added (+), removed (-) and modified (~) resources, each modification marked "replace" or "may
    be replaced" when a create-only property changes, or refers to a resource that is replaced."""
    before, after = old.get("Resources", {}), new.get("Resources", {})
    found: list[ResourceChange] = []
    for logical_id in sorted(set(before) | set(after)):
        was, now = before.get(logical_id), after.get(logical_id)
        if was is None or now is None:
            resource = now or was or {}
            path = ((resource.get("Metadata") or {}).get("aws:cdk:path") or "") if now else ""
            op = "+" if was is None else "-"
            found.append(ResourceChange(op=op, type=resource.get("Type", ""), path=path, logical_id=logical_id))
            continue
        if was.get("Type") != now.get("Type"):
            found.append(ResourceChange(op="~", type=now["Type"], path="", logical_id=logical_id, impact="replace"))
            continue
        if all(was.get(key) == now.get(key) for key in COMPARED_KEYS):
            continue
        impact, properties = _impact(now["Type"], was.get("Properties") or {}, now.get("Properties") or {})
        path = (now.get("Metadata") or {}).get("aws:cdk:path") or ""
        found.append(
            ResourceChange(
                op="~", type=now["Type"], path=path, logical_id=logical_id, impact=impact, properties=properties
            )
        )
    _propagate_replacements(new, found)
    return found
