"""serve_app for real on this CPU in disaggregated mode, driven by the OpenAI client.

One local server (Ray Serve, vLLM CPU engines, NIXL over loopback), shared with the streaming tests
(tests/local/conftest.py), serves this module; it is always stopped afterwards.
"""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import openai
import pytest

from local.harness import session_processes
from local.metrics import (
    EXTERNAL_PREFIX_HITS,
    NIXL_TRANSFERS,
    PROMPT_TOKENS_BY_SOURCE,
    counter_delta,
)
from tests.conftest import ROOT
from tests.local.conftest import (
    measure_one_request,
    openai_client,
    report_measurement,
    unique_prompt,
    wait_for_counters,
)

pytestmark = pytest.mark.live
MODEL = "tiny-llama"


@pytest.fixture(scope="module")
def server(shared_servers):
    # The code comes as the cluster gets it: dev's synthesized asset, published by the CDK CLI to
    # a loopback S3 and fetched by Ray from the s3:// working_dir (local/code_asset.py).
    return shared_servers.get("disaggregated")


def test_serve_app_came_from_the_published_asset(server):
    assert server.status["code"].startswith("s3://cdk-hnb659fds-assets-000000000000-us-east-2/")


@pytest.fixture(scope="module")
def client(server):
    return openai_client(server)


def test_ready_means_a_completion_went_through_both_phases(server, client):
    """The ready line comes after a chat completion went through prefill and decode (KV included);
    a request sent right after it succeeds. /v1/models may answer earlier."""
    assert server.status["ready"] is True
    assert server.status["models_seconds"] <= server.status["ready_seconds"]
    assert "a chat completion went through prefill and decode, KV over NIXL" in server.log_path.read_text()
    measured = measure_one_request(server, client, MODEL)
    report_measurement("disaggregated-ready-and-latency", measured)
    assert measured["prompt_tokens"] == 100 and measured["completion_tokens"] == 8


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
    before = server.counters()
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


# Selective disaggregation: below serving.pd_min_prompt_tokens, decode prefills the prompt itself --


def local_threshold() -> int:
    from serve_app.spec import load_spec

    threshold = load_spec(str(ROOT / "config" / "local.yaml")).pd_min_prompt_tokens
    assert threshold > 0, "config/local.yaml runs selective P/D (its tests below need a threshold)"
    return threshold


def test_a_prompt_below_the_threshold_never_reaches_prefill(server, client):
    short = local_threshold() - 12
    before = server.counters()
    response = client.completions.create(model=MODEL, prompt=unique_prompt("short", short), max_tokens=8, temperature=0)
    assert response.usage.prompt_tokens == short
    after = wait_for_counters(server, before, "Decode", PROMPT_TOKENS_BY_SOURCE, "local_compute", short)
    # Decode computed the whole prompt; prefill saw nothing and no KV moved.
    assert counter_delta(before, after, "Decode", PROMPT_TOKENS_BY_SOURCE, "local_compute") == short
    assert counter_delta(before, after, "Decode", PROMPT_TOKENS_BY_SOURCE, "external_kv_transfer") == 0
    assert counter_delta(before, after, "Prefill", PROMPT_TOKENS_BY_SOURCE, "local_compute") == 0
    assert counter_delta(before, after, "Decode", NIXL_TRANSFERS) == 0


def test_a_short_chat_is_prefilled_by_decode_too(server, client):
    before = server.counters()
    response = client.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "hi"}], max_tokens=4, temperature=0
    )
    assert response.usage.prompt_tokens < local_threshold()
    after = wait_for_counters(
        server, before, "Decode", PROMPT_TOKENS_BY_SOURCE, "local_compute", response.usage.prompt_tokens
    )
    assert counter_delta(before, after, "Prefill", PROMPT_TOKENS_BY_SOURCE, "local_compute") == 0
    assert counter_delta(before, after, "Decode", PROMPT_TOKENS_BY_SOURCE, "external_kv_transfer") == 0


def test_a_short_message_with_a_long_tool_schema_reaches_prefill(server, client):
    """An agent's first turn: a message shorter than the threshold, and tools whose schemas the chat
    template renders into the prompt (as Qwen2.5's does). The prompt vLLM runs is long, so prefill
    computes it, as selective P/D decides on the prompt vLLM renders, not on the messages alone."""
    tool = {
        "type": "function",
        "function": {
            "name": "search_orders",
            "description": "Find a customer's orders by date range, status and the store they were placed in.",
            "parameters": {
                "type": "object",
                "properties": {name: {"type": "string"} for name in ("customer", "since", "until", "status")},
            },
        },
    }
    before = server.counters()
    response = client.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "hi"}], tools=[tool], max_tokens=4, temperature=0
    )
    prompt_tokens = response.usage.prompt_tokens
    assert prompt_tokens > 4 * local_threshold(), "the tools are rendered into the prompt"
    after = wait_for_counters(server, before, "Prefill", PROMPT_TOKENS_BY_SOURCE, "local_compute", prompt_tokens)
    assert counter_delta(before, after, "Prefill", PROMPT_TOKENS_BY_SOURCE, "local_compute") == prompt_tokens
    assert counter_delta(before, after, "Decode", PROMPT_TOKENS_BY_SOURCE, "external_kv_transfer") == prompt_tokens
    assert counter_delta(before, after, "Decode", PROMPT_TOKENS_BY_SOURCE, "local_compute") == 0


def test_a_prompt_at_the_threshold_is_disaggregated(server, client):
    threshold = local_threshold()
    before = server.counters()
    response = client.completions.create(model=MODEL, prompt=unique_prompt("edge", threshold), max_tokens=4)
    assert response.usage.prompt_tokens == threshold
    after = wait_for_counters(server, before, "Decode", PROMPT_TOKENS_BY_SOURCE, "external_kv_transfer", threshold)
    assert counter_delta(before, after, "Decode", PROMPT_TOKENS_BY_SOURCE, "external_kv_transfer") == threshold
    assert counter_delta(before, after, "Prefill", PROMPT_TOKENS_BY_SOURCE, "local_compute") == threshold
    assert counter_delta(before, after, "Decode", PROMPT_TOKENS_BY_SOURCE, "local_compute") == 0


PROMPT_TOKENS = "ray_vllm_prompt_tokens_total"
FINISHED_REQUESTS = "ray_vllm_request_success_total"
PREFIX_CACHE_HITS = "ray_vllm_prefix_cache_hits_total"


# A whole number of KV blocks whatever decode's block size (a power of two up to 512: the CPU build's
# 128, a GPU's 16), so that every history token can be cached. (vLLM's cache_config_info gauge names
# the size, but it is set once at start and Ray stops exporting a gauge not set again for a while.)
HISTORY_TOKENS = 512


def test_a_next_turn_whose_remainder_decode_lacks_is_short_never_reaches_prefill(server, client):
    """A conversation's first turn is long, so prefill computes it and decode pulls its KV; the next
    turn resends it with a short new message. What decode lacks is that message alone, shorter than
    the threshold: decode computes it and serves the history from its own cache."""
    from bench.next_turn import history_of

    threshold = local_threshold()
    assert HISTORY_TOKENS >= threshold, "the first turn must be long enough for remote prefill"
    history = history_of(HISTORY_TOKENS)
    message = "\nUser: and then? "[: threshold // 2]
    before = server.counters()
    client.completions.create(model=MODEL, prompt=history, max_tokens=4, temperature=0)
    between = wait_for_counters(server, before, "Decode", PROMPT_TOKENS_BY_SOURCE, "external_kv_transfer", len(history))
    assert counter_delta(before, between, "Prefill", PROMPT_TOKENS_BY_SOURCE, "local_compute") == len(history)

    response = client.completions.create(model=MODEL, prompt=history + message, max_tokens=4, temperature=0)
    assert response.usage.prompt_tokens == len(history) + len(message)
    after = wait_for_counters(server, between, "Decode", PROMPT_TOKENS_BY_SOURCE, "local_cache_hit", len(history))
    # Prefill saw no request at all; decode hit the history in its cache and computed the message.
    assert counter_delta(between, after, "Prefill", FINISHED_REQUESTS) == 0
    assert counter_delta(between, after, "Prefill", PROMPT_TOKENS) == 0
    assert counter_delta(between, after, "Decode", PREFIX_CACHE_HITS) == len(history)
    assert counter_delta(between, after, "Decode", PROMPT_TOKENS_BY_SOURCE, "local_cache_hit") == len(history)
    assert counter_delta(between, after, "Decode", PROMPT_TOKENS_BY_SOURCE, "local_compute") == len(message)
    assert counter_delta(between, after, "Decode", PROMPT_TOKENS_BY_SOURCE, "external_kv_transfer") == 0
    assert counter_delta(between, after, "Decode", NIXL_TRANSFERS) == 0


# A reply this long leaves history + reply, less the reply's last token (sampled, never computed), at
# 640 tokens: whole KV blocks whatever decode's block size (the CPU build's 128, a GPU's 16).
LONG_REPLY_TOKENS = 129


def test_a_next_turn_after_a_long_reply_never_reaches_prefill(server, client):
    """Decode records a turn once its engine served it, with the reply's token ids as the engine made
    them, whose blocks vLLM caches like the prompt's: the next turn resends history and reply, and
    what decode lacks is the new message alone. Recorded with the prompt only, the reply would count
    as uncached (longer than the threshold) and the next turn would go through prefill."""
    from bench.next_turn import history_of

    threshold = local_threshold()
    first = post_json(
        server,
        "/completions",
        {
            "model": MODEL,
            "prompt": history_of(HISTORY_TOKENS),
            "max_tokens": LONG_REPLY_TOKENS,
            "ignore_eos": True,
            "temperature": 0,
            "return_token_ids": True,
        },
    )
    choice = first["choices"][0]
    history, reply = choice["prompt_token_ids"], choice["token_ids"]
    assert (len(history), len(reply)) == (HISTORY_TOKENS, LONG_REPLY_TOKENS)
    assert LONG_REPLY_TOKENS > threshold, "the reply alone must be longer than the threshold"
    message = history[: threshold // 2]
    before = server.counters()
    response = client.completions.create(model=MODEL, prompt=history + reply + message, max_tokens=4, temperature=0)
    cached = HISTORY_TOKENS + LONG_REPLY_TOKENS - 1
    assert response.usage.prompt_tokens == cached + 1 + len(message)
    after = wait_for_counters(server, before, "Decode", PROMPT_TOKENS_BY_SOURCE, "local_cache_hit", cached)
    assert counter_delta(before, after, "Prefill", FINISHED_REQUESTS) == 0
    assert counter_delta(before, after, "Decode", PROMPT_TOKENS_BY_SOURCE, "local_cache_hit") == cached
    assert counter_delta(before, after, "Decode", PROMPT_TOKENS_BY_SOURCE, "local_compute") == 1 + len(message)
    assert counter_delta(before, after, "Decode", NIXL_TRANSFERS) == 0


# Requests P/D cannot split run whole on decode, whatever the prompt's length ---------------------

# Each a prompt long enough for remote prefill (the threshold of config/local.yaml is far below it).
# Their answers equal colocated's (tests/local/test_local_parity.py); here, where they ran.
WHOLE_ON_DECODE = {
    "prompt_logprobs": ("completions", {"prompt_logprobs": 2, "max_tokens": 4}),
    "chat prompt_logprobs": ("chat", {"prompt_logprobs": 1, "max_tokens": 4}),
    "echo with logprobs": ("completions", {"echo": True, "logprobs": 1, "max_tokens": 0}),
    "n": ("completions", {"n": 3, "temperature": 1.0, "seed": 3, "max_tokens": 4}),
    "beam search": ("completions", {"use_beam_search": True, "n": 2, "max_tokens": 4}),
}


def post_json(server, path: str, body: dict) -> dict:
    request = urllib.request.Request(
        server.base_url + path, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(request, timeout=120) as response:
        return json.loads(response.read())


@pytest.mark.parametrize("case", WHOLE_ON_DECODE)
def test_a_request_that_cannot_be_split_runs_whole_on_decode(server, case):
    """Prefill sees none of it (it would compute the prompt once per child, hold the others' blocks
    for NIXL's lease, and give decode no prompt logprobs); decode computes the prompt itself."""
    kind, fields = WHOLE_ON_DECODE[case]
    text = unique_prompt(f"whole {case}", 120)
    body = {"model": MODEL, **fields}
    body |= {"messages": [{"role": "user", "content": text}]} if kind == "chat" else {"prompt": text}
    before = server.counters()
    answer = post_json(server, f"/{kind.replace('chat', 'chat/completions')}", body)
    prompt_tokens = answer["usage"]["prompt_tokens"]
    assert prompt_tokens > local_threshold()
    after = wait_for_counters(server, before, "Decode", PROMPT_TOKENS_BY_SOURCE, "local_compute", prompt_tokens)
    assert counter_delta(before, after, "Decode", PROMPT_TOKENS_BY_SOURCE, "local_compute") >= prompt_tokens
    assert counter_delta(before, after, "Decode", PROMPT_TOKENS_BY_SOURCE, "external_kv_transfer") == 0
    assert counter_delta(before, after, "Decode", NIXL_TRANSFERS) == 0
    assert counter_delta(before, after, "Prefill", PROMPT_TOKENS) == 0
    assert counter_delta(before, after, "Prefill", FINISHED_REQUESTS) == 0
    if "prompt_logprobs" in fields:
        # One entry per prompt token: None for the first, a token's logprobs for each after it.
        logprobs = answer["prompt_logprobs"] if kind == "chat" else answer["choices"][0]["prompt_logprobs"]
        assert len(logprobs) == prompt_tokens and logprobs[0] is None and all(logprobs[1:]), logprobs[:3]
    if fields.get("echo"):
        assert answer["choices"][0]["text"] == text
        assert len(answer["choices"][0]["logprobs"]["tokens"]) == prompt_tokens
    assert len(answer["choices"]) == fields.get("n", 1)


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


# Load, benchmark and failure behaviour ---------------------------------------------------------
# These run last in this module: the failure test kills the prefill replica (and waits for Serve
# to bring it back).

LOAD_CLIENTS = 16
LOAD_SECONDS = 60
REQUEST_TIMEOUT_S = 60


def run_load(base_url: str, *, clients: int, seconds: float, stop_event=None) -> list[dict]:
    """Closed-loop clients sending short completions; returns one record per request."""
    import threading

    stop_event = stop_event or threading.Event()
    deadline = time.monotonic() + seconds
    records: list[dict] = []
    lock = threading.Lock()

    def worker(index: int):
        client = openai.OpenAI(base_url=base_url, api_key="unused", timeout=REQUEST_TIMEOUT_S, max_retries=0)
        n = 0
        while time.monotonic() < deadline and not stop_event.is_set():
            started = time.monotonic()
            record = {"client": index, "started": started}
            try:
                client.completions.create(model=MODEL, prompt=unique_prompt(f"load{index}-{n}", 64), max_tokens=8)
                record["outcome"] = "ok"
            except openai.APIStatusError as exc:
                record["outcome"] = f"http {exc.status_code}"
                record["message"] = str(exc)[:200]
            except openai.APITimeoutError:
                record["outcome"] = "timeout"
            except openai.APIConnectionError as exc:
                record["outcome"] = "connection"
                record["message"] = str(exc)[:200]
            record["seconds"] = time.monotonic() - started
            with lock:
                records.append(record)
            n += 1

    threads = [threading.Thread(target=worker, args=(i,), daemon=True) for i in range(clients)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(seconds + REQUEST_TIMEOUT_S + 30)
    return records


LONG_STREAM_TOKENS = 300
LOAD_BOUND_S = 900
# Submitting took 181 s on a quiet 2-core machine with the load running (results/local-tests).
SUBMIT_BOUND_S = 480


def stream_loop(base_url: str, stop_event) -> list[dict]:
    """One client streaming long completions back to back (every one exactly LONG_STREAM_TOKENS
    tokens long: ignore_eos) until ``stop_event``; one record per stream: when its first and last
    token came, how many came, how it ended."""
    client = openai.OpenAI(base_url=base_url, api_key="unused", timeout=REQUEST_TIMEOUT_S, max_retries=0)
    records: list[dict] = []
    n = 0
    while not stop_event.is_set() and n < 200:
        record: dict = {"started": time.monotonic(), "tokens": 0, "first_token": None, "finish_reason": None}
        try:
            stream = client.completions.create(
                model=MODEL,
                prompt=unique_prompt(f"long-stream-{n}", 40),
                max_tokens=LONG_STREAM_TOKENS,
                stream=True,
                stream_options={"include_usage": True},
                extra_body={"ignore_eos": True},
            )
            for chunk in stream:
                for choice in chunk.choices:
                    if choice.text:
                        record["first_token"] = record["first_token"] or time.monotonic()
                    record["finish_reason"] = choice.finish_reason or record["finish_reason"]
                if chunk.usage:
                    record["tokens"] = chunk.usage.completion_tokens
            record["outcome"] = "ok" if record["finish_reason"] == "length" else "short"
        except openai.APIStatusError as exc:
            record["outcome"] = f"http {exc.status_code}"
        except (openai.APITimeoutError, openai.APIConnectionError) as exc:
            record["outcome"] = type(exc).__name__
        except openai.APIError as exc:  # an error event inside the stream
            record["outcome"] = f"stream error: {str(exc)[:120]}"
        record["ended"] = time.monotonic()
        records.append(record)
        n += 1
    return records


def summary(records: list[dict], seconds: float) -> dict:
    import statistics

    ok = sorted(r["seconds"] for r in records if r["outcome"] == "ok")
    return {
        "requests": len(records),
        "ok": len(ok),
        "failed": len(records) - len(ok),
        "requests_per_s": round(len(ok) / seconds, 2),
        "p50_s": round(statistics.median(ok), 3) if ok else None,
        "p99_s": round(ok[min(len(ok) - 1, int(len(ok) * 0.99))], 3) if ok else None,
        "max_s": round(max(r["seconds"] for r in records), 3) if records else None,
    }


def test_bounded_load_has_no_failed_requests(server):
    records = run_load(server.base_url, clients=LOAD_CLIENTS, seconds=LOAD_SECONDS)
    result = summary(records, LOAD_SECONDS)
    report_measurement("load-16-clients-60s", result)
    failures = [r for r in records if r["outcome"] != "ok"]
    assert result["requests"] >= LOAD_CLIENTS
    assert failures == []
    assert server.process.poll() is None


def test_tiny_benchmark_runs_end_to_end(server, tmp_path, bench_rows):
    from bench.run import dated_dir
    from bench.run import main as bench_main

    out_dir = dated_dir(tmp_path)
    code = bench_main(
        [
            "--url",
            server.base_url,
            "--workload",
            "tiny",
            "--model",
            MODEL,
            "--label",
            "disaggregated",
            "--out",
            str(out_dir),
        ]
    )
    assert code == 0
    rows = json.loads((out_dir / "rows.json").read_text())
    assert [r["concurrency"] for r in rows] == [1, 2]
    assert all(r["completed"] == 6 and r["failed"] == 0 for r in rows)
    assert all(r["latency_ms"]["p99_ttft_ms"] > 0 for r in rows)
    assert (out_dir / "tiny.png").stat().st_size > 10_000
    assert "| disaggregated | 1 |" in (out_dir / "report.md").read_text()
    bench_rows["disaggregated"] = rows


def test_ratios_against_colocated_from_the_same_session(bench_rows):
    from bench.compare import ratio_table
    from bench.run import Row

    if "colocated" not in bench_rows:
        pytest.skip("the colocated module did not run in this session")
    ratios = ratio_table([Row(**r) for r in bench_rows["disaggregated"]], [Row(**r) for r in bench_rows["colocated"]])
    report_measurement("bench-tiny-ratios", {"table": ratios})
    assert ratios.count("\n") == 3  # header, rule, two concurrency levels
    assert "×" in ratios


def server_spec():
    from local.server import DEFAULT_SPEC
    from serve_app.spec import load_spec

    return load_spec(str(DEFAULT_SPEC))


def prefill_replica_pids(session: int) -> list[int]:
    from local.ray_internals import replica_process_title

    title = replica_process_title(server_spec().app_name, "Prefill")
    pids = []
    for pid in session_processes(session):
        try:
            cmdline = open(f"/proc/{pid}/cmdline", "rb").read().replace(b"\0", b" ").decode(errors="replace")
        except FileNotFoundError:
            continue
        if title in cmdline:
            pids.append(pid)
    return pids


def fallbacks(server) -> float:
    """Requests decode served itself because prefill was gone (serve_app/pd_decode.py's Ray metric)."""
    from local.metrics import scrape

    samples = [s for url in server.metrics_urls() for s in scrape(url)]
    return sum(s.value for s in samples if s.name == "ray_pd_prefill_fallbacks_total")


def test_killing_prefill_under_load_costs_no_request_and_recovers(server, client):
    """The one prefill replica is killed under load. Decode serves every request itself while prefill
    is gone (the calls the dead replica held, and those sent before Serve has replaced it), so no
    client sees an error; once Serve has restarted prefill, decode pulls prefill's KV again."""
    import os
    import signal
    import threading

    stop = threading.Event()
    outcome: dict = {}
    fallbacks_before = fallbacks(server)
    loader = threading.Thread(
        target=lambda: outcome.setdefault("records", run_load(server.base_url, clients=4, seconds=45, stop_event=stop)),
        daemon=True,
    )
    loader.start()
    time.sleep(8)
    victims = prefill_replica_pids(server.process.pid)
    assert victims, "no prefill replica process found"
    killed_at = time.monotonic()
    for pid in victims:
        os.kill(pid, signal.SIGKILL)
    # A long prompt right after the kill: answered, by decode alone, while prefill is gone.
    started = time.monotonic()
    during = client.completions.create(model=MODEL, prompt=unique_prompt("prefill-gone", 90), max_tokens=4, timeout=60)
    answered_during_s = time.monotonic() - started
    loader.join(45 + REQUEST_TIMEOUT_S + 60)
    records = outcome["records"]

    errors = [r for r in records if r["outcome"] != "ok"]
    assert records and not errors, errors[:3]
    assert during.usage.prompt_tokens == 90
    fell_back = fallbacks(server) - fallbacks_before
    assert fell_back >= 1, "decode counted no request it served itself"

    # Once Serve has restarted the prefill replica, decode takes a prompt's KV from it again (the new
    # NIXL peer), computing none of it: a transfer, not a recompute.
    transferred_after = None
    deadline = time.monotonic() + 600
    while transferred_after is None and time.monotonic() < deadline:
        before = server.counters()
        response = client.completions.create(model=MODEL, prompt=unique_prompt("after-recovery", 90), max_tokens=4)
        after = wait_for_counters(server, before, "Decode", PROMPT_TOKENS_BY_SOURCE, "external_kv_transfer", 90, 10)
        pulled = counter_delta(before, after, "Decode", PROMPT_TOKENS_BY_SOURCE, "external_kv_transfer")
        if pulled == response.usage.prompt_tokens:
            assert counter_delta(before, after, "Decode", PROMPT_TOKENS_BY_SOURCE, "local_compute") == 0
            transferred_after = time.monotonic() - killed_at
        else:
            time.sleep(5)
    report_measurement(
        "prefill-killed-under-load",
        {
            **summary(records, 45),
            "long_prompt_answered_by_decode_after_s": round(answered_during_s, 1),
            "requests_decode_served_itself": fell_back,
            "kv_transfer_from_the_new_prefill_after_s": round(transferred_after, 1) if transferred_after else None,
            "prefill_pids_killed": victims,
            "prefill_pids_after": prefill_replica_pids(server.process.pid),
        },
    )
    assert transferred_after is not None, "no KV transfer from a new prefill replica within 10 minutes of the kill"


def test_verify_checks_pass_against_the_live_local_server(server):
    """`make verify`'s endpoint checks, run for real against the local server."""
    from verify.checks import engine_snapshot, verify_kv_reuse

    chat, kv, reuse, without_prefill, stalls = verify_kv_reuse(
        server.base_url, MODEL, lambda: engine_snapshot(server.status["metrics_url"], server.replicas())
    )
    assert chat.passed, chat.evidence
    assert kv.passed, kv.evidence
    assert reuse.passed, reuse.evidence
    assert "local_compute +0" in kv.evidence
    # The kill above left decode's count of what it served without prefill, which verify reports.
    assert without_prefill.passed and "because prefill was gone" in without_prefill.evidence
    # A killed prefill resets its connections: reads fail at once, none is left to stall.
    assert stalls.passed and stalls.evidence.startswith("no KV read stalled during the check"), stalls.evidence


ROLLOUT_SCRIPT = """
import sys, time
started = time.monotonic()
def phase(name):  # on stderr, so a slow submission says where its time went
    print(f"{name} after {time.monotonic() - started:.1f} s", file=sys.stderr, flush=True)
import ray
from local.assets import streamed_spec
from local.ray_internals import deploy_serve_config
from local.server import DEFAULT_SPEC, local_spec
from serve_app.serve_config import serve_config
phase("imported")
port, working_dir, model_source = int(sys.argv[1]), sys.argv[2], sys.argv[3]
ray.init(address="auto", namespace="serve", logging_level="ERROR", log_to_driver=False)
phase("joined the run's Ray")
spec = local_spec(DEFAULT_SPEC, "disaggregated")
if model_source.startswith("s3://"):  # only the code changes: the weights come from where they came
    spec = streamed_spec(spec, model_source)
config = serve_config(spec, working_dir=working_dir)
config["http_options"].update(host="127.0.0.1", port=port)
deploy_serve_config(config)
phase("submitted")
"""


def test_in_place_rollout_of_a_code_change_measures_what_clients_see(server):
    """serve_app's code changes (a new asset URI, as `make deploy` makes it) and Serve rolls the app
    in place under load. The count is the in-place downtime the README reports; no assertion on it."""
    import os
    import subprocess
    import sys
    import threading

    import boto3

    old = server.status["code"]
    bucket, _, key = old.removeprefix("s3://").partition("/")
    s3 = boto3.client(
        "s3",
        endpoint_url=server.status["code_endpoint"],
        region_name="us-east-2",
        aws_access_key_id="local",
        aws_secret_access_key="local",
    )
    new_key = "changed-" + key
    s3.copy_object(Bucket=bucket, Key=new_key, CopySource={"Bucket": bucket, "Key": key})
    replicas_before = set(server.replicas())

    # The load and the streams run until the app serves again after the rollout (at most LOAD_BOUND_S):
    # submitting the new config alone may take minutes on a busy machine.
    outcome: dict = {}
    load_done = threading.Event()
    loader = threading.Thread(
        target=lambda: outcome.setdefault(
            "records", run_load(server.base_url, clients=4, seconds=LOAD_BOUND_S, stop_event=load_done)
        ),
        daemon=True,
    )
    streams_done = threading.Event()
    streamer = threading.Thread(
        target=lambda: outcome.setdefault("streams", stream_loop(server.base_url, streams_done)), daemon=True
    )
    loader.start()
    streamer.start()
    time.sleep(10)
    rolled_at = time.monotonic()
    submit = subprocess.Popen(
        [
            sys.executable,
            "-c",
            ROLLOUT_SCRIPT,
            str(server.port),
            f"s3://{bucket}/{new_key}",
            server.status["model_source"],
        ],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={
            **os.environ,
            "AWS_ENDPOINT_URL": server.status["code_endpoint"],
            "AWS_ACCESS_KEY_ID": "local",
            "AWS_SECRET_ACCESS_KEY": "local",
            "AWS_REGION": "us-east-2",
            # A process that joins the run's Ray needs the run's token (Ray's token authentication).
            "RAY_AUTH_MODE": "token",
            "RAY_AUTH_TOKEN_PATH": server.status["ray_auth_token_file"],
        },
    )
    try:
        _, submit_log = submit.communicate(timeout=SUBMIT_BOUND_S)
    except subprocess.TimeoutExpired:
        stacks = subprocess.run(
            [str(Path(sys.executable).with_name("py-spy")), "dump", "--pid", str(submit.pid)],
            capture_output=True,
            text=True,
            timeout=60,
        )
        submit.kill()
        _, submit_log = submit.communicate()
        pytest.fail(f"the Serve config was not submitted in {SUBMIT_BOUND_S} s:\n{submit_log[-2000:]}\n{stacks.stdout}")
    assert submit.returncode == 0, submit_log[-2000:]
    submitted_after = time.monotonic() - rolled_at

    # The rollout happened (every engine replica was replaced), and the app serves again with KV transferred.
    def engines() -> set[str]:
        return {r for r, d in server.replicas().items() if d.startswith(("Prefill", "Decode"))}

    deadline = time.monotonic() + 300
    while engines() & replicas_before and time.monotonic() < deadline:
        time.sleep(2)
    assert engines() and not engines() & replicas_before
    replaced_after = time.monotonic() - rolled_at
    streams_done.set()
    streamer.join(REQUEST_TIMEOUT_S + 30)
    streams = outcome["streams"]
    # A stream that got its first token and then ended short: what the rollout cut.
    cut = [r for r in streams if r["first_token"] is not None and r["outcome"] != "ok"]
    # Every stream between the new config's submission and the last old replica's end.
    across = [
        r for r in streams if r["ended"] > rolled_at + submitted_after and r["started"] < rolled_at + replaced_after
    ]
    client = openai_client(server)
    # New replicas can be listed before they answer within Serve's request timeout, and a new decode
    # replica pre-warms NIXL with a request of its own. One answered request means both have settled,
    # so the counters hold only the measured request's tokens next.
    serves_again_after = None
    while serves_again_after is None and time.monotonic() < deadline + 300:
        try:
            client.completions.create(model=MODEL, prompt=unique_prompt("after-rollout-warm", 20), max_tokens=1)
            serves_again_after = time.monotonic() - rolled_at
        except openai.APIError:
            time.sleep(2)
    time.sleep(10)  # ten seconds of load on the new replicas
    load_done.set()
    loader.join(REQUEST_TIMEOUT_S + 60)
    records = outcome["records"]
    loaded_for = max(r["started"] + r["seconds"] for r in records) - min(r["started"] for r in records)
    failed = [r for r in records if r["outcome"] != "ok"]
    window = (
        (min(r["started"] for r in failed) - rolled_at, max(r["started"] + r["seconds"] for r in failed) - rolled_at)
        if failed
        else None
    )
    report_measurement(
        "in-place-rollout",
        {
            **summary(records, loaded_for),
            "load_s": round(loaded_for, 1),
            "errors": sorted({r["outcome"] for r in failed}),
            "failing_from_s_after_rollout": round(window[0], 1) if window else None,
            "failing_until_s_after_rollout": round(window[1], 1) if window else None,
            "submitted_after_s": round(submitted_after, 1),
            "submission_phases": [line for line in submit_log.splitlines() if " after " in line],
            "replicas_replaced_after_s": round(replaced_after, 1),
            "serves_again_after_s": round(serves_again_after, 1) if serves_again_after else None,
            "long_streams": {
                "tokens_each": LONG_STREAM_TOKENS,
                "streams": len(streams),
                "complete": sum(r["outcome"] == "ok" for r in streams),
                "cut_after_their_first_token": len(cut),
                "refused_before_their_first_token": sorted(
                    {r["outcome"] for r in streams if r["first_token"] is None and r["outcome"] != "ok"}
                ),
                "longest_s": round(max((r["ended"] - r["started"] for r in streams), default=0), 1),
                "around_the_rollout": [
                    {
                        "started_s_after_rollout": round(r["started"] - rolled_at, 1),
                        "ended_s_after_rollout": round(r["ended"] - rolled_at, 1),
                        "tokens": r["tokens"],
                        "outcome": r["outcome"],
                    }
                    for r in across
                ],
            },
        },
    )
    assert serves_again_after is not None, "no answer within 5 minutes of the replicas being replaced"
    # The replicas Serve stopped drained their streams (serving.drain_timeout_s, the request timeout
    # by default, outlasts a stream): none that had started was cut.
    assert streams and not cut, cut
    before = server.counters()
    response = client.completions.create(model=MODEL, prompt=unique_prompt("after-rollout", 90), max_tokens=4)
    after = wait_for_counters(
        server, before, "Decode", PROMPT_TOKENS_BY_SOURCE, "external_kv_transfer", response.usage.prompt_tokens
    )
    assert (
        counter_delta(before, after, "Decode", PROMPT_TOKENS_BY_SOURCE, "external_kv_transfer")
        == response.usage.prompt_tokens
    )
