"""Weights streamed from S3 into the engines, for real on this CPU.

The tiny model is mirrored into an S3-compatible server on loopback by the mirror Job's own
script (mirror/job.py), and both engines load it with vLLM's Run:ai Model Streamer
(``load_format: runai_streamer``) from its s3:// URI, the way the cluster loads a mirrored model:
the spec's callback names the URI for the engine (Ray 2.58 would otherwise hand it the model id).
Then a request goes through prefill and decode with its KV over NIXL, as in the other local tests.
"""

from __future__ import annotations

import pytest

from local.metrics import PROMPT_TOKENS_BY_SOURCE, counter_delta
from tests.local.conftest import openai_client, report_measurement, unique_prompt, wait_for_counters

pytest.importorskip("runai_model_streamer_s3", reason="the serving stack (requirements-serve.txt) is not installed")
pytestmark = pytest.mark.live
MODEL = "tiny-llama"


@pytest.fixture(scope="module")
def server(shared_servers):
    # The disaggregated tests' server: its weights come from the loopback S3 (--model-from-s3),
    # its code from dev's published asset. These tests run first on it, before any replica restarts.
    return shared_servers.get("disaggregated")


def test_the_engines_load_the_weights_from_the_s3_uri(server):
    assert server.status["model_source"] == "s3://local-models/tiny-llama"
    # Ray prefixes each forwarded line with its replica; tqdm's carriage returns stay inside the line.
    log = server.log_path.read_bytes().decode(errors="replace").split("\n")
    # vLLM's Run:ai loader reports its progress per engine (model_loader/weight_utils.py,
    # runai_safetensors_weights_iterator); both phases must have streamed every tensor.
    for phase in ("Prefill", "Decode"):
        assert any(
            f"{phase}:{MODEL}" in line and "Loading safetensors using Runai Model Streamer: 100% Completed" in line
            for line in log
        ), f"{phase} did not stream the weights"
    report_measurement("streamed-weights-ready", {"ready_seconds": server.status["ready_seconds"]})


def test_a_request_goes_through_both_phases_with_its_kv(server):
    client = openai_client(server)
    before = server.counters()
    response = client.completions.create(
        model=MODEL, prompt=unique_prompt("streamed", 120), max_tokens=4, temperature=0
    )
    assert response.usage.prompt_tokens == 120
    after = wait_for_counters(server, before, "Decode", PROMPT_TOKENS_BY_SOURCE, "external_kv_transfer", 120)
    moved = counter_delta(before, after, "Decode", PROMPT_TOKENS_BY_SOURCE, "external_kv_transfer")
    assert counter_delta(before, after, "Prefill", PROMPT_TOKENS_BY_SOURCE, "local_compute") == 120
    assert moved == 120
    assert counter_delta(before, after, "Decode", PROMPT_TOKENS_BY_SOURCE, "local_compute") == 0
