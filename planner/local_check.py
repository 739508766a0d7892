"""The advisor against the local servers: its prediction beside what `make bench-compare LOCAL=1` measured.

    python -m planner.local_check RESULTS [RESULTS ...] [--json]

Each ``RESULTS`` is the results folder (or its calibration.json) of one `make bench-compare LOCAL=1
WORKLOAD=…` run; give three runs of each workload (``local-long``, ``local-short``) for medians of
three. The local pair is described as a device the advisor knows (:class:`LocalPair`): the tiny
model of config/local.yaml, one engine per phase in P/D and one colocated engine, each engine's
per-token prefill and per-step decode costs from the fit of ``python -m planner.calibration
--local`` (the median TTFT probe of every run, fitted on the sizes P/D prefills remotely; the ITL
at concurrency 1), its KV cache from ``VLLM_CPU_KVCACHE_SPACE``, ``max_num_seqs`` and the token
budget from the spec. The advisor's simulation (planner/simulate.py) then serves each workload at
each measured concurrency in both modes.

For every figure (TTFT mean and p95, mean ITL, output tokens/s) the report gives the measured median
(and the runs' range), the prediction and its error; a prediction is *within* when its error is
inside ±30 %. For every workload, concurrency and figure it says whether P/D-over-colocated points
the same way measured and predicted. It prints; it asserts nothing (docs/benchmarks.md keeps the
report of a run).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from cmdline import ArgumentParser
from planner.calibration import (
    MODES,
    UNLIMITED_BYTES_PER_S,
    Fit,
    fit,
    in_file,
    load,
    local_cost,
    local_model_id,
)
from planner.errors import PlanningError
from planner.performance import Link, StepCost
from planner.simulate import EngineSpec, Outcome, Slo, Workload, simulate

FIGURES = ("mean_ttft_ms", "p95_ttft_ms", "mean_itl_ms", "output_tokens_per_s")
# A prediction inside this relative error of the measured median is within.
TOLERANCE = 0.30
# Simulated requests per level: enough that the prediction's own noise is small beside the tolerance.
SIMULATED_REQUESTS = 400
# Each direction's figure: P/D is better when the ratio P/D over colocated is below 1 (latencies) or
# above it (throughput).
HIGHER_IS_BETTER = {"output_tokens_per_s"}
NO_SLO = Slo(ttft_ms=1e9, itl_ms=1e9, percentile=50)


@dataclass(frozen=True)
class LocalPair:
    """The local servers as the advisor sees them: each phase one engine of ``cost`` (P/D: prefill and
    decode, each on a core of its own; colocated: one engine), the KV link between P/D's engines."""

    cost: StepCost
    kv_capacity_tokens: int
    max_num_seqs: int
    token_budget: int
    link: Link
    pd_min_prompt_tokens: int

    def engine(self) -> EngineSpec:
        return EngineSpec(self.cost, self.kv_capacity_tokens, self.max_num_seqs, self.token_budget)

    def serve(self, mode: str, workload: Workload) -> Outcome:
        engine = self.engine()
        if mode == "colocated":
            return simulate(workload, NO_SLO, colocated=(engine, 1))
        return simulate(
            workload,
            NO_SLO,
            prefill=(engine, 1),
            decode=(engine, 1),
            link=self.link,
            min_prompt_tokens=self.pd_min_prompt_tokens,
        )


def local_pair(fitted: Fit) -> LocalPair:
    """The pair of config/local.yaml with ``fitted``'s efficiencies and link."""
    from serve_app.spec import load_spec

    spec = load_spec(str(Path(__file__).resolve().parent.parent / "config" / "local.yaml"))
    cost, budget = local_cost()
    cost = StepCost(
        cost.model, replace(cost.device, efficiency=fitted.efficiency), cost.weight_bytes, cost.kv_bytes_per_token
    )
    cache_gib = float(spec.env_vars.get("VLLM_CPU_KVCACHE_SPACE", "4"))
    return LocalPair(
        cost=cost,
        kv_capacity_tokens=int(cache_gib * 2**30 / cost.kv_bytes_per_token),
        max_num_seqs=int(spec.decode.engine_kwargs.get("max_num_seqs", 256)),
        token_budget=budget,
        link=fitted.link,
        pd_min_prompt_tokens=spec.pd_min_prompt_tokens,
    )


@dataclass(frozen=True)
class Run:
    workload: str
    input_len: int
    output_len: int
    range_ratio: float
    data: dict[str, Any]


def runs_of(paths: list[str]) -> list[Run]:
    runs = []
    model = local_model_id()
    for path in paths:
        with in_file(path):
            data = load(path, model_id=model)
        workload = data.get("workload") or {}
        if not {"name", "input_len", "output_len", "range_ratio"} <= set(workload):
            raise PlanningError(
                f"{path}: its calibration.json names no workload spread (name, range_ratio): run `make bench-compare "
                "LOCAL=1` again"
            )
        modes = {row.get("mode") for row in data.get("rows", [])}
        if not set(MODES) <= modes:
            raise PlanningError(f"{path}: no rows of both modes: give a `make bench-compare LOCAL=1` run")
        runs.append(Run(workload["name"], workload["input_len"], workload["output_len"], workload["range_ratio"], data))
    return runs


def median_probe_fit(runs: list[Run]) -> Fit:
    """The fit of every run's TTFT probe (medians across runs) and of the shortest workload's ITL at
    concurrency 1, on the two longest probe sizes (P/D prefills them remotely)."""
    probes: dict[str, dict[str, list[float]]] = {mode: {} for mode in MODES}
    for run in runs:
        for mode in MODES:
            for size, ms in run.data["ttft_probe"].get(mode, {}).items():
                probes[mode].setdefault(size, []).append(ms)
    probe = {
        mode: {size: statistics.median(values) for size, values in sizes.items()} for mode, sizes in probes.items()
    }
    shortest = min(runs, key=lambda r: r.input_len)
    single = [
        row
        for run in runs
        if run.workload == shortest.workload
        for row in run.data["rows"]
        if row["mode"] == "colocated" and row["concurrency"] == 1
    ]
    itl = statistics.median(row["median_itl_ms"] for row in single) if single else None
    sizes = sorted(int(s) for s in set(probe["colocated"]) & set(probe["disaggregated"]))
    data = {
        "ttft_probe": probe,
        "pd_min_prompt_tokens": shortest.data.get("pd_min_prompt_tokens", 0),
        "workload": shortest.data["workload"],
        "rows": [{"mode": "colocated", "concurrency": 1, "median_itl_ms": itl}] if itl else [],
    }
    cost, budget = local_cost()
    return fit(data, cost, budget, Link(UNLIMITED_BYTES_PER_S, None), fit_on=(sizes[-2], sizes[-1]))


@dataclass(frozen=True)
class Figure:
    workload: str
    mode: str
    concurrency: int
    figure: str
    measured: list[float]
    predicted: float

    @property
    def median(self) -> float:
        return statistics.median(self.measured)

    @property
    def error(self) -> float:
        return self.predicted / self.median - 1

    @property
    def within(self) -> bool:
        return abs(self.error) <= TOLERANCE


def compare(runs: list[Run], pair: LocalPair) -> list[Figure]:
    measured: dict[tuple[str, str, int], dict[str, list[float]]] = {}
    shapes = {run.workload: run for run in runs}
    for run in runs:
        for row in run.data["rows"]:
            values = measured.setdefault((run.workload, row["mode"], row["concurrency"]), {})
            for figure in FIGURES:
                values.setdefault(figure, []).append(float(row[figure]))
    out: list[Figure] = []
    for (name, mode, concurrency), values in sorted(measured.items()):
        shape = shapes[name]
        workload = Workload(
            shape.input_len, shape.output_len, shape.range_ratio, concurrency=concurrency, requests=SIMULATED_REQUESTS
        )
        outcome = pair.serve(mode, workload)
        predicted = {**outcome.latency_ms, "output_tokens_per_s": outcome.output_tokens_per_s}
        out.extend(Figure(name, mode, concurrency, f, values[f], predicted[f]) for f in FIGURES)
    return out


def directions(figures: list[Figure]) -> list[dict[str, Any]]:
    """Per workload, concurrency and figure: P/D over colocated, measured and predicted, and whether
    both say P/D is better (or both worse)."""
    by_key = {(f.workload, f.concurrency, f.figure, f.mode): f for f in figures}
    out = []
    for (name, concurrency, figure, mode), pd in sorted(by_key.items()):
        if mode != "disaggregated" or (name, concurrency, figure, "colocated") not in by_key:
            continue
        co = by_key[(name, concurrency, figure, "colocated")]
        measured, predicted = pd.median / co.median, pd.predicted / co.predicted
        better = (lambda r: r > 1) if figure in HIGHER_IS_BETTER else (lambda r: r < 1)
        out.append(
            {
                "workload": name,
                "concurrency": concurrency,
                "figure": figure,
                "measured_ratio": round(measured, 3),
                "predicted_ratio": round(predicted, 3),
                "same_direction": better(measured) == better(predicted),
            }
        )
    return out


def render(figures: list[Figure], ways: list[dict[str, Any]], fitted: Fit, runs: int) -> str:
    e = fitted.efficiency
    lines = [
        f"The local pair, fitted on the TTFT probe's medians of {runs} run(s): prefill MFU {e.prefill_mfu:.3g} of the "
        f"nominal CPU, {e.step_overhead_s * 1e3:.2f} ms per step, {e.request_overhead_s * 1e3:.1f} ms per request, KV "
        f"link + {fitted.link.fixed_s * 1e3:.1f} ms per transfer",
        "",
        "| workload | mode | concurrency | figure | measured median (runs' range) | predicted | error |",
        "|---|---|---|---|---|---|---|",
    ]
    for f in figures:
        spread = f"{min(f.measured):.1f}–{max(f.measured):.1f}" if len(f.measured) > 1 else "one run"
        mark = "" if f.within else " ✗"
        lines.append(
            f"| {f.workload} | {f.mode} | {f.concurrency} | {f.figure} | {f.median:.1f} ({spread}) | "
            f"{f.predicted:.1f} | {f.error:+.0%}{mark} |"
        )
    within = sum(f.within for f in figures)
    lines += [
        "",
        f"{within}/{len(figures)} predictions within ±{TOLERANCE:.0%} of the measured median.",
        "",
        "| workload | concurrency | figure | P/D / colocated measured | predicted | direction |",
        "|---|---|---|---|---|---|",
    ]
    for w in ways:
        lines.append(
            f"| {w['workload']} | {w['concurrency']} | {w['figure']} | {w['measured_ratio']:.2f}× | "
            f"{w['predicted_ratio']:.2f}× | {'same' if w['same_direction'] else 'opposite ✗'} |"
        )
    right = sum(w["same_direction"] for w in ways)
    lines += ["", f"{right}/{len(ways)} P/D-over-colocated directions predicted right."]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = ArgumentParser(
        prog="python -m planner.local_check", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "results", nargs="+", help="results folders (or calibration.json) of make bench-compare LOCAL=1"
    )
    parser.add_argument("--json", action="store_true", help="print the comparison as JSON")
    args = parser.parse_args(argv)
    try:
        runs = runs_of(args.results)
        fitted = median_probe_fit(runs)
        figures = compare(runs, local_pair(fitted))
    except PlanningError as exc:
        print(exc, file=sys.stderr)
        return 2
    ways = directions(figures)
    if args.json:
        print(
            json.dumps(
                {
                    "fit": fitted.as_dict(),
                    "figures": [
                        {**f.__dict__, "median": f.median, "error": round(f.error, 4), "within": f.within}
                        for f in figures
                    ],
                    "directions": ways,
                },
                indent=2,
            )
        )
    else:
        print(render(figures, ways, fitted, len(runs)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
