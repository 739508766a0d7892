"""The prefill request of P/D (serve_app/pd_decode.py) is valid to vLLM wherever the client's is.

Swept over every field of vLLM's request models (tests/request_fields.py): the client's request is
shaped by Ray's own connector backend and the project's fitting, then checked by vLLM's own
``to_sampling_params`` (``SamplingParams._verify_args``), at the one token Ray's prefill asks for. The
prefill copy carries no grammar, by vLLM's own reading of a request (its structured outputs and its
tool parser's schema), and renders the prompt decode renders."""

from __future__ import annotations

import pytest

pytest.importorskip("vllm", reason="the serving stack (requirements-serve.txt) is not installed")
pytestmark = pytest.mark.serving

from pydantic import ValidationError  # noqa: E402
from ray.llm._internal.serve.core.configs.openai_api_models import (  # noqa: E402
    ChatCompletionRequest,
    CompletionRequest,
)
from ray.llm._internal.serve.engines.vllm.kv_transfer.base import DefaultConnectorBackend  # noqa: E402
from vllm.exceptions import VLLMValidationError  # noqa: E402
from vllm.tool_parsers.utils import get_json_schema_from_tools  # noqa: E402

from serve_app.pd_decode import OneTokenPrefill, pd_refusal  # noqa: E402
from tests.request_fields import base_request, sweep  # noqa: E402

MODELS = {"chat": ChatCompletionRequest, "completion": CompletionRequest}
TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
    },
}
# Every tool_choice vLLM's chat model takes, with a tool: the sweep gives each field one value only.
TOOL_CHOICES = {
    f"tool_choice.{name}": {"tools": [TOOL], "tool_choice": choice}
    for name, choice in {
        "auto": "auto",
        "none": "none",
        "required": "required",
        "named": {"type": "function", "function": {"name": "get_weather"}},
    }.items()
}
CASES = [(kind, name, fields) for kind, model in MODELS.items() for name, fields in sweep(model).items()] + [
    ("chat", name, fields) for name, fields in TOOL_CHOICES.items()
]
# What the project's prefill copy changes in Ray's (the rest is Ray's clamp_request_to_single_token).
FITTED_FIELDS = {"min_tokens", "structured_outputs", "response_format", "tool_choice"}


def sampling_error(request, max_tokens: int) -> str | None:
    try:
        request.to_sampling_params(max_tokens, {})
    except (VLLMValidationError, ValueError) as error:
        return str(error)
    return None


@pytest.mark.parametrize("kind, name, fields", CASES, ids=[f"{kind}-{name}" for kind, name, _ in CASES])
def test_prefill_is_valid_wherever_the_clients_request_is(kind, name, fields):
    try:
        request = MODELS[kind].model_validate(base_request(kind, "m") | fields)
    except (ValidationError, VLLMValidationError, ValueError):
        pytest.skip("vLLM refuses the request itself, in either mode")
    if pd_refusal(request) is not None or sampling_error(request, request.max_tokens or 8) is not None:
        pytest.skip("refused before prefill, in P/D by design or by vLLM in either mode")
    client_sent = request.model_dump()
    backend = OneTokenPrefill(DefaultConnectorBackend(llm_config=None))

    prefill = backend.prepare_prefill_request(request=request, peer=None)
    rays_prefill = DefaultConnectorBackend(llm_config=None).prepare_prefill_request(request=request, peer=None)
    # Only the fitted fields differ from Ray's own prefill copy (compared first: vLLM's
    # to_sampling_params writes into the request's vllm_xargs).
    assert prefill.model_dump(exclude=FITTED_FIELDS) == rays_prefill.model_dump(exclude=FITTED_FIELDS)
    decode = backend.prepare_decode_request(request=request, peer=None, prefill_response=prefill)

    assert prefill.max_tokens == 1
    assert sampling_error(prefill, 1) is None
    # Decode runs what the client sent (bar the KV it pulls), and the client's request is untouched.
    assert decode.model_dump(exclude={"kv_transfer_params"}) == request.model_dump(exclude={"kv_transfer_params"})
    assert request.model_dump() == client_sent
    # No grammar: none from the request's own constraints, none that a tool parser derives from the
    # tools (ToolParser.adjust_request in vLLM's tool_parsers/abstract_tool_parser.py).
    assert prefill.to_sampling_params(1, {}).structured_outputs is None
    if kind == "chat":
        assert get_json_schema_from_tools(tool_choice=prefill.tool_choice, tools=prefill.tools) is None
        # vLLM's renderer drops the tools from the prompt for tool_choice "none" only
        # (renderers/online_renderer.py, render_chat), and reads no other of the fitted fields.
        assert (prefill.tool_choice == "none") == (request.tool_choice == "none")
