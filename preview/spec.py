"""What CloudFormation's resource specification says beyond the CDK CLI's diff: replacements caused by
a nested property, and which resource types hold state.

The CLI marks a resource "replace" only for a top-level property that causes replacement. Its own
copy of CloudFormation's resource specification (``db.json.gz`` in the aws-cdk package, the data
its diff reads) also marks properties of nested types: ``AWS::EKS::Cluster``'s
``AccessConfig.BootstrapClusterCreatorAdminPermissions`` says ``causesReplacement: yes`` while the
diff shows the change as an ordinary update. This reads that same data for the properties below
the top level.
"""

from __future__ import annotations

import gzip
import json
from functools import lru_cache
from pathlib import Path
from typing import Any

SPEC_DB = Path(__file__).resolve().parent.parent / "node_modules" / "aws-cdk" / "db.json.gz"
# A resource entity's mark for a type that holds data (the same list cfn-lint's I3011 reads).
STATEFUL_MARK = "isStateful"


@lru_cache(maxsize=1)
def _entities(path: Path = SPEC_DB) -> tuple[dict[str, dict], dict[str, dict]]:
    """(resource type -> its entity, type definition id -> its properties)."""
    schema = json.loads(gzip.decompress(path.read_bytes()))["schema"]
    resources = {r["cloudFormationType"]: r for r in schema["resource"]["entities"]}
    types = {t["$id"]: t.get("properties", {}) for t in schema["typeDefinition"]["entities"]}
    return resources, types


@lru_cache(maxsize=1)
def stateful_types() -> frozenset[str]:
    """The resource types the specification marks as holding state (``isStateful``: databases, caches,
    secrets, buckets, keys, log groups; the list cfn-lint's I3011 reads too): what deleting or
    replacing one loses cannot be synthesized again."""
    resources, _ = _entities()
    return frozenset(name for name, r in resources.items() if r.get(STATEFUL_MARK))


def _spec() -> tuple[dict[str, dict], dict[str, dict]]:
    """(resource type -> its properties, type definition id -> its properties)."""
    resources, types = _entities()
    return {name: r.get("properties", {}) for name, r in resources.items()}, types


def primary_identifier(resource_type: str) -> list[str]:
    """The properties that name a resource of this type (``LogGroupName``, an EKS cluster's ``Name``)."""
    return list(_entities()[0].get(resource_type, {}).get("primaryIdentifier", []))


def physical_name(resource_type: str, properties: dict) -> tuple | None:
    """The name a template gives the resource itself, when each part of its primary identifier is a literal
    in the template: CloudFormation can then neither replace it nor create a second one beside it."""
    parts = primary_identifier(resource_type)
    values = tuple(properties.get(part) for part in parts)
    if parts and all(isinstance(v, (str, int)) for v in values):
        return (resource_type, *values)
    return None


def nested_replacements(resource_type: str, old: dict, new: dict) -> dict[str, str]:
    """Dotted nested property -> "replace" or "may be replaced", for each nested property whose change
    the specification says replaces the resource."""
    resources, types = _spec()
    found: dict[str, str] = {}

    def walk(spec: dict[str, Any], before: Any, after: Any, prefix: str) -> None:
        before = before if isinstance(before, dict) else {}
        after = after if isinstance(after, dict) else {}
        for name, prop in spec.items():
            old_value, new_value = before.get(name), after.get(name)
            if old_value == new_value:
                continue
            if prefix and prop.get("causesReplacement") in ("yes", "maybe"):
                found[f"{prefix}{name}"] = "replace" if prop["causesReplacement"] == "yes" else "may be replaced"
                continue
            kind = prop.get("type", {})
            if kind.get("type") == "ref":
                walk(types.get(kind["reference"]["$ref"], {}), old_value, new_value, f"{prefix}{name}.")

    walk(resources.get(resource_type, {}), old, new, "")
    return found
