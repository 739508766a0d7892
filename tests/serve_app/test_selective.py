"""Selective disaggregation (serve_app/selective.py) against Ray Serve LLM's own P/D builder and the
tiny model's real tokenizer; tests/local/test_local_disaggregated.py shows it on the live server."""

from __future__ import annotations

import pytest

from serve_app.spec import SELECTIVE_THRESHOLD_KEY, ServingSpec
from tests.serve_app.test_app import cluster_spec, graph

ray = pytest.importorskip("ray", reason="the serving stack (requirements-serve.txt) is not installed")
pytestmark = pytest.mark.serving

DECODE = "Decode:qwen2_5-7b-instruct"


@pytest.fixture(scope="module")
def tiny_tokenizer(tmp_path_factory):
    from transformers import AutoTokenizer

    from local.tiny_model import build_tokenizer

    folder = tmp_path_factory.mktemp("tiny-tokenizer")
    build_tokenizer(folder, 2048)
    return AutoTokenizer.from_pretrained(folder)


def decode_deployment(spec: ServingSpec):
    from serve_app.app import build_app

    return graph(build_app(spec.model_dump(mode="json")))[DECODE]


def test_off_keeps_rays_own_pd_graph(local_ray):
    from serve_app.pd_decode import OneTokenPrefillPDDecodeServer

    # Without prewarm too: with it, decode is Ray's class with its prewarm in the background
    # (tests/serve_app/test_pd_decode.py); either way its prefill requests fit their one token.
    decode = decode_deployment(cluster_spec(pd_min_prompt_tokens=0, prewarm_nixl=False))
    assert decode.func_or_class is OneTokenPrefillPDDecodeServer
    assert SELECTIVE_THRESHOLD_KEY not in decode.init_kwargs["llm_config"].experimental_configs


def test_on_decode_is_the_selective_server_with_its_threshold_and_ray_is_left_as_it_was(local_ray):
    from ray.llm._internal.serve.serving_patterns.prefill_decode import builder as pd_builder
    from ray.llm._internal.serve.serving_patterns.prefill_decode.pd_server import PDDecodeServer

    from serve_app.selective import SelectivePDDecodeServer

    spec = cluster_spec(pd_min_prompt_tokens=512)
    deployments = graph(__import__("serve_app.app", fromlist=["build_app"]).build_app(spec.model_dump(mode="json")))
    decode = deployments[DECODE]
    assert decode.func_or_class is SelectivePDDecodeServer
    assert issubclass(SelectivePDDecodeServer, PDDecodeServer)
    assert decode.init_kwargs["llm_config"].experimental_configs[SELECTIVE_THRESHOLD_KEY] == 512
    # Decode still calls the same prefill deployment, and the ingress is Ray's.
    assert set(deployments) == {"OpenAiIngress", DECODE, "Prefill:qwen2_5-7b-instruct"}
    assert pd_builder.PDDecodeServer is PDDecodeServer


def test_colocated_ignores_the_threshold(local_ray):
    from serve_app.app import build_app

    spec = cluster_spec(mode="colocated", pd_min_prompt_tokens=512)
    assert not spec.selective
    assert set(graph(build_app(spec.model_dump(mode="json")))) == {"OpenAiIngress", "LLMServer:qwen2_5-7b-instruct"}


def test_a_ray_that_renamed_the_decode_class_is_refused_by_name(local_ray, monkeypatch):
    from ray.llm._internal.serve.serving_patterns.prefill_decode import builder as pd_builder

    from serve_app.selective import build_selective_pd_app

    monkeypatch.delattr(pd_builder, "PDDecodeServer")
    with pytest.raises(RuntimeError, match="no longer names its decode class PDDecodeServer.*set it to 0"):
        build_selective_pd_app(cluster_spec(pd_min_prompt_tokens=512).builder_args()[1])


def test_data_parallel_decode_is_refused(local_ray):
    from serve_app.selective import build_selective_pd_app

    args = cluster_spec(pd_min_prompt_tokens=512).builder_args()[1]
    args["decode_config"]["engine_kwargs"]["data_parallel_size"] = 2
    with pytest.raises(ValueError, match="pd_min_prompt_tokens applies to decode without data parallelism"):
        build_selective_pd_app(args)


def test_a_threshold_at_the_context_length_is_refused():
    with pytest.raises(ValueError, match=r"pd_min_prompt_tokens \(8192\) is not below max_model_len \(8192\)"):
        cluster_spec(pd_min_prompt_tokens=8192)


# The prompt the decision is made on is vLLM's own rendering in decode (rendered_prompt_ids), shown on
# the live server: tests/local/test_local_disaggregated.py.


def test_the_local_models_template_renders_tools_into_the_prompt_as_qwen25s_does(tiny_tokenizer):
    """Without it, the live tests could not tell a prompt counted with its tools from one counted without."""
    tools = [{"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}}]
    hello = [{"role": "user", "content": "hello"}]
    with_tools = tiny_tokenizer.apply_chat_template(hello, tools=tools, tokenize=False, add_generation_prompt=True)
    without = tiny_tokenizer.apply_chat_template(hello, tokenize=False, add_generation_prompt=True)
    assert without == "<s><|user|>\nhello\n<|assistant|>\n"
    assert with_tools.startswith("<s><|system|>\n# Tools\n{") and '"get_weather"' in with_tools
    assert with_tools.endswith(without.removeprefix("<s>"))


def test_a_tiny_model_made_with_another_template_gets_the_current_one(tmp_path):
    import json

    from local.tiny_model import CHAT_TEMPLATE, build_tokenizer, ensure_tiny_model

    build_tokenizer(tmp_path, 2048)
    (tmp_path / "model.safetensors").write_bytes(b"weights")  # kept as they are
    config = json.loads((tmp_path / "tokenizer_config.json").read_text())
    (tmp_path / "tokenizer_config.json").write_text(json.dumps(config | {"chat_template": "{{ old }}"}))
    ensure_tiny_model(tmp_path)
    assert json.loads((tmp_path / "tokenizer_config.json").read_text())["chat_template"] == CHAT_TEMPLATE
    assert (tmp_path / "model.safetensors").read_bytes() == b"weights"
