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
from planner.simulate import Workload
from tests.conftest import ROOT

pytestmark = pytest.mark.serving  # the tiny model's config.json, which local/tiny_model.py writes with torch

SHAPES = {"local-long": (1792, 32, 0.1), "local-short": (128, 32, 0.1)}


@pytest.fixture(scope="module")
def truth():
    from local.tiny_model import ensure_tiny_model
    from planner import local_check
    from planner.calibration import local_cost

    ensure_tiny_model(ROOT / ".local" / "tiny-llama")
    cost, budget = local_cost()
    efficiency = replace(cost.device.efficiency, prefill_mfu=0.021, step_overhead_s=0.009, request_overhead_s=0.035)
    cost = cost.with_efficiency(efficiency)
    return local_check.LocalPair(cost, 200_000, 8, budget, Link(4e8, None, 0.006), 32)


def recorded_runs(pair, tmp_path, repeats: int = 2) -> list[str]:
    from planner.local_check import SIMULATED_REQUESTS

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
                workload = Workload(input_len, output_len, spread, concurrency=concurrency, requests=SIMULATED_REQUESTS)
                outcome = pair.serve(mode, workload)
                rows.append(
                    {
                        "mode": mode,
                        "concurrency": concurrency,
                        **outcome.latency_ms,
                        "output_tokens_per_s": outcome.output_tokens_per_s,
                    }
                )
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
                    "num_prompts": 48,
                },
                "ttft_probe": probe,
                "ttft_probe_samples": {mode: {size: 10 for size in sizes} for mode, sizes in probe.items()},
                "rows": rows,
            }
            (folder / "calibration.json").write_text(json.dumps(data))
            paths.append(str(folder))
    return paths


def test_the_runs_costs_are_fitted_back_from_their_probe_and_itl(truth, tmp_path):
    from planner import local_check

    fitted = local_check.median_probe_fit(local_check.runs_of(recorded_runs(truth, tmp_path)))
    assert fitted.efficiency.prefill_mfu == pytest.approx(0.021, rel=0.01)
    assert fitted.efficiency.request_overhead_s == pytest.approx(0.035, rel=0.05)
    assert fitted.efficiency.step_overhead_s == pytest.approx(0.009, rel=0.05)
    assert fitted.link.network_bytes_per_s == pytest.approx(4e8, rel=0.01)
    pair = local_check.local_pair(fitted)
    assert (pair.max_num_seqs, pair.pd_min_prompt_tokens) == (8, 32)  # config/local.yaml's


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
