"""Every request a client sends works the same in P/D as colocated, swept from vLLM's protocol.

Every field of the installed vLLM's ``ChatCompletionRequest`` and ``CompletionRequest`` gets a valid,
non-default value derived from its type (tests/request_fields.py) on a greedy, seeded request. The
colocated server answers first (its answers are the reference); the disaggregated server then
answers the same requests, with the same status and, where they succeed, the same output. A field P/D
refuses by design (serve_app/pd_decode.py, ``REFUSED_FIELDS``; docs/serving.md) is answered with
HTTP 400 naming it instead.

The two halves run with the shared servers they need (tests/local/conftest.py, ``ORDER``): the
colocated one beside the colocated tests, the P/D one beside the disaggregated tests.
"""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.request
from typing import Any

import pytest

from tests.local.conftest import report_measurement
from tests.request_fields import base_request, sweep

pytestmark = pytest.mark.live
MODEL = "tiny-llama"
PATHS = {"chat": "/chat/completions", "completion": "/completions"}
# Keys of an answer that differ from one request to the next whatever the mode.
VOLATILE = {"id", "created", "system_fingerprint", "kv_transfer_params", "service_tier"}
# The greedy-equality prompts: long enough to go through remote prefill in P/D.
GREEDY_PROMPTS = [
    f"{subject} " + "the quick brown fox jumps over the lazy dog " * 2
    for subject in ("first prompt", "second prompt", "a third one", "and a fourth")
]
GREEDY_TOKENS = 16
# A function whose arguments are short, so that the tiny model's call ends within max_tokens.
WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The weather in a city.",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string", "enum": ["Paris", "Oslo"]}},
            "required": ["city"],
            "additionalProperties": False,
        },
    },
}
# Fields that mean something only together, swept beside the single fields: echo with logprobs is
# what vLLM turns into prompt logprobs (lm-eval's log-likelihood requests send the first), which P/D
# cannot split (serve_app/pd_decode.py, whole_on_decode).
COMBINED = {
    "completion.echo+logprobs": ("completion", {"echo": True, "logprobs": 1, "max_tokens": 0}),
    "completion.echo+logprobs+tokens": ("completion", {"echo": True, "logprobs": 2, "max_tokens": 4}),
    "chat.echo+top_logprobs": ("chat", {"echo": True, "logprobs": True, "top_logprobs": 2}),
}
TOOL_CHOICES = {"required": "required", "named": {"type": "function", "function": {"name": "get_weather"}}}


def tool_request(choice: str) -> dict[str, Any]:
    # Sampled, with the base request's seed: the grammar of vLLM 0.26 lets JSON whitespace into the
    # arguments, and the tiny model's random weights pick it greedily until max_tokens (an unclosed
    # call); sampled, its seeded call closes within the tokens below, the same in both modes.
    return base_request("chat", MODEL) | {
        "tools": [WEATHER],
        "tool_choice": TOOL_CHOICES[choice],
        "max_tokens": 256,
        "temperature": 1.0,
    }


def swept_requests() -> dict[str, tuple[str, dict[str, Any]]]:
    from ray.llm._internal.serve.core.configs.openai_api_models import ChatCompletionRequest, CompletionRequest

    requests = {}
    for kind, model in (("chat", ChatCompletionRequest), ("completion", CompletionRequest)):
        for name, fields in sweep(model).items():
            requests[f"{kind}.{name}"] = (kind, base_request(kind, MODEL) | fields)
    for key, (kind, fields) in COMBINED.items():
        requests[key] = (kind, base_request(kind, MODEL) | fields)
    return requests


def post(server, kind: str, body: dict[str, Any]) -> tuple[int, Any]:
    """(HTTP status, the answer without its volatile keys: a stream as what its chunks add up to)."""
    request = urllib.request.Request(
        server.base_url + PATHS[kind], data=json.dumps(body).encode(), headers={"Content-Type": "application/json"}
    )
    try:
        with urllib.request.urlopen(request, timeout=60) as response:
            raw = response.read().decode()
            status = response.status
    except urllib.error.HTTPError as error:
        text = error.read().decode(errors="replace")
        try:
            return error.code, json.loads(text)
        except ValueError:  # Serve's own answers (a 500, a 408) are plain text
            return error.code, text
    if body.get("stream"):
        chunks = [json.loads(line[6:]) for line in raw.splitlines() if line.startswith("data: {")]
        return status, read_stream([stable(chunk) for chunk in chunks])
    return status, stable(json.loads(raw))


def read_stream(chunks: list[dict[str, Any]]) -> dict[str, Any]:
    """A stream as a client reads it: each choice's text (completions) or delta content (chat) joined,
    every other key at its last value. Where one chunk ends and the next begins is the serving
    loop's timing (a character whose bytes span two tokens comes in one chunk or two), not the answer."""
    answer: dict[str, Any] = {}
    choices: dict[int, dict[str, Any]] = {}
    for chunk in chunks:
        for key, value in chunk.items():
            if key != "choices" and value is not None:
                answer[key] = value
        for choice in chunk.get("choices") or []:
            merged = choices.setdefault(choice["index"], {})
            for key, value in choice.items():
                if key == "delta":
                    delta = merged.setdefault("delta", {})
                    for part, text in value.items():
                        if isinstance(text, str) and part in ("content", "reasoning"):
                            delta[part] = delta.get(part, "") + text
                        elif text is not None:
                            delta[part] = text
                elif key == "text":
                    merged["text"] = merged.get("text", "") + value
                elif value is not None:
                    merged[key] = value
    answer["choices"] = [choices[index] for index in sorted(choices)]
    return answer


def stable(value: Any) -> Any:
    """``value`` without the keys that differ between any two answers (tool calls' ids among them)."""
    if isinstance(value, dict):
        return {key: stable(item) for key, item in value.items() if key not in VOLATILE}
    if isinstance(value, list):
        return [stable(item) for item in value]
    return value


def greedy(server, prompt: str) -> dict[str, Any]:
    status, answer = post(
        server,
        "completion",
        {
            "model": MODEL,
            "prompt": prompt,
            "max_tokens": GREEDY_TOKENS,
            "temperature": 0,
            "ignore_eos": True,
            "logprobs": 2,
        },
    )
    assert status == 200, answer
    logprobs = answer["choices"][0]["logprobs"]
    return {key: logprobs[key] for key in ("tokens", "token_logprobs", "top_logprobs")}


def test_colocated_answers_are_recorded(shared_servers, parity_answers):
    server = shared_servers.get("colocated")
    for key, (kind, body) in swept_requests().items():
        parity_answers[key] = post(server, kind, body)
    parity_answers["greedy"] = [greedy(server, prompt) for prompt in GREEDY_PROMPTS]
    for choice in TOOL_CHOICES:
        parity_answers[f"tools.{choice}"] = post(server, "chat", tool_request(choice))
    server_errors = {key: answer for key, answer in parity_answers.items() if key != "greedy" and answer[0] >= 500}
    assert not server_errors, f"colocated answered with a server error: {server_errors}"
    assert all(len(answer["tokens"]) == GREEDY_TOKENS for answer in parity_answers["greedy"])


@pytest.fixture(scope="module")
def server(shared_servers):
    return shared_servers.get("disaggregated")


@pytest.fixture(scope="module")
def reference(parity_answers):
    if not parity_answers:
        pytest.skip("the colocated answers were not recorded in this session (run the whole file)")
    return parity_answers


def test_first_logprobs_request_after_ready_is_measured(server):
    """The first request with logprobs this module sends (on a server just started, the first since
    ready), against the same request's steady latency; recorded, never asserted."""
    body = base_request("completion", MODEL) | {"logprobs": 2, "prompt": "first logprobs " + "x" * 60}
    timings = []
    for _ in range(4):
        started = time.monotonic()
        status, answer = post(server, "completion", body)
        timings.append(time.monotonic() - started)
        assert status == 200, answer
    steady = sorted(timings[1:])[1]
    report_measurement("pd-first-logprobs-request", {"first_s": round(timings[0], 3), "steady_s": round(steady, 3)})


def test_min_tokens_above_one_is_served(server):
    """Ray's prefill request asks for one token; the client's min_tokens no longer fails it."""
    for kind in PATHS:
        body = base_request(kind, MODEL) | {"min_tokens": 4, "max_tokens": 8}
        status, answer = post(server, kind, body)
        assert status == 200, answer
        assert answer["usage"]["completion_tokens"] >= 4


def test_every_field_is_answered_as_colocated(server, reference):
    from serve_app.pd_decode import REFUSED_FIELDS

    differences = []
    for key, (kind, body) in swept_requests().items():
        field = key.split(".", 1)[1]
        status, answer = post(server, kind, body)
        if field in REFUSED_FIELDS:
            if status != 400 or field not in json.dumps(answer):
                differences.append(f"{key}: P/D refuses it, yet answered {status}: {answer}")
            continue
        expected_status, expected = reference[key]
        if status != expected_status:
            differences.append(f"{key}: HTTP {status} in P/D, {expected_status} colocated: {answer} / {expected}")
        elif status == 200 and answer != expected:
            differences.append(f"{key}: answers differ\n  P/D:       {answer}\n  colocated: {expected}")
    assert not differences, "\n".join(differences)


def test_greedy_tokens_and_logprobs_equal_colocated(server, reference):
    assert [greedy(server, prompt) for prompt in GREEDY_PROMPTS] == reference["greedy"]


@pytest.mark.parametrize("choice", TOOL_CHOICES)
def test_tool_calls_go_through_pd_as_colocated(server, reference, choice):
    """serving.tool_call_parser (config/local.yaml) turns tool calling on in every phase: the tool
    choice is honoured through prefill and decode, and the call equals colocated's."""
    status, answer = post(server, "chat", tool_request(choice))
    assert status == 200, answer
    calls = answer["choices"][0]["message"].get("tool_calls")
    assert calls, f"no tool call: {answer}; colocated: {reference[f'tools.{choice}']}"
    assert [call["function"]["name"] for call in calls][:1] == ["get_weather"]
    json.loads(calls[0]["function"]["arguments"])  # the arguments are JSON (the tiny model picks them)
    assert (status, answer) == reference[f"tools.{choice}"]
