"""Reuse of repeated long inputs: vLLM's prefix cache in each phase's engine, as the stack and the
local run hand it to Ray Serve LLM."""

from __future__ import annotations

import pytest
import yaml

from config.loader import load_config
from serve_app.spec import ServingSpec, load_spec
from tests.conftest import CONFIG_DIR, SHIPPED_ENVIRONMENTS, rendered_ray_service


def engine_kwargs_handed_to_ray(spec: ServingSpec) -> dict[str, dict]:
    """Each engine's kwargs as build_app hands them to Ray's builder, by phase."""
    name, args = spec.builder_args()
    if name == "build_pd_openai_app":
        return {"prefill": args["prefill_config"]["engine_kwargs"], "decode": args["decode_config"]["engine_kwargs"]}
    (colocated,) = args["llm_configs"]
    return {"colocated": colocated["engine_kwargs"]}


def spec_in_the_rendered_ray_service(env: str) -> ServingSpec:
    manifest = rendered_ray_service(load_config(CONFIG_DIR / f"{env}.yaml"))
    (app,) = yaml.safe_load(manifest["spec"]["serveConfigV2"])["applications"]
    return ServingSpec.model_validate(app["args"])


@pytest.mark.parametrize("env", SHIPPED_ENVIRONMENTS)
def test_both_phases_of_the_cluster_cache_prefixes_explicitly(env):
    spec = spec_in_the_rendered_ray_service(env)
    engines = engine_kwargs_handed_to_ray(spec)
    assert set(engines) == {"prefill", "decode"}
    # Explicit, not vLLM's model- and platform-dependent default.
    assert {phase: kwargs.get("enable_prefix_caching") for phase, kwargs in engines.items()} == {
        "prefill": True,
        "decode": True,
    }
    colocated = engine_kwargs_handed_to_ray(spec.model_copy(update={"mode": "colocated"}))
    assert colocated["colocated"].get("enable_prefix_caching") is True


@pytest.mark.parametrize("mode", ["disaggregated", "colocated"])
def test_the_local_run_caches_prefixes_in_every_engine(mode):
    spec = load_spec(str(CONFIG_DIR / "local.yaml")).model_copy(update={"mode": mode})
    engines = engine_kwargs_handed_to_ray(spec)
    assert engines and all(kwargs.get("enable_prefix_caching") is True for kwargs in engines.values())


def test_prefix_caching_off_reaches_every_engine_and_engine_kwargs_cannot_say_otherwise():
    data = load_spec(str(CONFIG_DIR / "local.yaml")).model_dump(mode="json")
    off = ServingSpec.model_validate({**data, "prefix_caching": False})
    assert {k: v.get("enable_prefix_caching") for k, v in engine_kwargs_handed_to_ray(off).items()} == {
        "prefill": False,
        "decode": False,
    }
    data["decode"]["engine_kwargs"] = {"enable_prefix_caching": False}
    with pytest.raises(
        ValueError, match=r"engine_kwargs.enable_prefix_caching is set by the spec; use serving.prefix_caching"
    ):
        ServingSpec.model_validate(data)
