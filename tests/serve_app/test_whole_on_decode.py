"""Which requests run whole on decode (serve_app/pd_decode.py, ``whole_on_decode``), swept over every
field of vLLM's request models (tests/request_fields.py), and that every decode class the app can
build asks that one predicate before any prefill.

The requests are Ray Serve LLM's own models; the predicate reads them through vLLM's own conversion,
so what it answers is what the installed vLLM (the image's) would run."""

from __future__ import annotations

import asyncio

import pytest

pytest.importorskip("vllm", reason="the serving stack (requirements-serve.txt) is not installed")
pytestmark = [
    pytest.mark.serving,
    # A decode object made without its constructor (no engine, no Serve) is collected with LLMServer's
    # async __del__ never awaited.
    pytest.mark.filterwarnings("ignore:coroutine 'LLMServer.__del__' was never awaited"),
]

from pydantic import ValidationError  # noqa: E402
from ray.llm._internal.serve.core.configs.openai_api_models import (  # noqa: E402
    ChatCompletionRequest,
    CompletionRequest,
)

from serve_app.pd_decode import (  # noqa: E402
    BackgroundPrewarmDPPDDecodeServer,
    BackgroundPrewarmPDDecodeServer,
    OneTokenPrefillDPPDDecodeServer,
    OneTokenPrefillPDDecodeServer,
    whole_on_decode,
)
from serve_app.selective import SelectivePDDecodeServer  # noqa: E402
from tests.request_fields import base_request, sweep  # noqa: E402

MODELS = {"chat": ChatCompletionRequest, "completion": CompletionRequest}
# What cannot be split, by the field swept alone (chat's echo asks vLLM for prompt logprobs at
# top_logprobs, 0 by default: the prompt's own tokens' logprobs).
WHOLE = {
    ("chat", "prompt_logprobs"): "prompt_logprobs",
    ("completion", "prompt_logprobs"): "prompt_logprobs",
    ("chat", "echo"): "echo",
    ("chat", "n"): "n",
    ("completion", "n"): "n",
    ("chat", "use_beam_search"): "use_beam_search",
    ("completion", "use_beam_search"): "use_beam_search",
}
CASES = [(kind, name, fields) for kind, model in MODELS.items() for name, fields in sweep(model).items()]
DECODE_CLASSES = [
    OneTokenPrefillPDDecodeServer,
    OneTokenPrefillDPPDDecodeServer,
    BackgroundPrewarmPDDecodeServer,
    BackgroundPrewarmDPPDDecodeServer,
    SelectivePDDecodeServer,
]


@pytest.mark.parametrize("kind, name, fields", CASES, ids=[f"{kind}-{name}" for kind, name, _ in CASES])
def test_each_field_alone(kind, name, fields):
    try:
        request = MODELS[kind].model_validate(base_request(kind, "m") | fields)
    except ValidationError:
        pytest.skip("the request model refuses the value on its own")
    assert whole_on_decode(request) == WHOLE.get((kind, name))


@pytest.mark.parametrize(
    "kind, fields",
    [
        ("completion", {"echo": True, "logprobs": 1, "max_tokens": 0}),  # lm-eval's log-likelihood request
        ("completion", {"echo": True, "logprobs": 0}),
        ("chat", {"echo": True, "logprobs": True, "top_logprobs": 2}),
    ],
)
def test_echo_with_logprobs_is_whole(kind, fields):
    assert whole_on_decode(MODELS[kind].model_validate(base_request(kind, "m") | fields)) == "echo"


def test_echo_alone_in_completions_can_be_split():
    """The prompt's text comes back, not its logprobs: decode has the text."""
    assert whole_on_decode(CompletionRequest.model_validate(base_request("completion", "m") | {"echo": True})) is None


def test_a_request_vllm_refuses_is_left_to_vllm():
    """Either path answers it with vLLM's own 400; the predicate does not turn it into a 500."""
    request = CompletionRequest.model_validate(base_request("completion", "m") | {"n": 2})  # n > 1 greedy
    assert whole_on_decode(request) is None


class Config:
    """The one field of an LLMConfig the decode classes read before deciding (the threshold)."""

    experimental_configs = {"pd_min_prompt_tokens": 0}


@pytest.mark.parametrize("cls", DECODE_CLASSES, ids=lambda c: c.__name__)
def test_every_decode_class_asks_the_predicate_before_any_prefill(cls):
    # chat and completions are OneTokenPrefillPDDecodeServer's in every class: none skips the question.
    assert cls.chat is OneTokenPrefillPDDecodeServer.chat
    assert cls.completions is OneTokenPrefillPDDecodeServer.completions
    decode = object.__new__(cls)
    decode._llm_config = Config()
    whole = CompletionRequest.model_validate(base_request("completion", "m") | {"prompt_logprobs": 1})
    plain = CompletionRequest.model_validate(base_request("completion", "m"))
    assert asyncio.run(decode._serve_here(whole)) is True
    assert asyncio.run(decode._serve_here(plain)) is False
