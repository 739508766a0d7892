"""Reuse of repeated long inputs: vLLM's prefix cache in each phase's engine, as the stack and the
local run hand it to Ray Serve LLM."""

from __future__ import annotations

import pytest
import yaml

from config.loader import ConfigError, load_config, parse_config
from config.versions import SERVING_IMAGE_RAY_VERSION
from serve_app.spec import REQUEST_ROUTER_SINCE_RAY, ServingSpec, load_spec
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


# -- the request router of each phase ---------------------------------------------------------------


def rendered_deployment_configs(env: str, **changes) -> dict[str, dict]:
    """Each phase's deployment_config as the stack's serveConfigV2 hands it to Ray's builder."""
    data = load_config(CONFIG_DIR / f"{env}.yaml").model_dump(mode="json")
    for path, value in changes.items():
        phase, field = path.split(".")
        data["serving"][phase][field] = value
    manifest = rendered_ray_service(parse_config(data, source="test.yaml"))
    (app,) = yaml.safe_load(manifest["spec"]["serveConfigV2"])["applications"]
    _, args = ServingSpec.model_validate(app["args"]).builder_args()
    return {phase: args[f"{phase}_config"]["deployment_config"] for phase in ("prefill", "decode")}


@pytest.mark.parametrize("phase", ["prefill", "decode"])
def test_prefix_affinity_is_rendered_into_the_phases_deployment_and_only_there(phase):
    other = "decode" if phase == "prefill" else "prefill"
    configs = rendered_deployment_configs("dev", **{f"{phase}.request_router": "prefix_affinity"})
    assert configs[phase]["request_router_config"] == {
        "request_router_class": "serve_app.routers:PrefixAffinityRouter",
        # Ray's defaults (an infinite threshold, no eviction) would never balance and never forget.
        "request_router_kwargs": {
            "imbalanced_threshold": 8,  # half of target_ongoing_requests, 16 by default
            "do_eviction": True,
            "eviction_threshold_chars": 400_000,
            "eviction_target_chars": 360_000,
        },
    }
    # Power of two is Serve's own default: nothing is rendered for it.
    assert "request_router_config" not in configs[other]


def test_power_of_two_is_the_default_and_leaves_serve_its_own_router():
    for env in SHIPPED_ENVIRONMENTS:
        assert all("request_router_config" not in c for c in rendered_deployment_configs(env).values())


def test_prefix_affinity_without_the_prefix_cache_is_refused_in_one_line_naming_field_and_fix():
    data = load_config(CONFIG_DIR / "dev.yaml").model_dump(mode="json")
    data["serving"]["prefix_caching"] = False
    data["serving"]["prefill"]["request_router"] = "prefix_affinity"
    with pytest.raises(ConfigError) as caught:
        parse_config(data, source="test.yaml")
    (line,) = str(caught.value).splitlines()
    assert "prefill.request_router is prefix_affinity, but prefix_caching is false" in line
    assert "set prefix_caching: true or prefill.request_router: power_of_two" in line


def test_a_router_the_images_ray_lacks_is_refused_in_one_line_naming_field_and_fix():
    data = load_config(CONFIG_DIR / "dev.yaml").model_dump(mode="json")
    data["serving"]["decode"]["request_router"] = "prefix_affinity"
    major, minor = REQUEST_ROUTER_SINCE_RAY["prefix_affinity"]
    older = f"{major}.{minor - 1}.0"
    data["ray_service"]["ray_version"] = older
    with pytest.raises(ConfigError) as caught:
        parse_config(data, source="test.yaml")
    (line,) = str(caught.value).splitlines()
    assert (
        f"serving.decode.request_router prefix_affinity needs Ray 2.58 or newer (Ray Serve's PrefixCacheAffinityRouter), "
        f"but ray_service.ray_version is {older}: use power_of_two" in line
    )
    # The image's own Ray has it.
    data["ray_service"]["ray_version"] = SERVING_IMAGE_RAY_VERSION
    assert parse_config(data, source="test.yaml").serving.decode.request_router == "prefix_affinity"


@pytest.mark.parametrize("phase", ["prefill", "decode"])
def test_session_affinity_is_rays_consistent_hash_router_with_its_defaults(phase):
    configs = rendered_deployment_configs("prod", **{f"{phase}.request_router": "session_affinity"})
    assert configs[phase]["request_router_config"] == {
        "request_router_class": "ray.serve.experimental.consistent_hash_router:ConsistentHashRouter"
    }


def test_the_prefix_affinity_threshold_is_the_users_when_given():
    configs = rendered_deployment_configs(
        "dev", **{"decode.request_router": "prefix_affinity", "decode.prefix_affinity_max_imbalance": 0}
    )
    assert configs["decode"]["request_router_config"]["request_router_kwargs"]["imbalanced_threshold"] == 0


def test_prefix_affinity_settings_under_another_router_are_refused_in_one_line_naming_field_and_fix():
    data = load_config(CONFIG_DIR / "dev.yaml").model_dump(mode="json", exclude_unset=True)
    data["serving"]["decode"]["prefix_affinity_chars_per_replica"] = 100_000
    with pytest.raises(ConfigError) as caught:
        parse_config(data, source="test.yaml")
    (line,) = str(caught.value).splitlines()
    assert "prefix_affinity_chars_per_replica applies to request_router: prefix_affinity" in line
    assert "remove prefix_affinity_chars_per_replica or set request_router: prefix_affinity" in line
