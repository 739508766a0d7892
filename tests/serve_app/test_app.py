"""serve_app against the real Ray Serve LLM builders and Ray Serve's own config schema."""

from __future__ import annotations

import json

import pytest
import yaml

from config.loader import load_config
from serve_app.serve_config import IMPORT_PATH, serve_config, serve_config_yaml
from serve_app.spec import ServingSpec, load_spec
from tests.conftest import CONFIG_DIR, SHIPPED_ENVIRONMENTS

ray = pytest.importorskip("ray", reason="the serving stack (requirements-serve.txt) is not installed")
pytestmark = pytest.mark.serving


def graph(app) -> dict[str, object]:
    """Deployment name -> bound deployment, following the app's bound children."""
    from ray.serve.deployment import Application

    found, pending = {}, [app]
    while pending:
        current = pending.pop()
        deployment = current._bound_deployment
        if deployment.name in found:
            continue
        found[deployment.name] = deployment
        for value in deployment.init_kwargs.values():
            children = value.values() if isinstance(value, dict) else [value]
            pending.extend(c for c in children if isinstance(c, Application))
    return found


def cluster_spec(env: str = "dev", **changes) -> ServingSpec:
    data = load_config(CONFIG_DIR / f"{env}.yaml").serving.model_dump()
    data.update(changes)
    return ServingSpec.model_validate(data)


def test_disaggregated_graph(local_ray):
    from serve_app.app import build_app

    spec = cluster_spec()
    deployments = graph(build_app(spec.model_dump(mode="json")))
    assert set(deployments) == {
        "OpenAiIngress",
        "Decode:qwen2_5-7b-instruct",
        "Prefill:qwen2_5-7b-instruct",
    }
    decode = deployments["Decode:qwen2_5-7b-instruct"]
    prefill = deployments["Prefill:qwen2_5-7b-instruct"]
    # Ray's decode with its prefill requests fitted to one token and its prewarm in the background
    # (serve_app/pd_decode.py), Ray's prefill.
    assert [cls.__name__ for cls in decode.func_or_class.__mro__[:3]] == [
        "BackgroundPrewarmPDDecodeServer",
        "OneTokenPrefillPDDecodeServer",
        "PDDecodeServer",
    ]
    assert prefill.func_or_class.__name__ == "PDPrefillServer"
    # ingress -> decode -> prefill
    ingress_children = deployments["OpenAiIngress"].init_kwargs["llm_deployments"]
    assert ingress_children["qwen2.5-7b-instruct"]._bound_deployment.name == decode.name
    assert decode.init_kwargs["prefill_server"]._bound_deployment.name == prefill.name

    assert prefill._replica_config.placement_group_bundles == [{"CPU": 4, "GPU": 1, "pd_prefill": 0.001}]
    assert decode._replica_config.placement_group_bundles == [{"CPU": 4, "GPU": 1, "pd_decode": 0.001}]
    assert decode._deployment_config.autoscaling_config.max_replicas == 1
    for deployment, role in ((prefill, "kv_producer"), (decode, "kv_consumer")):
        kv = deployment.init_kwargs["llm_config"].engine_kwargs["kv_transfer_config"]
        assert kv["kv_role"] == role
        assert kv["kv_connector"] == "NixlConnector"
        assert kv["kv_buffer_device"] == "cpu"
        assert kv["kv_connector_extra_config"] == {"backends": ["LIBFABRIC"], "stall_timeout_s": 30}
    assert decode.init_kwargs["llm_config"].experimental_configs["_prewarm_prefill_decode"] is True


@pytest.mark.parametrize(
    ("mode", "changes", "drain"),
    [
        ("disaggregated", {}, 600),
        ("colocated", {}, 600),
        ("disaggregated", {"request_timeout_s": 900, "drain_timeout_s": 30}, 30),
    ],
)
def test_a_stopped_replica_drains_its_requests_for_as_long_as_they_may_last(local_ray, mode, changes, drain):
    """Serve kills a replica it stops (in-place rollout, scale-down) after graceful_shutdown_timeout_s,
    20 s by default: every deployment of the app, the ingress too, gets the drain instead."""
    from serve_app.app import build_app

    spec = cluster_spec(mode=mode, **changes)
    deployments = graph(build_app(spec.model_dump(mode="json")))
    assert len(deployments) == (3 if mode == "disaggregated" else 2)
    for name, deployment in deployments.items():
        assert deployment._deployment_config.graceful_shutdown_timeout_s == drain, name


@pytest.mark.parametrize("mode", ["disaggregated", "colocated"])
def test_with_an_api_key_dir_both_builders_serve_the_keyed_ingress(local_ray, mode):
    from serve_app.app import build_app
    from serve_app.ingress import GUARDED, KeyedOpenAiIngress

    spec = cluster_spec(mode=mode, api_key_dir="/etc/pd-serving/api-keys")
    ingress = graph(build_app(spec.model_dump(mode="json")))["KeyedOpenAiIngress"]
    assert issubclass(ingress.func_or_class, KeyedOpenAiIngress)
    assert ingress.init_kwargs["api_key_dir"] == "/etc/pd-serving/api-keys"
    assert all(
        getattr(getattr(ingress.func_or_class, name), GUARDED, False) for name in ("completions", "chat", "models")
    )
    # Without one, Ray's own ingress, unchanged.
    plain = graph(build_app(cluster_spec(mode=mode).model_dump(mode="json")))["OpenAiIngress"]
    assert not issubclass(plain.func_or_class, KeyedOpenAiIngress) and "api_key_dir" not in plain.init_kwargs


def test_each_phases_router_is_the_class_rays_serve_imports_for_its_handles(local_ray):
    """The rendered router reaches Ray's deployment config: the class it names (imported by Ray's own
    RequestRouterConfig) and the keyword arguments, which its ``initialize_state`` takes."""
    import inspect

    from ray._common.utils import import_attr
    from ray.serve.experimental.consistent_hash_router import ConsistentHashRouter
    from ray.serve.llm.request_router import PrefixCacheAffinityRouter

    from serve_app.app import build_app

    data = cluster_spec().model_dump(mode="json")
    data["prefill"]["request_router"] = "prefix_affinity"
    data["decode"]["request_router"] = "session_affinity"
    deployments = graph(build_app(data))
    prefill = deployments["Prefill:qwen2_5-7b-instruct"]._deployment_config.request_router_config
    decode = deployments["Decode:qwen2_5-7b-instruct"]._deployment_config.request_router_config
    prefill_router = import_attr(prefill.request_router_class)
    assert issubclass(prefill_router, PrefixCacheAffinityRouter)
    inspect.signature(prefill_router.initialize_state).bind(None, **prefill.request_router_kwargs)
    assert prefill.request_router_kwargs["do_eviction"] is True
    assert import_attr(decode.request_router_class) is ConsistentHashRouter
    assert decode.request_router_kwargs == {}
    # Left to Serve: its default router, power of two choices.
    plain = graph(build_app(cluster_spec().model_dump(mode="json")))["Decode:qwen2_5-7b-instruct"]
    assert import_attr(plain._deployment_config.request_router_config.request_router_class).__name__ == (
        "PowerOfTwoChoicesRequestRouter"
    )


def test_session_affinity_keys_on_the_header_the_docs_name():
    pytest.importorskip("ray", reason="the serving stack (requirements-serve.txt) is not installed")
    from ray.serve._private.constants import SERVE_SESSION_ID

    from serve_app.spec import SESSION_HEADER

    assert SERVE_SESSION_ID == SESSION_HEADER


def test_a_drain_longer_than_the_request_timeout_is_refused():
    with pytest.raises(ValueError, match=r"drain_timeout_s \(700\) is longer than request_timeout_s \(600\)"):
        cluster_spec(drain_timeout_s=700)


def test_tensor_parallel_spec_asks_one_bundle_per_gpu(local_ray):
    from serve_app.app import build_app

    data = cluster_spec().model_dump(mode="json")
    data["decode"]["tensor_parallel_size"] = 4
    deployments = graph(build_app(data))
    bundles = deployments["Decode:qwen2_5-7b-instruct"]._replica_config.placement_group_bundles
    assert bundles == [{"CPU": 4, "GPU": 1, "pd_decode": 0.001}] + [{"CPU": 1, "GPU": 1, "pd_decode": 0.001}] * 3
    assert deployments["Decode:qwen2_5-7b-instruct"]._replica_config.placement_group_strategy == "STRICT_PACK"


def test_colocated_graph_has_one_llm_deployment(local_ray):
    from serve_app.app import build_app

    deployments = graph(build_app(cluster_spec(mode="colocated").model_dump(mode="json")))
    assert set(deployments) == {"OpenAiIngress", "LLMServer:qwen2_5-7b-instruct"}
    llm = deployments["LLMServer:qwen2_5-7b-instruct"]
    assert "kv_transfer_config" not in llm.init_kwargs["llm_config"].engine_kwargs
    assert llm._replica_config.placement_group_bundles == [{"CPU": 4, "GPU": 1}]
    assert llm._deployment_config.autoscaling_config.max_replicas == 2


def test_local_cpu_spec_builds(local_ray):
    from serve_app.app import build_app

    spec = load_spec(str(CONFIG_DIR / "local.yaml"))
    deployments = graph(build_app(spec.model_dump(mode="json")))
    prefill = deployments["Prefill:tiny-llama"]
    assert prefill._replica_config.placement_group_bundles == [{"CPU": 1, "GPU": 0, "pd_prefill": 0.001}]


@pytest.mark.parametrize("env", SHIPPED_ENVIRONMENTS)
def test_serve_config_parses_with_ray_serve_deploy_schema(env):
    from ray.serve.schema import ServeDeploySchema

    spec = load_config(CONFIG_DIR / f"{env}.yaml").serving
    text = serve_config_yaml(spec, working_dir="s3://bucket/serve_app.zip")
    schema = ServeDeploySchema.model_validate(yaml.safe_load(text))
    (app,) = schema.applications
    assert app.import_path == IMPORT_PATH
    assert app.runtime_env == {"working_dir": "s3://bucket/serve_app.zip"}
    assert ServingSpec.model_validate(app.args) == spec


def test_deploy_schema_rejects_a_broken_serve_config():
    from pydantic import ValidationError
    from ray.serve.schema import ServeDeploySchema

    broken = serve_config(cluster_spec())
    del broken["applications"][0]["import_path"]
    with pytest.raises(ValidationError, match="import_path"):
        ServeDeploySchema.model_validate(broken)


def test_one_gpu_check_spec_builds_with_half_a_gpu_per_phase(local_ray):
    from serve_app.app import build_app

    spec = load_spec(str(CONFIG_DIR.parent / "bench" / "gpu" / "one-gpu.yaml"))
    deployments = graph(build_app(spec.model_dump(mode="json")))
    assert deployments["Prefill:tiny-llama"]._replica_config.placement_group_bundles == [
        {"CPU": 2, "GPU": 0.5, "pd_prefill": 0.001}
    ]
    kv = deployments["Decode:tiny-llama"].init_kwargs["llm_config"].engine_kwargs["kv_transfer_config"]
    assert kv["kv_buffer_device"] == "cuda"
    assert kv["kv_connector_extra_config"] == {"backends": ["UCX"], "stall_timeout_s": spec.kv_transfer.stall_timeout_s}


def test_a_gated_models_token_appears_nowhere_in_the_built_application(local_ray, tmp_path, monkeypatch):
    """With the token mounted as a file (HF_TOKEN_PATH) and HF_TOKEN unset, neither the built
    application nor the runtime_env Ray Serve LLM gives the tasks a replica starts carries it."""
    import cloudpickle
    from ray.llm._internal.serve.engines.vllm.vllm_models import VLLMEngineConfig

    from serve_app.app import build_app

    token = "hf_" + uuid_token()
    token_file = tmp_path / "token"
    token_file.write_text(token + "\n")
    monkeypatch.setenv("HF_TOKEN_PATH", str(token_file))
    monkeypatch.delenv("HF_TOKEN", raising=False)
    monkeypatch.delenv("HUGGING_FACE_HUB_TOKEN", raising=False)
    data = cluster_spec().model_dump(mode="json")
    data["model"] = {
        "model_id": "llama-3.1-8b",
        "source": "meta-llama/Llama-3.1-8B-Instruct",
        "gated": True,
        "hf_token_secret": "pd-serving/hf-token",
    }
    app = build_app(data)
    assert token.encode() not in cloudpickle.dumps(app)
    for name, deployment in graph(app).items():
        assert token not in repr(deployment._replica_config.ray_actor_options), name
        llm_config = deployment.init_kwargs.get("llm_config")
        if llm_config is not None:
            runtime_env = VLLMEngineConfig.from_llm_config(llm_config).get_runtime_env_with_local_env_vars()
            assert token not in json.dumps(runtime_env), name
    # What the build function used to do, for contrast: a token in the environment is copied into
    # the runtime_env of every task a replica starts (and so into Ray's GCS and the dashboard).
    monkeypatch.setenv("HF_TOKEN", token)
    decode = graph(app)["Decode:llama-3_1-8b"].init_kwargs["llm_config"]
    assert (
        VLLMEngineConfig.from_llm_config(decode).get_runtime_env_with_local_env_vars()["env_vars"]["HF_TOKEN"] == token
    )


def uuid_token() -> str:
    import uuid

    return uuid.uuid4().hex + uuid.uuid4().hex[:2]


# The experimental_configs keys Ray 2.58.0 (the cluster image's) reads, and where (ray-2.58.0 wheel,
# python/ray/llm/_internal/serve/...): a key it does not read would be ignored on the cluster.
RAY_258_EXPERIMENTAL_KEYS = {
    "stream_batching_interval_ms": "core/server/llm_server.py (LLMServer._get_batch_interval_ms)",
    "pd_tokenize_once": "serving_patterns/prefill_decode/pd_server.py (PDDecodeServer)",
    "_prewarm_prefill_decode": "serving_patterns/prefill_decode/pd_server.py",
    "NIXL_SIDE_CHANNEL_PORT_BASE": "engines/vllm/kv_transfer/nixl.py (NixlConnectorBackend._set_side_channel_port)",
}


@pytest.mark.parametrize("env", SHIPPED_ENVIRONMENTS)
def test_latency_knobs_reach_the_engines_with_keys_ray_2_58_reads(local_ray, env):
    from serve_app.app import build_app

    spec = cluster_spec(env)
    deployments = graph(build_app(spec.model_dump(mode="json")))
    decode = deployments["Decode:qwen2_5-7b-instruct"].init_kwargs["llm_config"]
    prefill = deployments["Prefill:qwen2_5-7b-instruct"].init_kwargs["llm_config"]
    assert decode.experimental_configs["pd_tokenize_once"] is True
    for config in (prefill, decode):
        assert config.experimental_configs["stream_batching_interval_ms"] == spec.stream_batching_interval_ms == 10
        assert set(config.experimental_configs) <= set(RAY_258_EXPERIMENTAL_KEYS)
        # LIBFABRIC on the cluster: NIXL's thread count is not set (vLLM would ignore it).
        assert "num_threads" not in config.engine_kwargs["kv_transfer_config"]["kv_connector_extra_config"]


def test_local_spec_sets_thread_binding_and_one_nixl_thread(local_ray):
    from serve_app.app import build_app

    spec = load_spec(str(CONFIG_DIR / "local.yaml"))
    deployments = graph(build_app(spec.model_dump(mode="json")))
    for name in ("Prefill:tiny-llama", "Decode:tiny-llama"):
        config = deployments[name].init_kwargs["llm_config"]
        extra = config.engine_kwargs["kv_transfer_config"]["kv_connector_extra_config"]
        assert extra == {
            "backends": ["UCX"],
            "num_threads": spec.kv_transfer.nixl_threads,
            "stall_timeout_s": spec.kv_transfer.stall_timeout_s,
        }
        assert "VLLM_CPU_OMP_THREADS_BIND" in config.runtime_env["env_vars"]


def test_vllm_loads_the_bounded_nixl_connector_from_the_rendered_config_under_rays_backend():
    """vLLM's factory takes the module path before its registry; Ray Serve LLM picks its NIXL backend
    (side channel, engine id) by the unchanged connector name."""
    from ray.llm._internal.serve.engines.vllm.kv_transfer.factory import KVConnectorBackendFactory
    from ray.llm._internal.serve.engines.vllm.kv_transfer.nixl import NixlConnectorBackend
    from vllm.config import KVTransferConfig
    from vllm.distributed.kv_transfer.kv_connector.factory import KVConnectorFactory

    from serve_app import kv_wait

    spec = load_config(CONFIG_DIR / "dev.yaml").serving
    for phase in ("prefill", "decode"):
        rendered = spec.kv_transfer_config(phase)
        config = KVTransferConfig(**rendered)
        assert KVConnectorFactory.get_connector_class(config) is kv_wait.NixlConnector
        assert config.get_from_extra_config("stall_timeout_s", None) == spec.kv_transfer.stall_timeout_s
        assert KVConnectorBackendFactory.get_backend_class(rendered["kv_connector"]) is NixlConnectorBackend
