"""`python -m planner.local_check`: the advisor's local pair against `make bench-compare LOCAL=1` runs.

The runs here are made by the advisor's own model with known costs (a pair it knows exactly), so the
command must fit those costs back from the runs' TTFT probe and ITL and predict every figure it
measured: what the comparison's plumbing must do before its verdict on real runs means anything.
docs/benchmarks.md reports it on real runs of the local servers."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest

from planner.calibration import single_request_ttft
from planner.performance import Link
from planner.simulate import SharedHost
from tests.conftest import ROOT

pytestmark = pytest.mark.serving  # the tiny model's config.json, which local/tiny_model.py writes with torch

SHAPES = {"local-long": (1792, 32, 0.1), "local-short": (128, 32, 0.1)}
NUM_PROMPTS = 48


@pytest.fixture(scope="module")
def truth():
    from local.tiny_model import ensure_tiny_model
    from planner import local_check
    from planner.calibration import local_cost

    ensure_tiny_model(ROOT / ".local" / "tiny-llama")
    cost, budget = local_cost()
    efficiency = replace(
        cost.device.efficiency,
        prefill_mfu=0.021,
        decode_bandwidth=0.2,  # memory-bound decode steps (at 0.021 MFU, 0.45 and above is compute-bound)
        step_overhead_s=0.009,
        request_overhead_s=0.035,
    )
    cost = cost.with_efficiency(efficiency)
    return local_check.LocalPair(cost, 200_000, 8, budget, Link(4e8, None, 0.006), 32)


@pytest.fixture(scope="module")
def truth_on_host(truth):
    return replace(truth, hosts=HOSTS)


# What the local servers share, per mode: cores left by Ray's own processes, and what the engine's
# server, the ingress, the proxy and the client each spend per streamed token.
HOSTS = {
    "colocated": SharedHost(1.6, (0.0004, 0.0003, 0.0005, 0.0002), engine_cores=1.6),
    "disaggregated": SharedHost(1.5, (0.0006, 0.0003, 0.0005, 0.0002), engine_cores=1.6),
}
SERVER = {"colocated": "ServeReplica:llm:LLMServer:tiny-llama", "disaggregated": "ServeReplica:llm:Decode:tiny-llama"}
PATH_AFTER_SERVER = ("ServeReplica:llm:KeyedOpenAiIngress", "ProxyActor", "client")
HOST_CORES = 2


def host_cpu(
    pair, mode: str, num_prompts: int, output_len: int, wall_s: float, steps: dict | None = None, context: float = 0.0
) -> dict[str, float]:
    """What bench/host_cpu.py records for one level of ``pair`` on its host: each stage's CPU for the
    level's tokens and its share of the requests' fixed cost, the engines' processes, and Ray's own."""
    host = pair.hosts[mode]
    share = pair.cost.device.efficiency.request_overhead_s / len(host.token_seconds)
    path = (SERVER[mode], *PATH_AFTER_SERVER)
    spent = {
        role: t * num_prompts * output_len + share * num_prompts
        for role, t in zip(path, host.token_seconds, strict=True)
    }
    # An engine's Worker busy half the level, its EngineCore beside it: engine_cores (1.6) between them.
    spent[f"EngineCore of {SERVER[mode]}"] = 0.3 * wall_s
    spent[f"Worker of EngineCore of {SERVER[mode]}"] = 0.5 * wall_s
    if steps:
        # Where the level recorded its engines' steps, each engine spent what its steps cost.
        for phase, counted in steps.items():
            cpu = engine_cpu(pair, phase, counted, context, wall_s)
            server = f"ServeReplica:llm:{phase}:tiny-llama"
            spent[f"EngineCore of {server}"], spent[f"Worker of EngineCore of {server}"] = 3 / 8 * cpu, 5 / 8 * cpu
    if mode == "disaggregated":
        spent["ServeReplica:llm:Prefill:tiny-llama"] = 0.1 * wall_s
        spent["raylet"] = (HOST_CORES - host.cores - 0.1) * wall_s
    else:
        spent["raylet"] = (HOST_CORES - host.cores) * wall_s
    return {**spent, "wall_s": wall_s}


# The deployments whose engines' prefix-cache counters a level records (bench/next_turn.py, per_request).
CACHE_PHASES = {"colocated": ("LLMServer",), "disaggregated": ("Prefill", "Decode")}
# An engine's CPU per step, per prompt token it computes, per context token a decoding sequence reads and
# per second it idles, beside the cost per sequence of the pair's efficiency (as CPU: on engine_cores,
# which the hosts here do not exceed).
STEP_CPU_S, PROMPT_TOKEN_CPU_S, CONTEXT_TOKEN_CPU_S, IDLE_CPU = 0.004, 2e-5, 1e-7, 0.05


def engine_steps(mode: str, input_len: int, output_len: int, concurrency: int) -> dict[str, dict[str, float]]:
    """A level's engine work per phase as vLLM counts it: each prompt one chunk (its last token sampled),
    the rest of each answer a token per step, ``concurrency`` sequences a step."""
    answer = {
        "steps": NUM_PROMPTS + NUM_PROMPTS * (output_len - 1) / concurrency,
        "generated": NUM_PROMPTS * output_len,
    }
    if mode == "colocated":
        return {"LLMServer": {**answer, "prompt_computed": NUM_PROMPTS * input_len}}
    return {
        "Prefill": {"steps": NUM_PROMPTS, "generated": NUM_PROMPTS, "prompt_computed": NUM_PROMPTS * input_len},
        "Decode": {**answer, "prompt_computed": 0.0},
    }


def engine_cpu(pair, phase: str, counted: dict[str, float], context: float, wall_s: float) -> float:
    per_sequence = pair.cost.device.efficiency.sequence_overhead_s * HOSTS["colocated"].engine_cores
    read = 0.0 if phase == "Prefill" else counted["generated"] * context
    return (
        STEP_CPU_S * counted["steps"]
        + per_sequence * counted["generated"]
        + PROMPT_TOKEN_CPU_S * counted["prompt_computed"]
        + CONTEXT_TOKEN_CPU_S * read
        + IDLE_CPU * wall_s
    )


def recorded_runs(pair, tmp_path, repeats: int = 2, hit_share: float = 0.0, steps: bool = False) -> list[str]:
    """Runs as make bench-compare LOCAL=1 records them, of ``pair`` with ``hit_share`` of every prompt in
    the prefix cache (recorded in each row's counters when above 0), with the engines' steps where
    ``steps``."""
    from planner.local_check import Run, predicted

    paths = []
    probe = {
        mode: {
            str(t): single_request_ttft(pair.cost, t, pair.token_budget, mode, pair.link, pair.pd_min_prompt_tokens)
            * 1e3
            for t in (20, 500, 1500)
        }
        for mode in ("colocated", "disaggregated")
    }
    for name, (input_len, output_len, spread) in SHAPES.items():
        rows = []
        for mode in ("disaggregated", "colocated"):
            for concurrency in (1, 4, 8):
                shape = Run(name, input_len, output_len, spread, NUM_PROMPTS, {})
                row = {"mode": mode, "concurrency": concurrency, **predicted(pair, mode, shape, concurrency, hit_share)}
                if hit_share:
                    queried = float(input_len)
                    # Decode looks up only what reaches it; its share is not the one prefill had.
                    row["prefix_cache"] = {
                        phase: {"queries": queried, "hits": queried * (hit_share if phase != "Decode" else 0.9)}
                        for phase in CACHE_PHASES[mode]
                    }
                counted = engine_steps(mode, input_len, output_len, concurrency) if steps else None
                if counted:
                    row["engine_steps"] = counted
                if pair.hosts:
                    wall = NUM_PROMPTS * output_len / row["output_tokens_per_s"]
                    row["host_cpu"] = host_cpu(
                        pair, mode, NUM_PROMPTS, output_len, wall, counted, input_len + output_len / 2
                    )
                rows.append(row)
        for repeat in range(repeats):
            folder = tmp_path / f"{name}-{repeat}"
            folder.mkdir()
            data = {
                "model": "tiny-llama",
                "pd_min_prompt_tokens": pair.pd_min_prompt_tokens,
                "workload": {
                    "name": name,
                    "input_len": input_len,
                    "output_len": output_len,
                    "range_ratio": spread,
                    "num_prompts": NUM_PROMPTS,
                },
                "ttft_probe": probe,
                "ttft_probe_samples": {mode: {size: 10 for size in sizes} for mode, sizes in probe.items()},
                "rows": rows,
                **({"host_cores": HOST_CORES} if pair.hosts else {}),
            }
            (folder / "calibration.json").write_text(json.dumps(data))
            paths.append(str(folder))
    return paths


def test_the_runs_costs_are_fitted_back_from_their_probe_and_itl(truth, tmp_path):
    from planner import local_check

    fitted = local_check.median_probe_fit(local_check.runs_of(recorded_runs(truth, tmp_path)))
    assert fitted.efficiency.prefill_mfu == pytest.approx(0.021, rel=0.01)
    # From how the ITL at concurrency 1 grows from the short prompts' context to the long ones'.
    assert fitted.efficiency.decode_bandwidth == pytest.approx(0.2, rel=0.05)
    assert fitted.efficiency.request_overhead_s == pytest.approx(0.035, rel=0.05)
    assert fitted.efficiency.step_overhead_s == pytest.approx(0.009, rel=0.05)
    assert fitted.link.network_bytes_per_s == pytest.approx(4e8, rel=0.01)
    pair = local_check.local_pair(fitted)
    assert (pair.max_num_seqs, pair.pd_min_prompt_tokens) == (8, 32)  # config/local.yaml's


def test_the_shared_host_is_read_back_from_what_each_process_spent(truth_on_host, tmp_path):
    from planner import local_check

    runs = local_check.runs_of(recorded_runs(truth_on_host, tmp_path))
    hosts = local_check.hosts_of(runs, local_check.median_probe_fit(runs))
    for mode, host in HOSTS.items():
        assert hosts[mode].cores == pytest.approx(host.cores, rel=1e-6)
        assert hosts[mode].engine_cores == pytest.approx(host.engine_cores, rel=1e-6)
        # Each stage's share of the requests' fixed cost comes off at the fitted cost (within 5 %).
        assert hosts[mode].token_seconds == pytest.approx(host.token_seconds, rel=0.05)


def test_an_engine_s_cost_per_sequence_in_a_step_is_fitted_back_from_its_cpu_and_its_steps(truth_on_host, tmp_path):
    """A step of eight sequences costs more than one of one (each is scheduled, sampled and output);
    the ITL at concurrency 1 cannot tell that cost from the step's, the engines' CPU per step can."""
    from planner import local_check

    efficiency = replace(truth_on_host.cost.device.efficiency, sequence_overhead_s=0.0015)
    pair = replace(truth_on_host, cost=truth_on_host.cost.with_efficiency(efficiency))
    runs = local_check.runs_of(recorded_runs(pair, tmp_path, steps=True))
    assert local_check.sequence_cpu_s(runs) == pytest.approx(0.0015 * HOSTS["colocated"].engine_cores, rel=1e-6)
    fitted, hosts = local_check.local_fit(runs)
    assert fitted.efficiency.sequence_overhead_s == pytest.approx(0.0015, rel=1e-6)
    # A step of one sequence still costs what the ITL at concurrency 1 says.
    one_sequence = local_check.median_probe_fit(runs).efficiency.step_overhead_s
    assert fitted.efficiency.step_overhead_s + 0.0015 == pytest.approx(one_sequence, rel=1e-6)
    with_steps = local_check.compare(runs, local_check.local_pair(fitted, hosts))
    assert all(f.within for f in with_steps)
    # Without the engines' steps the cost per sequence is not known, and the short prompts' ITL under
    # load, where a step holds eight sequences, comes out low.
    for run in runs:
        for row in run.data["rows"]:
            del row["engine_steps"]
    assert local_check.sequence_cpu_s(runs) is None
    without = local_check.compare(runs, local_check.local_pair(*local_check.local_fit(runs)))

    def itl_at_8(figures):
        return [f.error for f in figures if (f.workload, f.figure, f.concurrency) == ("local-short", "mean_itl_ms", 8)]

    assert all(error < -0.15 for error in itl_at_8(without))
    assert all(abs(error) < 0.1 for error in itl_at_8(with_steps))


def test_without_a_shared_host_the_local_servers_are_predicted_far_off(truth_on_host, tmp_path):
    """The model before the shared host: every process on a core of its own, no front end. The same
    runs then miss at concurrency 8, where the two cores are what limits."""
    from planner import local_check

    runs = local_check.runs_of(recorded_runs(truth_on_host, tmp_path, repeats=1))
    figures = local_check.compare(runs, replace(truth_on_host, hosts=None))
    missed = {(f.mode, f.concurrency) for f in figures if not f.within}
    assert ("colocated", 8) in missed and ("disaggregated", 8) in missed


def test_a_run_that_recorded_no_engine_server_is_refused_in_one_line(truth_on_host, tmp_path):
    from planner import local_check
    from planner.errors import PlanningError

    runs = local_check.runs_of(recorded_runs(truth_on_host, tmp_path, repeats=1))
    for run in runs:
        for row in run.data["rows"]:
            row.get("host_cpu", {}).pop("ProxyActor", None)
    with pytest.raises(PlanningError) as refused:
        local_check.hosts_of(runs, local_check.median_probe_fit(runs))
    assert "lacks one of the engine's server, the ingress, ProxyActor and client" in str(refused.value)
    assert "\n" not in str(refused.value)


def test_runs_whose_client_had_the_cpu_ahead_of_the_servers_are_not_fitted_with_runs_where_it_waited(
    truth, tmp_path, capsys
):
    from planner import local_check

    paths = recorded_runs(truth, tmp_path)
    ahead = tmp_path / paths[0].rsplit("/", 1)[-1] / "calibration.json"
    data = json.loads(ahead.read_text())
    ahead.write_text(json.dumps({**data, "host_priority": "the server's session at autogroup nice 10"}))
    assert local_check.main(paths) == 2
    refused = capsys.readouterr().err.strip()
    assert refused.startswith("RESULTS mix runs whose client was put ahead of the local servers for the CPU")
    assert "\n" not in refused
    assert local_check.main(paths[:1]) == 0


def test_every_measured_figure_is_set_beside_the_prediction_for_its_workload_mode_and_concurrency(truth, tmp_path):
    from planner import local_check

    runs = local_check.runs_of(recorded_runs(truth, tmp_path))
    figures = local_check.compare(runs, truth)
    assert len(figures) == 2 * 2 * 3 * len(local_check.FIGURES)
    assert all(len(f.measured) == 2 and f.error == pytest.approx(0, abs=1e-9) for f in figures)
    ways = local_check.directions(figures)
    assert len(ways) == 2 * 3 * len(local_check.FIGURES) and all(w["same_direction"] for w in ways)
    report = local_check.render(figures, ways, local_check.median_probe_fit(runs), len(runs))
    assert f"{len(figures)}/{len(figures)} predictions within ±30%" in report
    assert f"{len(ways)}/{len(ways)} P/D-over-colocated directions predicted right." in report


def test_each_level_is_predicted_with_the_prefix_cache_hits_its_counters_recorded(truth, tmp_path, capsys):
    from planner import local_check

    paths = recorded_runs(truth, tmp_path, repeats=1, hit_share=0.5)
    runs = local_check.runs_of(paths)
    assert set(local_check.hit_shares(runs).values()) == {0.5}  # prefill's share in P/D, not decode's
    figures = local_check.compare(runs, truth)
    assert all(f.error == pytest.approx(0, abs=1e-9) for f in figures)
    assert local_check.main(paths) == 0
    assert "local-long colocated 4: 50%" in capsys.readouterr().out
    # The same runs without their counters: predicted as prefills, the TTFT of long prompts too high.
    for path in paths:
        calibration = tmp_path / path.rsplit("/", 1)[-1] / "calibration.json"
        data = json.loads(calibration.read_text())
        for row in data["rows"]:
            del row["prefix_cache"]
        calibration.write_text(json.dumps(data))
    unseen = local_check.compare(local_check.runs_of(paths), truth)
    assert all(f.error > 0.05 for f in unseen if f.workload == "local-long" and f.figure == "mean_ttft_ms")


def test_a_prediction_off_by_more_than_the_tolerance_and_a_direction_turned_are_marked(truth, tmp_path):
    from planner import local_check

    runs = local_check.runs_of(recorded_runs(truth, tmp_path, repeats=1))
    slower = replace(truth, link=Link(4e6, None, 0.5))  # a link a hundred times slower: P/D's TTFT goes up
    figures = local_check.compare(runs, slower)
    ways = local_check.directions(figures)
    report = local_check.render(figures, ways, local_check.median_probe_fit(runs), len(runs))
    off = [f for f in figures if not f.within]
    assert off and all(f.mode == "disaggregated" for f in off)
    assert any(not w["same_direction"] and w["figure"] == "mean_ttft_ms" for w in ways)
    assert "✗" in report and "opposite ✗" in report


def test_a_run_of_another_model_is_refused_in_one_line(truth, tmp_path, capsys):
    from planner import local_check

    path = recorded_runs(truth, tmp_path, repeats=1)[0]
    data = json.loads((tmp_path / "local-long-0" / "calibration.json").read_text())
    data["model"] = "qwen2.5-7b-instruct"
    (tmp_path / "local-long-0" / "calibration.json").write_text(json.dumps(data))
    assert local_check.main([path]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "measured on model 'qwen2.5-7b-instruct', not 'tiny-llama'" in err[0]


def test_the_local_step_budget_is_the_one_vllm_gives_the_engines_ray_serve_starts_on_this_cpu():
    """Ray Serve LLM makes its engines' config for an OpenAI server; the budget is vLLM's default for
    that usage on this platform, read from the installed Ray and vLLM."""
    import inspect

    from ray.llm._internal.serve.engines.vllm import vllm_engine
    from vllm.engine.arg_utils import EngineArgs
    from vllm.platforms import current_platform
    from vllm.usage.usage_lib import UsageContext

    from planner.calibration import LOCAL_DEFAULT_TOKEN_BUDGET, local_cost, local_spec

    assert "usage_context=UsageContext.OPENAI_API_SERVER" in inspect.getsource(vllm_engine)
    assert current_platform.is_cpu()
    budgets, _ = EngineArgs.get_batch_defaults(world_size=1)
    assert LOCAL_DEFAULT_TOKEN_BUDGET == budgets[UsageContext.OPENAI_API_SERVER]
    assert "max_num_batched_tokens" not in local_spec().decode.engine_kwargs
    assert local_cost()[1] == LOCAL_DEFAULT_TOKEN_BUDGET


def test_an_itl_that_does_not_grow_with_the_context_fits_reads_hidden_under_compute_not_the_assumed_share(truth):
    """On the CPU the ITL at concurrency 1 can measure lower at the long prompts' context than at the short
    ones' (runs' noise above the reads' cost). The reads were hidden then: priced at the assumed share,
    a step over eight long contexts came out a third dearer than measured (docs/benchmarks.md)."""
    from planner.calibration import HIDDEN_SHARE_CEILING, decode_fit

    cost = truth.cost
    short, long = 144, 1808

    def step(share: float, context: int) -> float:
        bare = replace(cost.device.efficiency, decode_bandwidth=share, step_overhead_s=0.0)
        return cost.with_efficiency(bare).step_seconds(1, context, 0, 0.0, 0, 0)

    compute_only = step(HIDDEN_SHARE_CEILING, long)
    assert step(cost.device.efficiency.decode_bandwidth, long) > 1.5 * compute_only  # the assumed share shows reads
    fitted = decode_fit(cost, cost.device.efficiency, {short: 7.0, long: 6.9})
    share = fitted.decode_bandwidth
    assert step(share, long) == pytest.approx(compute_only, rel=1e-5)
    assert step(0.9 * share, long) > compute_only * (1 + 1e-3)  # the lowest share that hides them
    assert fitted.step_overhead_s == pytest.approx(0.007 - step(share, short), rel=1e-6)
    # An ITL that grows more than the compute explains still prices the reads by its growth.
    growing = decode_fit(
        cost, cost.device.efficiency, {short: 7.0, long: 7.0 + 1e3 * 2 * (compute_only - step(share, short))}
    )
    assert growing.decode_bandwidth < share
