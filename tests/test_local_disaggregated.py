"""serve_app for real on this CPU in disaggregated mode, driven by the OpenAI client.

One local server (Ray Serve, vLLM CPU engines, NIXL over loopback) is started for this module and
always stopped afterwards.
"""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor

import openai
import pytest

from local.harness import LocalServer, session_processes
from local.metrics import (
    EXTERNAL_PREFIX_HITS,
    NIXL_TRANSFERS,
    PROMPT_TOKENS_BY_SOURCE,
    counter_delta,
)

MODEL = "tiny-llama"


@pytest.fixture(scope="module")
def server():
    running = LocalServer(mode="disaggregated", port=8000, metrics_port=8085).start()
    yield running
    session = running.process.pid
    running.stop()
    assert session_processes(session) == [], "the local server left processes behind"


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=server.base_url, api_key="unused", timeout=120, max_retries=0)


def unique_prompt(tag: str, length: int = 100) -> str:
    # The tiny model's tokenizer is byte-level: an ASCII prompt of N characters is N tokens.
    return (f"{tag} {time.time_ns()} " + "the quick brown fox jumps over the lazy dog " * 10)[:length]


def counters(server):
    return server.counters()


def wait_for_counters(server, before, deployment, metric, source, at_least, timeout=30):
    deadline = time.monotonic() + timeout
    while True:
        after = counters(server)
        if counter_delta(before, after, deployment, metric, source) >= at_least or time.monotonic() > deadline:
            return after
        time.sleep(1)


def test_models_lists_the_served_model(client):
    assert [m.id for m in client.models.list().data] == [MODEL]


def test_completion(client):
    response = client.completions.create(model=MODEL, prompt=unique_prompt("c"), max_tokens=8, temperature=0)
    assert response.usage.prompt_tokens == 100
    assert response.usage.completion_tokens >= 1
    assert response.choices[0].finish_reason in ("length", "stop")


def test_completion_streamed(client):
    chunks = list(
        client.completions.create(model=MODEL, prompt=unique_prompt("cs"), max_tokens=8, temperature=0, stream=True)
    )
    assert len([c for c in chunks if c.choices and c.choices[0].text]) >= 2
    assert chunks[-1].choices[0].finish_reason in ("length", "stop")


def test_chat_completion(client):
    response = client.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "Say something."}], max_tokens=8, temperature=0
    )
    assert response.choices[0].message.role == "assistant"
    assert response.usage.completion_tokens >= 1


def test_chat_completion_streamed(client):
    chunks = list(
        client.chat.completions.create(
            model=MODEL, messages=[{"role": "user", "content": "Stream it."}], max_tokens=8, stream=True
        )
    )
    deltas = [c.choices[0].delta.content for c in chunks if c.choices and c.choices[0].delta.content]
    assert len(deltas) >= 2


def test_eight_concurrent_requests_all_succeed(client):
    def one(index: int):
        return client.completions.create(
            model=MODEL, prompt=unique_prompt(f"par{index}", 64), max_tokens=8, temperature=0
        )

    with ThreadPoolExecutor(max_workers=8) as pool:
        results = list(pool.map(one, range(8)))
    assert len(results) == 8
    assert all(r.usage.prompt_tokens == 64 and r.usage.completion_tokens >= 1 for r in results)


def test_decode_reuses_the_kv_cache_that_prefill_computed(server, client):
    before = counters(server)
    response = client.completions.create(model=MODEL, prompt=unique_prompt("kv", 120), max_tokens=8, temperature=0)
    prompt_tokens = response.usage.prompt_tokens
    assert prompt_tokens == 120
    after = wait_for_counters(server, before, "Decode", PROMPT_TOKENS_BY_SOURCE, "external_kv_transfer", prompt_tokens)
    after = wait_for_counters(server, before, "Prefill", PROMPT_TOKENS_BY_SOURCE, "local_compute", prompt_tokens)
    # Prefill computed the prompt; decode received all of it over NIXL and computed none itself.
    assert counter_delta(before, after, "Prefill", PROMPT_TOKENS_BY_SOURCE, "local_compute") == prompt_tokens
    assert counter_delta(before, after, "Decode", PROMPT_TOKENS_BY_SOURCE, "external_kv_transfer") == prompt_tokens
    assert counter_delta(before, after, "Decode", PROMPT_TOKENS_BY_SOURCE, "local_compute") == 0
    assert counter_delta(before, after, "Decode", EXTERNAL_PREFIX_HITS) == prompt_tokens
    assert counter_delta(before, after, "Decode", NIXL_TRANSFERS) >= 1


# Bad requests get OpenAI-style 4xx errors, and the server keeps serving --------------------------


def test_unknown_model_is_404(client):
    with pytest.raises(openai.NotFoundError) as caught:
        client.completions.create(model="no-such-model", prompt="hi", max_tokens=4)
    assert caught.value.status_code == 404


def test_max_tokens_beyond_context_window_is_400(client):
    with pytest.raises(openai.BadRequestError) as caught:
        client.completions.create(model=MODEL, prompt=unique_prompt("long"), max_tokens=100_000)
    assert caught.value.status_code == 400
    assert "context" in str(caught.value).lower() or "max" in str(caught.value).lower()


def test_empty_message_list_is_400(client):
    with pytest.raises(openai.BadRequestError) as caught:
        client.chat.completions.create(model=MODEL, messages=[], max_tokens=4)
    assert caught.value.status_code == 400


def test_malformed_json_is_a_4xx_with_an_error_body(server):
    request = urllib.request.Request(
        f"{server.base_url}/chat/completions",
        data=b'{"model": "tiny-llama", "messages": [',
        headers={"Content-Type": "application/json"},
        method="POST",
    )
    with pytest.raises(urllib.error.HTTPError) as caught:
        urllib.request.urlopen(request, timeout=30)
    assert 400 <= caught.value.code < 500
    body = json.loads(caught.value.read())
    assert "error" in body or "detail" in body


def test_server_still_serves_after_bad_requests(client):
    response = client.completions.create(model=MODEL, prompt=unique_prompt("after"), max_tokens=4)
    assert response.usage.completion_tokens >= 1
