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


def test_the_cap_bounds_the_threshold_on_decode(local_ray):
    from serve_app.spec import DEFAULT_LOCAL_PREFILL_CAP, SELECTIVE_CAP_KEY

    configs = decode_deployment(cluster_spec(pd_min_prompt_tokens=2048)).init_kwargs["llm_config"].experimental_configs
    assert configs[SELECTIVE_CAP_KEY] == DEFAULT_LOCAL_PREFILL_CAP
    capped = cluster_spec(pd_min_prompt_tokens=2048, pd_max_local_prefill_tokens=100)
    configs = decode_deployment(capped).init_kwargs["llm_config"].experimental_configs
    assert (configs[SELECTIVE_THRESHOLD_KEY], configs[SELECTIVE_CAP_KEY]) == (2048, 100)


class Decider:
    """The selective decision's limit read as SelectivePDDecodeServer reads it."""

    def __init__(self, configs: dict) -> None:
        self._llm_config = type("LLMConfig", (), {"experimental_configs": configs})()


@pytest.mark.parametrize(
    ("configs", "remainder_allowed"),
    [
        ({SELECTIVE_THRESHOLD_KEY: 64, "pd_max_local_prefill_tokens": 512}, 63),
        ({SELECTIVE_THRESHOLD_KEY: 2048, "pd_max_local_prefill_tokens": 512}, 512),
        ({}, -1),
    ],
)
def test_decode_prefills_a_remainder_below_the_threshold_and_never_above_the_cap(configs, remainder_allowed):
    from serve_app.selective import SelectivePDDecodeServer

    limit = SelectivePDDecodeServer._local_limit(Decider(configs))
    assert limit - 1 == remainder_allowed


TEXTS = ["hi", "a prompt of some length " * 40, "héllo wörld, ünïcödé ✓ 漢字 🙂" * 10, "  spaces\n\n\tand tabs  "]


@pytest.mark.parametrize("text", TEXTS)
def test_a_completions_text_bounds_its_tokens_from_above(tiny_tokenizer, text):
    from ray.llm._internal.serve.core.configs.openai_api_models import CompletionRequest

    from serve_app.selective import token_bound

    bound = token_bound(CompletionRequest(model="m", prompt=text), tiny_tokenizer)
    assert bound is not None and bound >= len(tiny_tokenizer(text)["input_ids"])


def test_a_chat_or_a_token_id_prompt_or_a_normalizing_tokenizer_proves_nothing(tiny_tokenizer):
    from ray.llm._internal.serve.core.configs.openai_api_models import ChatCompletionRequest, CompletionRequest
    from tokenizers import normalizers
    from transformers import PreTrainedTokenizerFast

    from serve_app.selective import token_bound

    chat = ChatCompletionRequest(model="m", messages=[{"role": "user", "content": "hi"}])
    assert token_bound(chat, tiny_tokenizer) is None
    assert token_bound(CompletionRequest(model="m", prompt=[1, 2, 3]), tiny_tokenizer) is None
    # NFKC turns one character of 3 bytes into 18 characters: a text's bytes no longer bound its tokens.
    backend = tiny_tokenizer.backend_tokenizer.__class__.from_str(tiny_tokenizer.backend_tokenizer.to_str())
    backend.normalizer = normalizers.NFKC()
    normalizing = PreTrainedTokenizerFast(tokenizer_object=backend)
    assert len(normalizing("\ufdfa")["input_ids"]) > len("\ufdfa".encode())
    assert token_bound(CompletionRequest(model="m", prompt="\ufdfa"), normalizing) is None


def engine_outputs(prompt_ids: list[int], reply: list[int], *, fail_after: int | None = None):
    """What vLLM's AsyncLLM.generate yields for a streamed request (RequestOutputKind.DELTA): each
    output carries the prompt's ids and the reply's new ids; the last is finished."""
    from vllm.outputs import CompletionOutput, RequestOutput

    async def generate(prompt, sampling_params, request_id, **kwargs):
        for position, token in enumerate(reply):
            if fail_after is not None and position == fail_after:
                raise RuntimeError("engine died")
            last = position == len(reply) - 1
            yield RequestOutput(
                request_id,
                None,
                prompt_ids,
                None,
                [CompletionOutput(0, "", [token], None, None, finish_reason="length" if last else None)],
                finished=last,
            )

    return generate


async def served_through(served, generate, prompt: dict, **kwargs) -> list[int]:
    from vllm.sampling_params import RequestOutputKind, SamplingParams

    held = []
    wrapped = served.wrap(generate)
    params = SamplingParams(max_tokens=8, output_kind=RequestOutputKind.DELTA)
    async for _ in wrapped(prompt, params, "request-1", **kwargs):
        held.append(served.held_blocks())
    return held


def test_a_prompt_is_recorded_once_served_with_the_reply_the_engine_made():
    import asyncio

    from serve_app.prefix_index import PrefixIndex
    from serve_app.selective import ServedPrompts, cache_key

    block = 4
    served = ServedPrompts(PrefixIndex(block, capacity_blocks=64))
    prompt_ids, reply = list(range(100, 110)), list(range(200, 208))
    held = asyncio.run(served_through(served, engine_outputs(prompt_ids, reply), {"prompt_token_ids": prompt_ids}))
    # While it ran, its blocks were held, growing with the reply; once finished, none.
    assert held[0] == len(prompt_ids + reply[:1]) // block and held[-1] == 0 and served.held_blocks() == 0
    # The next turn resends the history and the reply: all of it but the reply's last token, whose KV
    # was never computed, is decode's cache.
    next_turn = prompt_ids + reply + [7, 8, 9]
    assert served.index.cached_tokens(next_turn, cache_key(None, None)) == 16
    # Under a salt, only that salt hits.
    salted = ServedPrompts(PrefixIndex(block, capacity_blocks=64))
    asyncio.run(
        served_through(
            salted, engine_outputs(prompt_ids, reply), {"prompt_token_ids": prompt_ids, "cache_salt": "tenant-a"}
        )
    )
    assert salted.index.cached_tokens(next_turn, cache_key(None, "tenant-a")) == 16
    assert salted.index.cached_tokens(next_turn, cache_key(None, None)) == 0


def test_a_request_that_failed_is_not_recorded_and_holds_nothing():
    import asyncio

    from serve_app.prefix_index import PrefixIndex
    from serve_app.selective import ServedPrompts

    served = ServedPrompts(PrefixIndex(4, capacity_blocks=64))
    prompt_ids = list(range(100, 116))
    with pytest.raises(RuntimeError, match="engine died"):
        asyncio.run(served_through(served, engine_outputs(prompt_ids, [1, 2, 3], fail_after=2), {}))
    assert len(served.index) == 0 and served.held_blocks() == 0
