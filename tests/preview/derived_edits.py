"""Every edit a user can make to a config, generated from the schema instead of listed.

Each leaf field of ``AppConfig`` (walked through its nested models, so a field added tomorrow is
walked too) yields edits from its type and constraints: a boolean toggled, every other value of a
``Literal``, an integer stepped within its bounds, a float scaled within them, a list grown and
shrunk, a mapping given a key and losing one, an optional section switched on and off. Only where
the type says too little to make a value (a free string, a list of strings) does ``VALUES`` give one.
"""

from __future__ import annotations

import copy
import functools
import operator
import types
import typing
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import annotated_types
from pydantic import BaseModel

from config.schema import AppConfig

ADMIN = "arn:aws:iam::000000000000:role/OnCall"
API_KEY_SECRET = "arn:aws:secretsmanager:us-east-2:000000000000:secret:pd-api-key-b-AbCdEf"

# Values for free strings and lists of strings, by the field's dotted path with each phase or node group
# written as "*": what a user would put there. A field missing here and in the type rules fails the
# test that every field is rehearsed, naming it.
VALUES: dict[str, list[Any]] = {
    "name": ["pd-renamed"],
    "aws.account": ["111111111111"],
    "aws.region": ["eu-west-1"],
    "network.vpc_cidr": ["10.60.0.0/16"],
    "network.availability_zones": ["<grow>", "<shrink>"],
    "network.gpu_availability_zone": ["<another zone>"],
    # The next minor (the rehearsal runs with tests.preview.conftest.next_kubernetes_minor): a downgrade is
    # refused by the synth from the deployed version, as a group held behind the nodes it runs.
    "cluster.kubernetes_version": ["1.37", "1.35"],
    "cluster.*.kubernetes_version": ["1.35"],
    "cluster.endpoint.public_cidrs": [["203.0.113.0/24"]],
    "cluster.admin_principals": [[ADMIN]],
    "cluster.*.instance_type": ["<bigger>"],
    # Older than what the deployed template runs: refused, as a pin never takes an add-on or a node back.
    "cluster.addon_versions": [{"coredns": "v1.13.2-eksbuild.1"}],
    "cluster.*.ami_release_version": ["1.36.2-20260714"],
    "charts.*": ["<patch bump>"],
    "ray_service.namespace": ["llm2"],
    "ray_service.name": ["pd-llm2"],
    # An image config/versions.py does not know: refused without its facts.
    "ray_service.image": ["{registry}/ray:serve-llm-cuda-v1.0.1"],
    "ray_service.image_python_version": ["3.12"],
    "ray_service.image_ca_bundle": ["/etc/ssl/certs/ca-certificates.crt"],
    "ray_service.image_wheel_platform": ["manylinux_2_28_x86_64"],
    "ray_service.ray_version": ["2.58.1"],
    "ray_service.head.cpu": ["3"],
    "ray_service.head.memory": ["12Gi"],
    "ray_service.gcs_fault_tolerance.store.node_type": ["cache.t4g.medium"],
    "ray_service.endpoint.allowed_cidrs": [["10.40.0.0/16"]],
    "ray_service.endpoint.api_key_secrets": [[API_KEY_SECRET]],
    "serving.app_name": ["llm2"],
    "serving.model.model_id": ["mistral-7b-instruct"],
    "serving.model.source": ["mistralai/Mistral-7B-Instruct-v0.3"],
    "serving.model.hf_token_secret": ["arn:aws:secretsmanager:us-east-2:000000000000:secret:hf-token-AbCdEf"],
    "serving.model.config_json": ['{"architectures": ["Qwen2ForCausalLM"]}'],
    "serving.model.hub_id": ["Qwen/Qwen2.5-7B-Instruct"],
    "serving.model.source_region": ["us-west-2"],
    "serving.kv_transfer.side_channel_host": ["0.0.0.0"],
    "serving.*.engine_kwargs": [{"max_num_batched_tokens": 4096}],
    "serving.*.env_vars": [{"VLLM_LOGGING_LEVEL": "DEBUG"}],
    "serving.env_vars": [{"VLLM_LOGGING_LEVEL": "DEBUG"}],
    "serving.api_key_dir": ["/etc/pd-serving/api-keys"],
    "serving.cache_salt_file": ["/etc/pd-serving/cache-salt/salt"],
    "serving.tool_call_parser": ["llama3_json"],
    "serving.reasoning_parser": ["qwen3"],
    "tags": [{"cost-center": "ml-42"}],
    "model_mirror.bucket_name": ["pd-weights-mirror"],
    "observability.amp_workspace_arn": ["arn:aws:aps:us-east-2:000000000000:workspace/ws-0123abcd"],
    "observability.cloudwatch_addon_version": ["v4.1.0-eksbuild.1"],
}


@dataclass(frozen=True)
class Edit:
    field: str  # the dotted path of the field edited
    what: str  # the edit, in a few words
    value: Any  # the new value (a sentinel string for the special cases above); DELETE unsets it


DELETE = object()


def _unwrap(annotation: Any) -> tuple[Any, bool]:
    """(the type inside an Optional, whether None is allowed)."""
    args = typing.get_args(annotation)
    if typing.get_origin(annotation) in (typing.Union, types.UnionType) and type(None) in args:
        rest = [a for a in args if a is not type(None)]
        return functools.reduce(operator.or_, rest), True
    return annotation, False


def _bounds(metadata: list) -> tuple[float | None, float | None, bool]:
    low = high = None
    strict_low = False
    for item in metadata:
        if isinstance(item, annotated_types.Ge):
            low = item.ge
        elif isinstance(item, annotated_types.Gt):
            low, strict_low = item.gt, True
        elif isinstance(item, annotated_types.Le):
            high = item.le
        elif isinstance(item, annotated_types.Lt):
            high = item.lt
    return low, high, strict_low


def _model(annotation: Any) -> type[BaseModel] | None:
    return annotation if isinstance(annotation, type) and issubclass(annotation, BaseModel) else None


def _table_key(path: str) -> str | None:
    parts = path.split(".")
    for key in (path, ".".join([*parts[:-2], "*", parts[-1]]), ".".join([*parts[:-3], "*", parts[-1]])):
        if key in VALUES:
            return key
    if parts[0] == "charts" and "charts.*" in VALUES:
        return "charts.*"
    return None


def leaf_fields(model: type[BaseModel] = AppConfig, prefix: str = "") -> Iterator[tuple[str, Any, Any]]:
    """(dotted path, annotation, field info) of every field that holds a value rather than a section;
    an optional section is a leaf (switched on and off) and its fields are leaves too."""
    for name, info in model.model_fields.items():
        path = f"{prefix}{name}"
        inner, optional = _unwrap(info.annotation)
        nested = _model(inner)
        if nested is None:
            yield path, info.annotation, info
            continue
        if optional:
            yield path, info.annotation, info
        yield from leaf_fields(nested, f"{path}.")


def get(data: dict, path: str) -> Any:
    target: Any = data
    for part in path.split("."):
        if not isinstance(target, dict) or part not in target:
            return None
        target = target[part]
    return target


def with_value(data: dict, path: str, value: Any) -> dict:
    data = copy.deepcopy(data)
    target = data
    *parents, leaf = path.split(".")
    for part in parents:
        target = target.setdefault(part, {})
    if value is DELETE:
        target.pop(leaf, None)
    else:
        target[leaf] = value
    return data


def _effective(config: AppConfig, path: str) -> Any:
    target: Any = config
    for part in path.split("."):
        target = getattr(target, part, None) if target is not None else None
    return target.model_dump() if isinstance(target, BaseModel) else target


def _in_region(value: Any, region: str) -> Any:
    """A table value naming an ARN in the base config's own region, as a user's would."""
    if isinstance(value, str) and value.startswith("arn:aws:") and value.split(":")[3]:
        parts = value.split(":")
        return ":".join([*parts[:3], region, *parts[4:]])
    if isinstance(value, list):
        return [_in_region(v, region) for v in value]
    return value


def _special(path: str, token: str, data: dict, current: Any) -> list[tuple[str, Any]]:
    from config.catalog import INSTANCES

    if token == "<grow>":
        zones = list(current)
        region = data["aws"]["region"]
        extra = next(f"{region}{z}" for z in "abcdef" if f"{region}{z}" not in zones)
        return [(f"add zone {extra}", [*zones, extra])]
    if token == "<shrink>":
        return [("drop the last zone", list(current)[:-1])]
    if token == "<another zone>":
        zones = data["network"]["availability_zones"]
        return [(f"move to {z}", z) for z in zones if z != current][:1]
    if token == "<bigger>":
        family = str(current).split(".")[0]
        same = sorted(t for t in INSTANCES if t.split(".")[0] == family and t != current)
        return [(f"{current} -> {same[0]}", same[0])] if same else []
    if token == "<patch bump>":
        text = str(current)
        head, _, last = text.rpartition(".")
        return [(f"{text} -> {head}.{int(last) + 1}", f"{head}.{int(last) + 1}")] if last.isdigit() else []
    raise AssertionError(f"{path}: unknown value token {token}")


def _typed_values(annotation: Any, info: Any, current: Any) -> list[tuple[str, Any]] | None:
    """Edits the type alone decides, or None when it says too little."""
    inner, optional = _unwrap(annotation)
    out: list[tuple[str, Any]] = []
    origin = typing.get_origin(inner)
    if inner is bool:
        if current is None:
            out += [("set true", True), ("set false", False)]
        else:
            out.append((f"{current} -> {not current}", not current))
    elif origin is typing.Literal:
        out += [(f"{current} -> {value}", value) for value in typing.get_args(inner) if value != current]
    elif inner in (int, float):
        low, high, strict = _bounds(info.metadata)
        base = current if isinstance(current, (int, float)) else (low or 0) + (1 if inner is int else 0.5)
        if inner is int:
            candidates = [base + 1, base - 1]
        else:
            candidates = [round(base * 1.5, 3), round(base * 0.5, 3)]
        for value in candidates:
            if low is not None and (value < low or (strict and value == low)):
                continue
            if high is not None and value > high:
                continue
            out.append((f"{current} -> {value}", value))
            if current is None:
                break
    elif origin is list and typing.get_origin(typing.get_args(inner)[0]) is typing.Literal:
        held = list(current or [])
        missing = [v for v in typing.get_args(typing.get_args(inner)[0]) if v not in held]
        if missing:
            out.append((f"add {missing[0]}", [*held, missing[0]]))
        if held:
            out.append((f"remove {held[-1]}", held[:-1]))
    elif _model(inner) is not None:
        out.append(("on (its defaults)", {}) if current is None else ("off", None))
    else:
        return None
    if optional and current is not None and _model(inner) is None:
        out.append(("unset (its default)", DELETE))
    return out


def _single_valued(annotation: Any) -> bool:
    """The type admits one value only (a Literal of one): there is nothing to edit."""
    inner, _ = _unwrap(annotation)
    return typing.get_origin(inner) is typing.Literal and len(typing.get_args(inner)) == 1


def edits_of(data: dict) -> tuple[list[Edit], list[str]]:
    """Every generated edit of ``data`` (a config as loaded from YAML), and the fields no rule or table
    could make a value for."""
    from config.loader import parse_config

    config = parse_config(data, source="derived edits")
    edits: list[Edit] = []
    unreachable: list[str] = []
    for path, annotation, info in leaf_fields():
        current = _effective(config, path)
        key = _table_key(path)
        found: list[tuple[str, Any]] = []
        if key is not None:
            for value in VALUES[key]:
                if isinstance(value, str) and value.startswith("<") and value.endswith(">"):
                    found += _special(path, value, data, current)
                else:
                    value = _in_region(value, data["aws"]["region"])
                    found.append((f"set {value!r}"[:80], value))
            inner, optional = _unwrap(annotation)
            if optional and get(data, path) is not None:
                found.append(("unset (its default)", DELETE))
            elif typing.get_origin(inner) in (list, dict) and current:
                shrunk = list(current)[:-1] if isinstance(current, list) else dict(list(current.items())[:-1])
                found.append(("remove the last", shrunk))
        else:
            typed = _typed_values(annotation, info, current)
            if typed is None:
                unreachable.append(path)
                continue
            found = typed
        if not found and not _single_valued(annotation):
            unreachable.append(path)
        edits += [Edit(path, what, value) for what, value in found if value != current]
    return edits, unreachable


def apply(data: dict, edit: Edit) -> dict:
    """``data`` with the edit made; a value for a list or mapping that the base already has grows it."""
    current = get(data, edit.field)
    value = edit.value
    if (
        isinstance(value, list)
        and isinstance(current, list)
        and value
        and not set(map(str, value)) & set(map(str, current))
    ):
        value = [*current, *value]
    if isinstance(value, dict) and isinstance(current, dict) and value and not set(value) & set(current):
        value = {**current, **value}
    return with_value(data, edit.field, value)
