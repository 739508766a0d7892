"""Kubernetes' own OpenAPI schemas (``kubernetes-validate``, strict: an unknown field is an error) for
built-in kinds, and the CRDs' structural schemas for custom resources.

The API server prunes a field a CRD's schema does not declare without a word, so a custom
resource is checked against its CRD with unknown fields refused, as the built-in kinds are.
"""

from __future__ import annotations

import copy
import functools
import re
from collections.abc import Iterable
from typing import Any

import jsonschema
import kubernetes_validate
from kubernetes_validate import utils as schemas
from referencing import Registry, Resource

CrdSchemas = dict[tuple[str, str], dict]  # (apiVersion, kind) -> schema


def strict_structural(schema: Any) -> None:
    """Makes a CRD's structural schema reject what the API server would prune (in place)."""
    if not isinstance(schema, dict):
        return
    if (
        schema.get("type") == "object"
        and "properties" in schema
        and not schema.get("x-kubernetes-preserve-unknown-fields")
    ):
        schema.setdefault("additionalProperties", False)
    for key in ("properties", "patternProperties", "definitions"):
        for child in schema.get(key, {}).values():
            strict_structural(child)
    for key in ("items", "additionalProperties", "not"):
        if isinstance(schema.get(key), dict):
            strict_structural(schema[key])
    for key in ("allOf", "anyOf", "oneOf"):
        for child in schema.get(key, []):
            strict_structural(child)


def crd_schemas(crds: Iterable[dict]) -> CrdSchemas:
    """Every served version of every CRD given, strict."""
    schemas: CrdSchemas = {}
    for crd in crds:
        if crd.get("kind") != "CustomResourceDefinition":
            continue
        group, kind = crd["spec"]["group"], crd["spec"]["names"]["kind"]
        for version in crd["spec"]["versions"]:
            if not version.get("served", True) or "schema" not in version:
                continue
            schema = copy.deepcopy(version["schema"]["openAPIV3Schema"])
            strict_structural(schema)
            # The API server checks metadata as every object's ObjectMeta, not by the CRD.
            schema.setdefault("properties", {})["metadata"] = {"type": "object"}
            schemas[(f"{group}/{version['name']}", kind)] = schema
    return schemas


class NoSchema(LookupError):
    pass


@functools.cache
def _definitions(schema_dir: str) -> Resource:
    return Resource.from_contents(
        schemas.schema_contents(f"kubernetes-json-schema/{schema_dir}/_definitions.json", schema_dir)
    )


@functools.cache
def builtin_validator(kube_version: str, api_version: str, kind: str) -> jsonschema.Draft202012Validator:
    """kubernetes-validate's strict schema of a kind, looked up as ``kubernetes_validate.validate``
    does (the newest schema not newer than the version; ``rbac.authorization.k8s.io/v1`` is
    ``rbac-v1``), but loaded once: its 1.6 MB definitions file is otherwise parsed per object."""
    minor = schemas.major_minor(kube_version.removeprefix("v"))
    if minor > schemas.latest_version():
        raise kubernetes_validate.VersionNotSupportedError(version=minor)
    version = [v for v in schemas.all_versions() if schemas.major_minor(v) <= minor][-1]
    schema_dir = f"v{version}-local-strict"
    group_version = re.sub(r"^([^./]*)(?:\.[^/]*)?/", r"\1-", api_version)
    try:
        schema = schemas.schema_contents(
            f"kubernetes-json-schema/{schema_dir}/{kind.lower()}-{group_version}.json", minor
        )
    except FileNotFoundError:
        raise NoSchema(kind) from None
    resource = Resource.from_contents(schema)
    registry: Registry = resource @ (_definitions(schema_dir) @ Registry())
    return jsonschema.Draft202012Validator(schema, registry=registry)


def describe(item: dict) -> str:
    metadata = item.get("metadata") or {}
    where = f"{metadata['namespace']}/" if metadata.get("namespace") else ""
    return f"{item.get('kind')} {where}{metadata.get('name')} ({item.get('apiVersion')})"


def _path(error: jsonschema.ValidationError) -> str:
    return ".".join(str(part) for part in error.absolute_path) or "(top)"


def object_errors(item: dict, kube_version: str, crds: CrdSchemas) -> list[str]:
    """What the API server of ``kube_version`` (or the CRD) would refuse or drop in one object."""
    custom = crds.get((item.get("apiVersion", ""), item.get("kind", "")))
    if custom is not None:
        validator = jsonschema.Draft7Validator(custom)
        return [
            f"{describe(item)}: {error.message} at {_path(error)}"
            for error in sorted(validator.iter_errors(item), key=lambda e: list(map(str, e.absolute_path)))
        ]
    try:
        validator = builtin_validator(kube_version, item.get("apiVersion", ""), item.get("kind", ""))
    except NoSchema:
        return [
            f"{describe(item)}: Kubernetes {kube_version} has no such kind and no CRD the stack installs defines it"
        ]
    return [f"{describe(item)}: {error.message} at {_path(error)}" for error in validator.iter_errors(item)]
