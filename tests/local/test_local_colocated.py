"""The colocated baseline on this CPU: the same app, model and endpoint, one engine for both phases.

A reasoned subset of the disaggregated suite: the OpenAI surface (ingress, error handling) is the
same code in both modes and is covered there; here each endpoint shape is exercised once, and the
counters show that this mode computes every prompt locally with no KV transfer.
"""

from __future__ import annotations

import time

import openai
import pytest

from local.metrics import PROMPT_TOKENS_BY_SOURCE, counter_delta
from tests.local.conftest import measure_one_request, openai_client, report_measurement

pytestmark = pytest.mark.live
MODEL = "tiny-llama"


@pytest.fixture(scope="module")
def server(shared_servers):
    return shared_servers.get("colocated")


@pytest.fixture(scope="module")
def client(server):
    return openai_client(server)


def test_ready_time_and_one_request_latency_are_recorded(server, client):
    measured = measure_one_request(server, client, MODEL)
    report_measurement("colocated-ready-and-latency", measured)
    assert measured["prompt_tokens"] == 100 and measured["completion_tokens"] == 8


def test_same_model_same_endpoint_shape(client):
    assert [m.id for m in client.models.list().data] == [MODEL]


def test_chat_and_streamed_completion(client):
    chat = client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "Hello"}], max_tokens=8)
    assert chat.usage.completion_tokens >= 1
    chunks = list(client.completions.create(model=MODEL, prompt="x" * 50, max_tokens=8, stream=True))
    assert len([c for c in chunks if c.choices and c.choices[0].text]) >= 2


def test_unknown_model_is_404(client):
    with pytest.raises(openai.NotFoundError):
        client.completions.create(model="no-such-model", prompt="hi", max_tokens=4)


def test_prompt_is_computed_locally_without_transfer(server, client):
    before = server.counters()
    prompt = f"colocated {time.time_ns()} " + "a" * 80
    response = client.completions.create(model=MODEL, prompt=prompt[:90], max_tokens=4)
    tokens = response.usage.prompt_tokens
    deadline = time.monotonic() + 30
    while True:
        after = server.counters()
        local = counter_delta(before, after, "LLMServer", PROMPT_TOKENS_BY_SOURCE, "local_compute")
        if local >= tokens or time.monotonic() > deadline:
            break
        time.sleep(1)
    assert local == tokens
    assert counter_delta(before, after, "LLMServer", PROMPT_TOKENS_BY_SOURCE, "external_kv_transfer") == 0


def test_tiny_benchmark_runs_end_to_end(server, tmp_path, bench_rows):
    """`make bench`'s command as the user runs it: its terminal ends with the report and where it
    was written; vLLM's own output and what the interpreter's exit prints are in the folder's log."""
    import json
    import subprocess
    import sys

    from tests.conftest import ROOT

    done = subprocess.run(
        [sys.executable, "-m", "bench.run", "--url", server.base_url, "--workload", "tiny", "--model", MODEL]
        + ["--label", "colocated", "--out", str(tmp_path)],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stdout[-4000:]
    rows = json.loads((tmp_path / "rows.json").read_text())
    assert all(r["completed"] == 6 and r["failed"] == 0 for r in rows)
    report = [line for line in (tmp_path / "report.md").read_text().splitlines() if line]
    terminal = [line for line in done.stdout.splitlines() if line]
    assert terminal[-len(report) - 1 :] == [*report, f"results in {tmp_path}"], done.stdout[-4000:]
    assert "termplotlib" not in done.stdout and "nanobind" not in done.stdout
    assert "Serving Benchmark Result" in (tmp_path / "bench.log").read_text()
    bench_rows["colocated"] = rows
