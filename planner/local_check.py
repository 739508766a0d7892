"""The advisor against the local servers: its prediction beside what `make bench-compare LOCAL=1` measured.

    python -m planner.local_check RESULTS [RESULTS ...] [--json]

Each ``RESULTS`` is the results folder (or its calibration.json) of one `make bench-compare LOCAL=1
WORKLOAD=…` run; give three runs of each workload (``local-long``, ``local-short``) for medians of
three. The local pair is described as a device the advisor knows (:class:`LocalPair`): the tiny
model of config/local.yaml, one engine per phase in P/D and one colocated engine, each engine's
per-token prefill and per-step decode costs from the fit of ``python -m planner.calibration
--local`` (the median TTFT probe of every run, fitted on the sizes P/D prefills remotely; the ITL
at concurrency 1) and a step's cost per sequence in it (:func:`sequence_cpu_s`), its KV cache from
``VLLM_CPU_KVCACHE_SPACE``, ``max_num_seqs`` and the token budget from the spec, and the machine the engines share with Ray Serve's processes and the client
(:func:`hosts_of`: its cores and each front-end process's CPU per streamed token, from what each
process spent in each level, bench/host_cpu.py). The advisor's simulation (planner/simulate.py)
then serves each workload at each measured concurrency in both modes, as `vllm bench serve` ran it.

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
from dataclasses import asdict, dataclass, replace
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
from planner.simulate import EngineSpec, Outcome, SharedHost, Slo, Workload, simulate

FIGURES = ("mean_ttft_ms", "p95_ttft_ms", "mean_itl_ms", "output_tokens_per_s")
# A prediction inside this relative error of the measured median is within.
TOLERANCE = 0.30
# Each level is simulated as `vllm bench serve` ran it: its prompts, every request counted (the first
# burst of ``concurrency`` at once, the last stragglers), once per seed, each seed a draw of the
# prompts' lengths as each run was one; the prediction is the seeds' median, as the measurement is the
# runs'.
SEEDS = tuple(range(5))
# Each direction's figure: P/D is better when the ratio P/D over colocated is below 1 (latencies) or
# above it (throughput).
HIGHER_IS_BETTER = {"output_tokens_per_s"}
NO_SLO = Slo(ttft_ms=1e9, itl_ms=1e9, percentile=50)


@dataclass(frozen=True)
class LocalPair:
    """The local servers as the advisor sees them: each phase one engine of ``cost`` (P/D: prefill and
    decode; colocated: one engine), the KV link between P/D's engines, and per mode the machine they
    share with Ray Serve's processes and the benchmark's client (``hosts``; None: every process as if
    on a core of its own)."""

    cost: StepCost
    kv_capacity_tokens: int
    max_num_seqs: int
    token_budget: int
    link: Link
    pd_min_prompt_tokens: int
    hosts: dict[str, SharedHost] | None = None

    def engine(self) -> EngineSpec:
        return EngineSpec(self.cost, self.kv_capacity_tokens, self.max_num_seqs, self.token_budget)

    def serve(self, mode: str, workload: Workload) -> Outcome:
        engine = self.engine()
        host = self.hosts.get(mode) if self.hosts else None
        if mode == "colocated":
            return simulate(workload, NO_SLO, colocated=(engine, 1), host=host)
        return simulate(
            workload,
            NO_SLO,
            prefill=(engine, 1),
            decode=(engine, 1),
            link=self.link,
            min_prompt_tokens=self.pd_min_prompt_tokens,
            host=host,
        )


def local_pair(fitted: Fit, hosts: dict[str, SharedHost] | None = None) -> LocalPair:
    """The pair of config/local.yaml with ``fitted``'s efficiencies and link, on ``hosts``."""
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
        hosts=hosts,
    )


@dataclass(frozen=True)
class Run:
    workload: str
    input_len: int
    output_len: int
    range_ratio: float
    num_prompts: int
    data: dict[str, Any]


def runs_of(paths: list[str]) -> list[Run]:
    runs = []
    model = local_model_id()
    for path in paths:
        with in_file(path):
            data = load(path, model_id=model)
        workload = data.get("workload") or {}
        if not {"name", "input_len", "output_len", "range_ratio", "num_prompts"} <= set(workload):
            raise PlanningError(
                f"{path}: its calibration.json names no workload spread (name, range_ratio): run `make bench-compare "
                "LOCAL=1` again"
            )
        modes = {row.get("mode") for row in data.get("rows", [])}
        if not set(MODES) <= modes:
            raise PlanningError(f"{path}: no rows of both modes: give a `make bench-compare LOCAL=1` run")
        runs.append(
            Run(
                workload["name"],
                workload["input_len"],
                workload["output_len"],
                workload["range_ratio"],
                workload["num_prompts"],
                data,
            )
        )
    priorities = {run.data.get("host_priority") for run in runs}
    if len(priorities) > 1:
        # A client that waited for the cores counted its waits as the servers' TTFT (docs/benchmarks.md):
        # one fit over both kinds of run fits neither.
        raise PlanningError(
            "RESULTS mix runs whose client was put ahead of the local servers for the CPU (host_priority in "
            "calibration.json) with runs where it was not: give runs of one kind, or run `make bench-compare "
            "LOCAL=1` again for the others"
        )
    return runs


def median_probe_fit(runs: list[Run], sequence_overhead_s: float = 0.0) -> Fit:
    """The fit of every run's TTFT probe (medians across runs), on the two longest probe sizes (P/D
    prefills them remotely), and of each workload's median ITL at concurrency 1 (medians across its
    runs): how it grows from the short prompts' context to the long ones' is what a decode step's KV
    reads cost, which nothing else measures on this CPU."""
    probes: dict[str, dict[str, list[float]]] = {mode: {} for mode in MODES}
    for run in runs:
        for mode in MODES:
            for size, ms in run.data["ttft_probe"].get(mode, {}).items():
                probes[mode].setdefault(size, []).append(ms)
    probe = {
        mode: {size: statistics.median(values) for size, values in sizes.items()} for mode, sizes in probes.items()
    }
    shortest = min(runs, key=lambda r: r.input_len)
    rows = []
    for name in sorted({run.workload for run in runs}):
        of_workload = [run for run in runs if run.workload == name]
        single = [
            row["median_itl_ms"]
            for run in of_workload
            for row in run.data["rows"]
            if row["mode"] == "colocated" and row["concurrency"] == 1
        ]
        if single:
            context = of_workload[0].input_len + of_workload[0].output_len // 2
            rows.append(
                {
                    "mode": "colocated",
                    "concurrency": 1,
                    "median_itl_ms": statistics.median(single),
                    "context_tokens": context,
                }
            )
    sizes = sorted(int(s) for s in set(probe["colocated"]) & set(probe["disaggregated"]))
    data = {
        "ttft_probe": probe,
        "pd_min_prompt_tokens": shortest.data.get("pd_min_prompt_tokens", 0),
        "workload": shortest.data["workload"],
        "rows": rows,
    }
    cost, budget = local_cost()
    cost = cost.with_efficiency(replace(cost.device.efficiency, sequence_overhead_s=sequence_overhead_s))
    return fit(data, cost, budget, Link(UNLIMITED_BYTES_PER_S, None), fit_on=(sizes[-2], sizes[-1]))


def local_fit(runs: list[Run]) -> tuple[Fit, dict[str, SharedHost] | None]:
    """The local pair's fit and hosts. Where the runs recorded their engines' steps, each step's cost per
    sequence in it first (:func:`sequence_cpu_s`, CPU seconds, as a step's seconds on the colocated
    host: the engine's cores, or the host's where it has fewer), and the probe and ITL fits then on
    top of it, so that a step of one sequence costs what was measured."""
    fitted = median_probe_fit(runs)
    hosts = hosts_of(runs, fitted)
    per_sequence = sequence_cpu_s(runs)
    if not hosts or per_sequence is None:
        return fitted, hosts
    host = hosts["colocated"]
    fitted = median_probe_fit(runs, per_sequence / min(host.engine_cores, host.cores))
    return fitted, hosts_of(runs, fitted)


def sequence_cpu_s(runs: list[Run]) -> float | None:
    """An engine's CPU per sequence in a step (None where a run did not record its engines' work).

    Per engine and level, its processes' CPU (bench/host_cpu.py) is split by least squares, over every
    engine of every level, into a cost per step, per sequence in a step, per prompt token computed, per
    context token a decoding sequence reads, and per second (an idle engine still polls): the steps,
    the tokens generated (a sequence in a step generates one) and the prompt tokens computed are vLLM's
    counters (``engine_steps``), the context the workload's prompt and half its answer per token
    generated. A step of one sequence is what the ITL at concurrency 1 measures; how much dearer a step
    of eight is than one of one, beyond what it reads, is the cost per sequence, which nothing else
    measures."""
    points: list[tuple[float, ...]] = []
    for run in runs:
        context = run.input_len + run.output_len / 2
        for row in run.data["rows"]:
            work, spent = row.get("engine_steps"), row.get("host_cpu")
            if not work or not spent:
                return None
            for phase, counted in work.items():
                if counted.get("steps", 0) <= 0:
                    continue
                cpu = sum(s for role, s in spent.items() if _engine(role) and _deployment(role) == phase)
                read = 0.0 if phase == PREFILL_PHASE else counted["generated"] * context
                points.append(
                    (counted["steps"], counted["generated"], counted["prompt_computed"], read, spent["wall_s"], cpu)
                )
    if len(points) < 5:
        return None
    return max(_least_squares(points)[1], 0.0)


def _deployment(role: str) -> str:
    """The Serve deployment of a process role (``EngineCore of ServeReplica:llm:Decode:tiny-llama`` ->
    ``Decode``), as a phase of the engines' counters names it."""
    replica = role.split(" of ")[-1].split(":")
    return replica[2] if len(replica) > 2 else ""


def _least_squares(points: list[tuple[float, ...]]) -> list[float]:
    """x minimising Σ (y − Σ x_i·v_i)² over points (v_1, …, v_n, y): the normal equations, solved by
    Gaussian elimination."""
    n = len(points[0]) - 1
    matrix = [
        [sum(p[i] * p[j] for p in points) for j in range(n)] + [sum(p[i] * p[n] for p in points)] for i in range(n)
    ]
    for column in range(n):
        pivot = max(range(column, n), key=lambda r: abs(matrix[r][column]))
        matrix[column], matrix[pivot] = matrix[pivot], matrix[column]
        if matrix[column][column] == 0:
            raise PlanningError("the runs' engine steps do not tell a step's cost from a sequence's")
        for r in range(n):
            if r != column:
                factor = matrix[r][column] / matrix[column][column]
                matrix[r] = [a - factor * b for a, b in zip(matrix[r], matrix[column], strict=True)]
    return [matrix[i][n] / matrix[i][i] for i in range(n)]


# bench/host_cpu.py's roles on a streamed token's way out, after the replica whose engine made it:
# Serve's ingress, Serve's HTTP proxy, and the benchmark's client parsing it.
INGRESS, PROXY, CLIENT = "Ingress", "ProxyActor", "client"
# The deployment whose engine streams in P/D (Ray's P/D builder's name for it).
DECODE_DEPLOYMENT = ":Decode"
# The phases of a level's prefix-cache counters (bench/next_turn.py, per_request): Ray's P/D builder's
# deployment names; the colocated engine's is the only other.
PREFILL_PHASE, DECODE_PHASE = "Prefill", "Decode"


def token_path(roles: list[str], mode: str) -> list[str]:
    """The roles a streamed token passes, from the engine out; a role missing from a run is refused."""
    owners = sorted({role.split(" of ")[-1] for role in roles if role.startswith("EngineCore of ")})
    streaming = [o for o in owners if mode == "colocated" or DECODE_DEPLOYMENT in o]
    ingress = sorted(role for role in roles if role.startswith("ServeReplica") and INGRESS in role)
    path = [*streaming[:1], *ingress[:1], *([PROXY] if PROXY in roles else []), *([CLIENT] if CLIENT in roles else [])]
    if len(path) != 4:
        raise PlanningError(
            f"the {mode} runs' host_cpu lacks one of the engine's server, the ingress, {PROXY} and {CLIENT} "
            f"(it has {', '.join(roles)}): run `make bench-compare LOCAL=1` again"
        )
    return path


def hosts_of(runs: list[Run], fitted: Fit) -> dict[str, SharedHost] | None:
    """Per mode, the machine the runs shared (None if a run did not record what each process spent).

    Each process's CPU over a level is taken as a cost per streamed token plus a rate per second it ran
    (what it spends idle: Ray's health checks and metrics, Serve's polling), fitted by least squares over
    every level of every run, after its share of each request's fixed cost, which the model spends
    there per request. A stage of the token's way runs at its cost per token; the cores left for the
    engines and the stages are the machine's less every process's rate and the per-level CPU of the
    processes off the token's way (Ray's own, Serve's controller, P/D's prefill server). The client's
    first level of a run is left out of its fit: it also loads the benchmark's code and tokenizer."""
    if not all("host_cores" in run.data for run in runs):
        return None
    hosts = {}
    for mode in MODES:
        rows = [(run, index, row) for run in runs for index, row in enumerate(run.data["rows"]) if row["mode"] == mode]
        if not rows or not all(row.get("host_cpu") for _, _, row in rows):
            return None
        roles = sorted({role for _, _, row in rows for role in row["host_cpu"] if role != "wall_s"})
        path = token_path(roles, mode)
        share = fitted.efficiency.request_overhead_s / len(path)
        per_token, rate = {}, 0.0
        for role in path:
            points: list[tuple[float, float, float]] = [
                (
                    float(run.num_prompts * run.output_len),
                    row["host_cpu"]["wall_s"],
                    max(row["host_cpu"].get(role, 0.0) - run.num_prompts * share, 0.0),
                )
                for run, index, row in rows
                if not (role == CLIENT and index == 0)
            ]
            per_token[role], role_rate = _per_token_and_per_second(points)
            rate += role_rate
        off_path = statistics.median(
            sum(s for role, s in row["host_cpu"].items() if role not in path and role != "wall_s" and not _engine(role))
            / row["host_cpu"]["wall_s"]
            for _, _, row in rows
        )
        cores = statistics.median(run.data["host_cores"] for run in runs) - rate - off_path
        hosts[mode] = SharedHost(cores, tuple(per_token[role] for role in path), _engine_cores(rows))
    return hosts


def _engine_cores(rows: list[tuple[Run, int, dict[str, Any]]]) -> float:
    """The cores an engine uses while it steps: its Worker runs the whole step, its EngineCore part of it
    (scheduling the next), so (EngineCore + Worker) over Worker, the median over levels and engines."""
    ratios = []
    for _, _, row in rows:
        for role, worker in row["host_cpu"].items():
            if role.startswith("Worker of EngineCore of ") and worker > 0:
                core = row["host_cpu"].get(role.removeprefix("Worker of "), 0.0)
                ratios.append((worker + core) / worker)
    return max(statistics.median(ratios), 1.0) if ratios else 1.0


def _per_token_and_per_second(points: list[tuple[float, float, float]]) -> tuple[float, float]:
    """(a, b) ≥ 0 minimising Σ (cpu − a·tokens − b·seconds)² over (tokens, seconds, cpu) points."""
    stt = sum(t * t for t, _, _ in points)
    sww = sum(w * w for _, w, _ in points)
    stw = sum(t * w for t, w, _ in points)
    stc = sum(t * c for t, _, c in points)
    swc = sum(w * c for _, w, c in points)
    det = stt * sww - stw * stw
    if det > 0:
        a, b = (stc * sww - swc * stw) / det, (swc * stt - stc * stw) / det
        if a >= 0 and b >= 0:
            return a, b
    # A negative figure: the other alone, whichever fits better.
    only_tokens, only_seconds = (max(stc / stt, 0.0), 0.0), (0.0, max(swc / sww, 0.0))

    def squares(fit: tuple[float, float]) -> float:
        return sum((c - fit[0] * t - fit[1] * w) ** 2 for t, w, c in points)

    return min(only_tokens, only_seconds, key=squares)


def _engine(role: str) -> bool:
    """vLLM's engine processes (EngineCore, its Worker): the model runs them as the engines' steps."""
    return " of " in role and role.split(" of ")[0] in {"EngineCore", "Worker"}


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


def predicted(pair: LocalPair, mode: str, run: Run, concurrency: int, hit_share: float = 0.0) -> dict[str, float]:
    """One level of ``run``'s workload in ``mode`` as the advisor predicts it, ``hit_share`` of each prompt
    found in the prefix cache: every statistic `vllm bench serve` reports under its name
    (``mean_ttft_ms``, ``median_itl_ms``, …, ``output_tokens_per_s``)."""
    by_seed = []
    for seed in SEEDS:
        workload = Workload(
            run.input_len,
            run.output_len,
            run.range_ratio,
            concurrency=concurrency,
            requests=run.num_prompts,
            seed=seed,
            prefix_hit_share=hit_share,
            warmup_share=0.0,
        )
        outcome = pair.serve(mode, workload)
        by_seed.append({**outcome.latency_ms, "output_tokens_per_s": outcome.output_tokens_per_s})
    return {name: statistics.median(seed[name] for seed in by_seed) for name in by_seed[0]}


def hit_share(row: dict[str, Any]) -> float | None:
    """The share of the prompt tokens that the engine which prefilled them found in its prefix cache
    (P/D's prefill, the colocated engine), from the level's counters; None where none were recorded."""
    phases = row.get("prefix_cache") or {}
    looked_up = phases.get(PREFILL_PHASE) or next((v for k, v in phases.items() if k != DECODE_PHASE), None)
    if not looked_up or not looked_up.get("queries"):
        return None
    return min(looked_up["hits"] / looked_up["queries"], 1.0)


def hit_shares(runs: list[Run]) -> dict[tuple[str, str, int], float]:
    """Per workload, mode and concurrency, the median over the runs of :func:`hit_share` (0 where no run
    recorded one: every prompt predicted as a prefill)."""
    shares: dict[tuple[str, str, int], list[float]] = {}
    for run in runs:
        for row in run.data["rows"]:
            share = hit_share(row)
            key = (run.workload, row["mode"], row["concurrency"])
            shares.setdefault(key, [])
            if share is not None:
                shares[key].append(share)
    return {key: statistics.median(values) if values else 0.0 for key, values in shares.items()}


def compare(runs: list[Run], pair: LocalPair) -> list[Figure]:
    measured: dict[tuple[str, str, int], dict[str, list[float]]] = {}
    shapes = {run.workload: run for run in runs}
    for run in runs:
        for row in run.data["rows"]:
            values = measured.setdefault((run.workload, row["mode"], row["concurrency"]), {})
            for figure in FIGURES:
                values.setdefault(figure, []).append(float(row[figure]))
    shares = hit_shares(runs)
    out: list[Figure] = []
    for (name, mode, concurrency), values in sorted(measured.items()):
        figures = predicted(pair, mode, shapes[name], concurrency, shares[(name, mode, concurrency)])
        out.extend(Figure(name, mode, concurrency, f, values[f], figures[f]) for f in FIGURES)
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


def describe_hosts(hosts: dict[str, SharedHost] | None) -> list[str]:
    if not hosts:
        return ["No run recorded what each process spent: every process as if on a core of its own."]
    lines = []
    for mode, host in hosts.items():
        stages = ", ".join(f"{t * 1e3:.2f}" for t in host.token_seconds)
        lines.append(
            f"The {mode} host: {host.cores:.2f} cores for the engines and the front end, per streamed token "
            f"{stages} ms (the engine's server, the ingress, the HTTP proxy, the client), an engine using "
            f"{host.engine_cores:.2f} cores while it steps"
        )
    return lines


def render(
    figures: list[Figure],
    ways: list[dict[str, Any]],
    fitted: Fit,
    runs: int,
    hosts: dict[str, SharedHost] | None = None,
    shares: dict[tuple[str, str, int], float] | None = None,
) -> str:
    e = fitted.efficiency
    lines = [
        f"The local pair, fitted on the TTFT probe's medians of {runs} run(s): prefill MFU {e.prefill_mfu:.3g} and "
        f"decode bandwidth {e.decode_bandwidth:.3g} of the nominal CPU, {e.step_overhead_s * 1e3:.2f} ms per step"
        + (f" and {e.sequence_overhead_s * 1e3:.2f} ms per sequence in it" if e.sequence_overhead_s else "")
        + f", {e.request_overhead_s * 1e3:.1f} ms per request, KV link + {fitted.link.fixed_s * 1e3:.1f} ms per transfer",
        "",
        *(f"{line}  " for line in describe_hosts(hosts)),
        "",
    ]
    if shares and any(shares.values()):
        lines += [
            "Each level is predicted with the prompt tokens its runs found in the prefix cache (median share): "
            + ", ".join(f"{w} {m} {c}: {share:.0%}" for (w, m, c), share in sorted(shares.items())),
            "",
        ]
    lines += [
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
        fitted, hosts = local_fit(runs)
        figures = compare(runs, local_pair(fitted, hosts))
        shares = hit_shares(runs)
    except PlanningError as exc:
        print(exc, file=sys.stderr)
        return 2
    ways = directions(figures)
    if args.json:
        print(
            json.dumps(
                {
                    "fit": fitted.as_dict(),
                    "hosts": {mode: asdict(host) for mode, host in (hosts or {}).items()},
                    "prefix_hit_shares": [
                        {"workload": w, "mode": m, "concurrency": c, "share": round(share, 4)}
                        for (w, m, c), share in sorted(shares.items())
                    ],
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
        print(render(figures, ways, fitted, len(runs), hosts, shares))
    return 0


if __name__ == "__main__":
    sys.exit(main())
