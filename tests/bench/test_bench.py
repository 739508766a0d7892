"""The benchmark harness's own logic: presets, the generator's arguments, tables and ratios."""

from __future__ import annotations

import datetime as dt
import math
import re
from pathlib import Path

import pytest

from bench.compare import ratio_table
from bench.run import PERCENTILES, bench_args, dated_dir, load_workloads, row_from_result, server_root, table


def test_presets_include_long_prompt_chat_and_tiny():
    workloads = load_workloads()
    assert {"long-prompt", "chat", "tiny"} <= set(workloads)
    long_prompt = workloads["long-prompt"]
    assert (long_prompt.input_len, long_prompt.output_len) == (4096, 256)
    assert long_prompt.concurrency == sorted(long_prompt.concurrency)


def test_generator_arguments(tmp_path):
    workload = load_workloads()["long-prompt"]
    args = bench_args(
        url="http://lb.internal:8000/v1/",
        model="qwen",
        tokenizer="Qwen/Qwen2.5-7B-Instruct",
        workload=workload,
        concurrency=8,
        out_dir=tmp_path,
        label="disaggregated",
    )
    pairs = dict(zip(args[::1], args[1::1], strict=False))
    assert pairs["--base-url"] == "http://lb.internal:8000"
    assert pairs["--endpoint"] == "/v1/completions"
    assert pairs["--random-input-len"] == "4096" and pairs["--random-output-len"] == "256"
    assert pairs["--max-concurrency"] == "8"
    assert pairs["--metric-percentiles"] == "90,95,99"
    goodput = args.index("--goodput")
    assert args[goodput + 1 : goodput + 3] == ["ttft:3000.0", "tpot:100.0"]
    assert pairs["--result-filename"] == "disaggregated-long-prompt-c8.json"


def _parsed_by_vllm(workload, concurrency: int, out_dir):
    """The arguments make bench gives `vllm bench serve`, read by vLLM's own parser."""
    from vllm.benchmarks.serve import add_cli_args
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    parser = FlexibleArgumentParser()
    add_cli_args(parser)
    return parser.parse_args(
        bench_args(
            url="http://127.0.0.1:8000/v1",
            model="tiny-llama",
            tokenizer="/tmp/tok",
            workload=workload,
            concurrency=concurrency,
            out_dir=out_dir,
            label="x",
        )
    )


@pytest.mark.serving
def test_generator_arguments_parse_with_vllms_own_parser(tmp_path):
    parsed = _parsed_by_vllm(load_workloads()["tiny"], 2, tmp_path)
    assert parsed.max_concurrency == 2
    assert parsed.dataset_name == "random"
    assert parsed.random_input_len == 64


@pytest.mark.serving
def test_the_shared_context_preset_gives_every_prompt_of_vllms_random_dataset_one_prefix(tmp_path):
    workload = load_workloads()["shared-context-rag"]
    parsed = _parsed_by_vllm(workload, 4, tmp_path)
    assert workload.prefix_len > workload.input_len
    assert (parsed.random_prefix_len, parsed.random_input_len) == (workload.prefix_len, workload.input_len)


def test_server_root_strips_the_api_prefix():
    assert server_root("http://127.0.0.1:8000/v1") == "http://127.0.0.1:8000"
    assert server_root("http://127.0.0.1:8000") == "http://127.0.0.1:8000"


def _row(label, concurrency, ttft, tput):
    result = {
        "completed": 10,
        "failed": 0,
        "request_throughput": tput,
        "output_throughput": tput * 100,
        "request_goodput": tput / 2,
    }
    # The keys `vllm bench serve` writes (vllm/benchmarks/serve.py, process_one_metric), with
    # --metric-percentiles as bench_args passes them.
    for metric, base in (("ttft", ttft), ("tpot", 10.0), ("itl", 10.0)):
        result[f"mean_{metric}_ms"] = base * 1.1
        result[f"median_{metric}_ms"] = base
        result[f"std_{metric}_ms"] = base / 3
        for p in PERCENTILES:
            result[f"p{p}_{metric}_ms"] = base * (1 + p / 100)
    return row_from_result(label, concurrency, result)


def test_rows_from_a_vllm_result_keep_its_means_medians_and_tails_under_its_names():
    row = _row("pd", 4, 100.0, 2.0)
    assert row.latency_ms["mean_ttft_ms"] == pytest.approx(110.0)
    assert row.latency_ms["median_itl_ms"] == 10.0
    assert row.latency_ms["p95_tpot_ms"] == pytest.approx(19.5)
    assert row.goodput == 1.0
    assert "| pd | 4 | 10 | 0 | 2.00 | 200.0 | 1.00 | 110.0 | 100.0 | 190.0 | 195.0 | 199.0 |" in table([row])
    assert "| mean_ttft_ms | median_ttft_ms | p90_ttft_ms | p95_ttft_ms | p99_ttft_ms |" in table([row])


def test_the_calibration_file_carries_the_rows_under_vllms_names_and_the_fit_reads_them(tmp_path):
    from types import SimpleNamespace

    from bench.calibration import write_calibration
    from planner.calibration import _median_itl_ms, load

    row = _row("colocated", 1, 100.0, 2.0)
    workload = SimpleNamespace(name="tiny", input_len=64, output_len=16, range_ratio=0.0, num_prompts=6)
    write_calibration(tmp_path, model="m", workload=workload, rows=[row])
    written = load(tmp_path)["rows"][0]
    assert {k: written[k] for k in row.latency_ms} == row.latency_ms
    assert _median_itl_ms(written) == row.latency_ms["median_itl_ms"]
    assert "host_cpu" not in written and "host_cores" not in load(tmp_path) and "host_priority" not in load(tmp_path)


def test_a_local_level_s_cpu_per_process_the_cores_and_the_client_s_priority_go_into_the_calibration_file(tmp_path):
    import os
    from dataclasses import replace
    from types import SimpleNamespace

    from bench.calibration import write_calibration
    from planner.calibration import load

    spent = {"ServeReplica:llm:OpenAiIngress": 1.5, "ProxyActor": 1.0, "client": 0.4, "wall_s": 4.0}
    row = replace(_row("colocated", 8, 100.0, 2.0), host_cpu=spent)
    workload = SimpleNamespace(name="tiny", input_len=64, output_len=16, range_ratio=0.0, num_prompts=6)
    priority = "the server's session at autogroup nice 10, the client's at 0"
    write_calibration(tmp_path, model="m", workload=workload, rows=[row], host_priority=priority)
    data = load(tmp_path)
    assert data["rows"][0]["host_cpu"] == spent
    assert data["host_cores"] == len(os.sched_getaffinity(0))
    assert data["host_priority"] == priority
    assert "prefix_cache" not in data["rows"][0]


def test_a_level_s_prefix_cache_hits_go_into_the_calibration_file_and_the_local_check_reads_them(tmp_path):
    from dataclasses import replace
    from types import SimpleNamespace

    from bench.calibration import write_calibration
    from planner.calibration import load
    from planner.local_check import hit_share

    hits = {"Prefill": {"queries": 1792.0, "hits": 448.0}, "Decode": {"queries": 1792.0, "hits": 1776.0}}
    row = replace(_row("disaggregated", 4, 100.0, 2.0), prefix_cache=hits)
    workload = SimpleNamespace(name="tiny", input_len=64, output_len=16, range_ratio=0.0, num_prompts=6)
    write_calibration(tmp_path, model="m", workload=workload, rows=[row])
    written = load(tmp_path)["rows"][0]
    assert written["prefix_cache"] == hits
    assert hit_share(written) == 0.25  # the prefill engine's: it computed the prompts decode then pulled


def test_ratio_table_divides_disaggregated_by_colocated():
    ratios = ratio_table(
        [_row("pd", 1, 300.0, 1.0), _row("pd", 4, 400.0, 3.0)], [_row("co", 1, 100.0, 2.0), _row("co", 4, 800.0, 3.0)]
    )
    lines = ratios.splitlines()
    assert lines[2].startswith("| 1 | 0.50× | 0.50× | 0.50× | 3.00× | 3.00× | 3.00× |")
    assert lines[3].startswith("| 4 | 1.00× | 1.00× | 1.00× | 0.50× |")


def test_results_go_to_a_dated_folder(tmp_path):
    assert dated_dir(tmp_path, now=dt.datetime(2026, 11, 30, 12, 0, 5)) == tmp_path / "2026-11-30_120005"


def test_gpu_check_script_is_valid_bash():
    import subprocess

    from bench.run import ROOT

    result = subprocess.run(["bash", "-n", str(ROOT / "bench" / "gpu" / "run.sh")], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr


def test_gpu_fraction_cannot_combine_with_tensor_parallelism():
    from pydantic import ValidationError

    from serve_app.spec import PhaseSpec

    with pytest.raises(ValidationError, match="cannot combine with tensor_parallel_size 2"):
        PhaseSpec(gpu_fraction=0.5, tensor_parallel_size=2)


def test_ttft_tables_give_the_gap_and_where_it_goes():
    from bench.ttft import SizeResult, ttft_table, where_it_goes, where_table

    pd = [SizeResult("short", 20, [0.12, 0.10, 0.11]), SizeResult("long", 1500, [0.16, 0.15, 0.30])]
    co = [SizeResult("short", 20, [0.03, 0.02, 0.04]), SizeResult("long", 1500, [0.06, 0.05, 0.07])]
    text = ttft_table({"disaggregated": pd, "colocated": co})
    assert "| disaggregated | 110 / 120 | 160 / 300 |" in text
    assert "| P/D − colocated | +80 / +80 | +100 / +230 |" in text
    where = {
        "short": {"Prefill ttft": 40.0, "Decode ttft": 50.0, "Decode nixl": 4.0},
        "long": {"Prefill ttft": 90.0, "Decode ttft": 60.0, "Decode nixl": 6.0},
    }
    rows = where_it_goes(pd, where, "disaggregated")
    assert rows["short"]["outside the engines (hand-off, tokenizing, batching, HTTP)"] == pytest.approx(110 - 90)
    assert "| prefill engine (queue + prefill) | 40 | 90 |" in where_table(rows)


def test_ttft_table_says_which_sizes_selective_pd_kept_on_decode():
    from bench.ttft import SizeResult, ttft_table

    pd = [SizeResult("short", 20, [0.03]), SizeResult("long", 1500, [0.16])]
    co = [SizeResult("short", 20, [0.03]), SizeResult("long", 1500, [0.06])]
    assert "| P/D path | decode alone (< 32) | prefill + KV transfer |" in ttft_table(
        {"disaggregated": pd, "colocated": co}, pd_min_prompt_tokens=32
    )
    assert "P/D path" not in ttft_table({"disaggregated": pd, "colocated": co})


def test_ttft_prompts_are_unique_and_of_the_asked_length():
    from bench.ttft import prompt_of

    first, second = prompt_of(500), prompt_of(500)
    assert len(first) == len(second) == 500 and first[:32] != second[:32]


def test_next_turn_counts_each_phases_tokens_per_request_from_counter_deltas():
    from bench.next_turn import COUNTERS, Turns, report, summed

    computed, cached, pulled = (COUNTERS[k] for k in ("computed", "own cache", "over NIXL"))
    queries, hits = COUNTERS["cache queries"], COUNTERS["cache hits"]

    def snapshot(prefill_computed, prefill_cached, decode_pulled, decode_cached):
        return {
            ("Prefill:m", computed[0], computed[1]): prefill_computed,
            ("Prefill:m", cached[0], cached[1]): prefill_cached,
            ("Prefill:m", queries[0], ""): prefill_computed + prefill_cached,
            ("Prefill:m", hits[0], ""): prefill_cached,
            ("Decode:m", pulled[0], pulled[1]): decode_pulled,
            ("Decode:m", cached[0], cached[1]): decode_cached,
        }

    # Two next turns: one hit 1,408 tokens on prefill, one hit nothing; decode pulled 173 each time.
    start, one, two = snapshot(0, 0, 0, 0), snapshot(173, 1408, 173, 1408), snapshot(1754, 1408, 346, 2816)
    rows = summed([(start, one, 1), (one, two, 1)])
    assert rows["Prefill"]["computed"] == (173 + 1581) / 2
    assert rows["Prefill"]["own cache"] == 1408 / 2
    assert rows["Decode"]["over NIXL"] == 173
    # Both next turns between the same two snapshots (two conversations at a time): the same per request.
    assert summed([(start, two, 2)]) == rows
    requests = [_request(0, 0.1, 1500), _request(0, 0.1, 1500), _request(1, 0.05, 1581), _request(1, 0.07, 1581)]
    table = report({"P/D": Turns(requests, {"next turn": rows})})
    assert "| P/D | 100.0 | 60.0 | 0.60x | 1500, 1581 |" in table
    # Prefill's token hit rate: 1,408 of the 3,162 tokens it was asked about.
    assert f"| {1408 / 3162:.0%} |" in table


def _request(turn, ttft_s, prompt_tokens, start_s=0.0, output_tokens=4):
    from bench.next_turn import Request

    return Request(
        turn,
        start_s,
        ttft_s,
        ttft_s + 0.03 * (output_tokens - 1),
        [0.03] * (output_tokens - 1),
        prompt_tokens,
        output_tokens,
        "x" * output_tokens,
    )


def test_the_multi_turn_preset_is_conversations_over_one_system_prompt_that_fit_the_local_server():
    from bench.compare import LOCAL_SPEC
    from bench.next_turn import NEW_MESSAGE
    from serve_app.spec import load_spec

    agent = load_workloads()["multi-turn-agent"]
    assert agent.turns > 1 and agent.followup_len > 0 and agent.prefix_len > 0 and agent.repeated
    # The last turn's prompt: system prompt and newline, the task, and per earlier turn its reply,
    # the "\nUser: " framing and the new message; then its own reply (characters are tokens there).
    framing = NEW_MESSAGE.index(":") + 2
    last = (
        agent.prefix_len + 1 + agent.input_len + (agent.turns - 1) * (agent.output_len + framing + agent.followup_len)
    )
    assert agent.longest_request_tokens() == last + agent.output_len
    assert last + agent.output_len <= load_spec(str(LOCAL_SPEC)).max_model_len
    # The single-request presets keep vLLM's generator: only a shared prefix makes one repeated.
    for workload in load_workloads().values():
        assert workload.repeated == (workload.turns > 1 or workload.prefix_len > 0)


@pytest.mark.parametrize(
    ("change", "field", "fix"),
    [
        ({"followup_len": 0}, "followup_len", "set followup_len"),
        ({"turns": 1}, "followup_len", "set turns above 1 or drop followup_len"),
        ({"range_ratio": 0.25}, "range_ratio", "set range_ratio: 0"),
    ],
)
def test_a_conversation_preset_that_cannot_run_is_refused_in_one_line_naming_field_and_fix(
    tmp_path, change, field, fix
):
    import yaml

    from bench.run import WORKLOADS_FILE

    body = {**yaml.safe_load(WORKLOADS_FILE.read_text())["multi-turn-agent"], **change}
    path = tmp_path / "workloads.yaml"
    path.write_text(yaml.safe_dump({"agent": body}))
    with pytest.raises(SystemExit) as refused:
        load_workloads(path)
    line = str(refused.value)
    assert "\n" not in line and line.startswith("workloads.yaml: agent") and field in line and fix in line


def test_turns_give_each_turn_index_its_median_ttft():
    from bench.next_turn import Turns

    ttfts = {0: [0.30, 0.10, 0.20], 1: [0.05, 0.07, 0.06], 2: [0.09, 0.04, 0.08]}
    turns = Turns([_request(i, s, 100 * (i + 1)) for i, values in ttfts.items() for s in values])
    assert turns.turns == len(ttfts)
    assert turns.median_ttft_ms() == pytest.approx([sorted(v)[1] * 1e3 for v in ttfts.values()])
    assert turns.median_prompt_tokens() == [100 * (i + 1) for i in ttfts]


def _counters(prefill_queries, prefill_hits, decode_queries, decode_hits):
    from bench.next_turn import COUNTERS

    queries, hits = COUNTERS["cache queries"][0], COUNTERS["cache hits"][0]
    return {
        ("Prefill:m", queries, ""): prefill_queries,
        ("Prefill:m", hits, ""): prefill_hits,
        ("Decode:m", queries, ""): decode_queries,
        ("Decode:m", hits, ""): decode_hits,
    }


def test_the_repeated_report_gives_per_turn_ttft_and_each_phases_hit_rate_from_counter_deltas():
    from dataclasses import replace

    from bench.run import cache_by_phase, repeated_table

    before, after = _counters(1000, 200, 500, 100), _counters(4162, 2640, 2081, 1508)
    cache = cache_by_phase(before, after)
    assert cache["Prefill"] == {"queries": 4162 - 1000, "hits": 2640 - 200}
    by_turn = [210.0, 90.0, 95.0, 101.0]
    row = replace(_row("disaggregated", 4, 100.0, 2.0), ttft_by_turn_ms=tuple(by_turn), prefix_cache=cache)
    unmeasured = replace(_row("colocated", 4, 100.0, 2.0), prefix_cache_note="http://h:8080/metrics did not answer")
    text = repeated_table([row, unmeasured])
    assert (
        "| endpoint | conc | turn 1 TTFT p50 ms | turn 2 TTFT p50 ms | turn 3 TTFT p50 ms | turn 4 TTFT p50 ms |"
        in text
    )
    prefill = f"Prefill {(2640 - 200) / (4162 - 1000):.0%} ({2640 - 200} / {4162 - 1000})"
    decode = f"Decode {(1508 - 100) / (2081 - 500):.0%}"
    assert f"| disaggregated | 4 | {' | '.join(f'{ms:.1f}' for ms in by_turn)} | {decode}" in text
    assert prefill in text
    # A single-request result (vLLM's) is one turn: its median TTFT; the endpoint that was not read says why.
    assert "| colocated | 4 | 100.0 | - | - | - | not measured: http://h:8080/metrics did not answer |" in text


RECORDED_METRICS = Path(__file__).parent / "data" / "ray-metrics-colocated.prom"


RECORDED_PD_METRICS = Path(__file__).parent / "data" / "ray-metrics-disaggregated.prom"


def test_a_level_s_engine_work_is_read_per_phase_from_vllms_counters_and_written_with_it(tmp_path):
    from dataclasses import replace
    from types import SimpleNamespace

    from bench.calibration import write_calibration
    from bench.run import steps_by_phase
    from local.metrics import engine_counters, parse, serve_replica_deployments
    from planner.calibration import load

    # A real P/D server's exposition (Ray 2.58.0, vLLM 0.26.0): each engine labelled by its replica id
    # alone, Serve's gauge naming that replica's deployment.
    text = RECORDED_PD_METRICS.read_text()
    phase_of = {
        replica: deployment.split(":")[0]
        for deployment, replica in re.findall(r'deployment="([^"]+)",[^}]*replica="([^"]+)"', text)
    }
    wanted = {
        ("ray_vllm_iteration_tokens_total_count", ""): "steps",
        ("ray_vllm_generation_tokens_total", ""): "generated",
        ("ray_vllm_prompt_tokens_by_source_total", "local_compute"): "prompt_computed",
    }
    expected: dict[str, dict[str, float]] = {}
    for name, labels, value in re.findall(r"^(\w+)\{([^}]*)\} (\S+)$", text, re.M):
        label = dict(re.findall(r'(\w+)="([^"]*)"', labels))
        key = (name, label.get("source", ""))
        if key in wanted and "ReplicaId" in label:
            phase = expected.setdefault(phase_of[label["ReplicaId"]], dict.fromkeys(wanted.values(), 0.0))
            phase[wanted[key]] += float(value)
    assert set(expected) == {"Prefill", "Decode"}
    assert expected["Prefill"]["prompt_computed"] > 0 and expected["Decode"]["steps"] > expected["Prefill"]["steps"]

    samples = parse(text)
    after = engine_counters(samples, serve_replica_deployments(samples))
    before = {key: value / 4 for key, value in after.items()}
    assert steps_by_phase({}, after) == expected
    assert steps_by_phase(before, after) == {
        phase: {k: v * 3 / 4 for k, v in counted.items()} for phase, counted in expected.items()
    }

    row = replace(_row("disaggregated", 4, 100.0, 2.0), engine_steps=expected)
    workload = SimpleNamespace(name="tiny", input_len=64, output_len=16, range_ratio=0.0, num_prompts=6)
    write_calibration(tmp_path, model="m", workload=workload, rows=[row])
    assert load(tmp_path)["rows"][0]["engine_steps"] == expected


def test_hit_rates_of_an_endpoint_are_read_from_its_ray_metrics_or_said_to_be_missing():
    import http.server
    import socket
    import threading

    from bench.run import PREFIX_CACHE_QUERIES, metrics_counters

    # A real server's exposition: vLLM labels the engine's counters with its replica id alone;
    # Serve's own gauge names the replica's deployment.
    text = RECORDED_METRICS.read_text()
    recorded = {
        line.split("{")[0]: float(line.split()[-1]) for line in text.splitlines() if line.startswith("ray_vllm")
    }
    engine_replica = re.search(r'ReplicaId="([^"]+)"', text).group(1)
    deployment = re.search(r'deployment="([^"]+)",[^}]*replica="' + engine_replica + '"', text).group(1)

    class Metrics(http.server.BaseHTTPRequestHandler):
        def do_GET(self):  # noqa: N802 (http.server's name)
            body = text.encode() if self.path == "/metrics" else b"# nothing\n"
            self.send_response(200)
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Metrics)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{server.server_port}"
    try:
        counters, note = metrics_counters(f"{url}/metrics")
        assert counters is not None and note == ""
        snapshot = counters()
        for metric, value in recorded.items():
            assert snapshot[(deployment, metric, "")] == value
        counters, note = metrics_counters(f"{url}/other")
        assert counters is None and note == f"{url}/other exports no {PREFIX_CACHE_QUERIES}"
    finally:
        server.shutdown()
    with socket.socket() as closed:
        closed.bind(("127.0.0.1", 0))
        port = closed.getsockname()[1]
    counters, note = metrics_counters(f"http://127.0.0.1:{port}/metrics")
    assert counters is None and note.startswith(f"http://127.0.0.1:{port}/metrics did not answer")
    assert metrics_counters(None)[0] is None


@pytest.mark.serving
def test_conversations_are_reported_by_vllms_own_metrics_with_each_turns_median():
    import numpy as np

    from bench.next_turn import Turns, vllm_result
    from bench.run import row_from_result

    requests = [
        _request(turn, ttft, 1000 + 100 * turn, start_s=start, output_tokens=8)
        for start, (turn, ttft) in enumerate([(0, 0.4), (0, 0.2), (1, 0.1), (1, 0.3), (2, 0.05), (2, 0.15)])
    ]
    turns = Turns(requests)
    result = vllm_result(turns, slo_ms={"ttft": 250.0, "tpot": 100.0}, percentiles=PERCENTILES)
    ttfts = [r.ttft_s for r in requests]
    assert result["median_ttft_ms"] == pytest.approx(np.median(ttfts) * 1e3)
    assert result[f"p{PERCENTILES[-1]}_ttft_ms"] == pytest.approx(np.percentile(ttfts, PERCENTILES[-1]) * 1e3)
    assert result["request_throughput"] == pytest.approx(len(requests) / turns.duration_s)
    assert result["request_goodput"] == pytest.approx(sum(t <= 0.25 for t in ttfts) / turns.duration_s)
    row = row_from_result("colocated", 2, result)
    assert row.ttft_by_turn_ms == pytest.approx(tuple(turns.median_ttft_ms()))
    assert row.latency_ms["median_tpot_ms"] == pytest.approx(30.0)


def test_a_preset_longer_than_the_local_servers_context_is_refused_before_they_start(capsys):
    from bench.compare import LOCAL_SPEC, main
    from serve_app.spec import load_spec

    limit = load_spec(str(LOCAL_SPEC)).max_model_len
    workloads = load_workloads()
    # vLLM's random dataset: the shared prefix, then prompts and replies up to (1 + range_ratio) × their length.
    longest = {
        name: w.prefix_len
        + math.ceil(w.input_len * (1 + w.range_ratio))
        + math.ceil(w.output_len * (1 + w.range_ratio))
        for name, w in workloads.items()
        if w.turns == 1
    }
    too_long = sorted(name for name, tokens in longest.items() if tokens > limit)
    assert too_long, "every single-request preset fits the local servers: this test has nothing to refuse"
    for name in too_long:
        assert workloads[name].longest_request_tokens() == longest[name]
        with pytest.raises(SystemExit) as stopped:
            main(["--local", "--workload", name])
        assert stopped.value.code == 2
        lines = capsys.readouterr().err.strip().splitlines()
        assert len(lines) == 1, lines
        assert f"--workload {name}: its requests reach {longest[name]} tokens" in lines[0]
        assert f"max_model_len of {limit}" in lines[0] and "tiny" in lines[0]


def test_the_two_replica_servers_measure_turns_the_local_timeout_would_cut(tmp_path):
    import yaml

    from bench.next_turn import BENCH_REQUEST_TIMEOUT_S, two_replica_spec
    from local.paths import DEFAULT_SPEC
    from serve_app.spec import load_spec

    written = yaml.safe_load(two_replica_spec(None, "decode", "session_affinity", tmp_path).read_text())
    assert (written["decode"]["min_replicas"], written["decode"]["max_replicas"]) == (2, 2)
    assert written["decode"]["request_router"] == "session_affinity"
    assert load_spec(str(DEFAULT_SPEC)).request_timeout_s < written["request_timeout_s"] == BENCH_REQUEST_TIMEOUT_S
    load_spec(str(tmp_path / "decode-x2-session_affinity.yaml"))  # still a valid spec


@pytest.mark.serving  # the tiny model's tokenizer, through transformers
def test_an_agent_turns_tools_make_a_long_prompt_that_fits_the_local_context(tmp_path):
    """bench/agent_tools.py measures what a short message with long tool schemas costs decode's
    streams: its default tools must render, in the local model's template, into a prompt far above
    the local selective threshold and within the local context, with room for the reply."""
    from transformers import AutoTokenizer

    from bench.agent_tools import AGENT_MESSAGE, DEFAULT_TOOLS, tool_schemas
    from local.paths import DEFAULT_SPEC
    from local.tiny_model import build_tokenizer
    from serve_app.spec import load_spec

    spec = load_spec(str(DEFAULT_SPEC))
    build_tokenizer(tmp_path, spec.max_model_len)
    tokenizer = AutoTokenizer.from_pretrained(tmp_path)
    text = tokenizer.apply_chat_template(
        [{"role": "user", "content": AGENT_MESSAGE}], tools=tool_schemas(DEFAULT_TOOLS), tokenize=False
    )
    tokens = len(tokenizer(text)["input_ids"])
    assert 4 * spec.pd_min_prompt_tokens < tokens < spec.max_model_len - 256


@pytest.mark.serving
def test_each_concurrency_level_sends_prompts_no_other_level_sent(tmp_path):
    """vLLM's own sampler, given what make bench passes at each level: no level sends a prompt another
    level sent, which a server's prefix cache would then serve whole. (Prompts may still share a
    prefix: the local model's byte-level vocabulary gives vLLM's random prompts few distinct starts,
    which is why each level records its prefix-cache hits.)"""
    from transformers import AutoTokenizer
    from vllm.benchmarks.datasets.datasets import get_samples

    from local.paths import DEFAULT_SPEC
    from local.tiny_model import ensure_tiny_model
    from serve_app.spec import load_spec
    from tests.conftest import ROOT

    model_dir = ROOT / load_spec(str(DEFAULT_SPEC)).model.source
    ensure_tiny_model(model_dir)
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    workload = load_workloads()["local-long"]
    levels = []
    for concurrency in workload.concurrency:
        samples = get_samples(_parsed_by_vllm(workload, concurrency, tmp_path), tokenizer)
        assert len(samples) == workload.num_prompts
        levels.append({s.prompt for s in samples})
    for index, prompts in enumerate(levels):
        assert not prompts & set().union(*(other for i, other in enumerate(levels) if i != index))
