"""Published vLLM measurements of an 8B-class model per GPU family, and the efficiencies fitted to them.

    python -m planner.measurements          # per family: the fitted figures, the sources, the held-out error
    python -m planner.measurements --rows   # and every measurement: measured, predicted, which side of the fit

Each measurement is what a source published (URL, GPU, model, dtype, engine version, batch or
concurrency, lengths, the statistic), predicted with the advisor's own per-step model
(planner/performance.py ``StepCost.step_seconds``), so the figures fitted here are the ones the advisor
predicts with. Per family the fit is least squares on the log of predicted over measured, over the
family's figures (prefill MFU, share of memory bandwidth, per-step cost, the front end's per-token
cost) in log space, with a weak pull towards the assumed figure (planner/performance.py
``ASSUMED_EFFICIENCY``; none for the per-token cost, whose assumption is only "negligible") so that a
figure no measurement moves stays the assumed one and is reported as assumed. The per-token cost is
the structure `make plan-local` checked on the local servers (planner/simulate.py): a front end that
passes one token at a time paces every stream at high concurrency. Measurements flagged
``held_out`` are left out of the fit and predicted with its result: their error is what the fit is
worth on a run it has not seen. A family with no measurement here keeps its assumed figures.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from dataclasses import asdict, dataclass, replace
from functools import cache
from typing import Any

from cmdline import ArgumentParser
from config.catalog import GPUS, GpuFacts
from planner.models import KNOWN_MODELS, ModelArchitecture
from planner.performance import ASSUMED_EFFICIENCY, GPU_FAMILY, Device, Efficiency, StepCost

GIB = 2**30
LLAMA_8B = KNOWN_MODELS["meta-llama/llama-3.1-8b-instruct"]

# GPUs measured that the catalog does not sell, from NVIDIA's datasheets (dense BF16 tensor TFLOPS,
# memory bandwidth): A100 SXM 80GB 312 TFLOPS, 2,039 GB/s; H200 SXM 989 TFLOPS, 4,800 GB/s, 141 GB.
A100_80GB = GpuFacts("A100-80GB", 80.0, 312.0, 2039.0, None)
H200 = GpuFacts("H200", 141.0, 989.0, 4800.0, None)
FAMILY_OF_MEASURED_GPU = {**GPU_FAMILY, "A100-80GB": "Ampere", "H200": "Hopper"}

# vLLM's defaults where a source names none: 90 % of GPU memory for weights and KV cache, 256
# sequences; the runtime's own share as the planner counts it (planner.runtime_overhead_gib).
GPU_MEMORY_UTILIZATION = 0.9
MAX_NUM_SEQS = 256
RUNTIME_OVERHEAD_GIB = 1.5

# How far the fit may pull a figure from the assumed one before that costs as much as a measurement
# off by the same factor: a tenth, so that one measurement outweighs the assumption by far, and a
# figure nothing measures stays where it was.
PRIOR_WEIGHT = 0.1
# No share above the datasheet. Hopper's decode fit reaches that bound: the step model streams the
# whole 16 GB of Llama-3.1-8B each step, embedding table included (1 GB of it, which vLLM only looks
# up), so the fitted share carries that 7 % besides what the HBM reaches.
BOUNDS = {
    "prefill_mfu": (0.05, 1.0),
    "decode_bandwidth": (0.05, 1.0),
    "step_overhead_s": (1e-4, 0.05),
    "token_overhead_s": (1e-6, 0.01),
}
# A figure whose fitted measurements move by less than this (in log of the prediction, per log of
# the figure, summed in squares) is not measured by them: reported as assumed.
MEASURED_SENSITIVITY = 1e-3


FIT, HELD_OUT, REFERENCE = "fit", "held out", "reference"
# Why a saturated run is a reference and not fitted: at hundreds of sequences a step of these engines
# also pays a host cost per sequence (scheduling, sampling, detokenizing), large before vLLM's V1
# engine, that the step model has no term for; fitted, it would be read as a lower MFU or bandwidth
# and slow down every prediction, the single request's included.
SATURATED = (
    "a saturated run: at hundreds of sequences per step the engine's host cost per sequence, which the "
    "step model has no term for, weighs in; shown, not fitted"
)


@dataclass(frozen=True)
class Measurement:
    """One published figure. ``kind`` says what is predicted and in what unit:

    - ``tpot``: mean time per output token (ms) of ``concurrency`` closed-loop clients, each prompt
      ``prompt_tokens`` long and ``output_tokens`` out;
    - ``latency``: end-to-end ms of one batch of ``concurrency`` prompts sent together (vLLM's
      benchmark_latency), the prefill then every decode step;
    - ``throughput``: requests per second of ``concurrency`` requests sent at once (vLLM's
      benchmark_throughput, or a serving benchmark at an infinite rate).
    """

    key: str
    source: str
    gpu: GpuFacts
    tp: int
    model: ModelArchitecture
    dtype: str
    engine: str
    kind: str
    concurrency: int
    prompt_tokens: float
    output_tokens: float
    statistic: str
    value: float
    # FIT: fitted; HELD_OUT: predicted with the fit's result, never fitted; REFERENCE: shown beside the
    # prediction, neither fitted nor held out, for the reason in ``assumptions``.
    role: str = "fit"
    token_budget: int = 8192
    assumptions: str = ""

    @property
    def family(self) -> str:
        return FAMILY_OF_MEASURED_GPU[self.gpu.model]

    @property
    def held_out(self) -> bool:
        return self.role == HELD_OUT


def _catalog(name: str) -> GpuFacts:
    return GPUS[name]


VLLM_CI = "https://buildkite.com/vllm/performance-benchmark/builds/"
CI_LATENCY = (
    "vLLM's performance benchmark, latency test latency_llama8B_tp1: 8 prompts of 32 tokens together, "
    "128 tokens out (vLLM's benchmark_latency), the mean over its iterations"
)


def _h100_sweep(concurrency: int, tpot_ms: float, *, assumptions: str, role: str = FIT) -> Measurement:
    """One row of the H100 concurrency sweep (vLLM 0.21.0, Llama-3.1-8B, ShareGPT): its median TPOT."""
    return Measurement(
        key=f"h100-tpot-c{concurrency}",
        source="https://yobitelcomm.github.io/bench/recipes/concurrency-sweep/",
        gpu=_catalog("H100"),
        tp=1,
        model=LLAMA_8B,
        dtype="fp16",
        engine="vLLM 0.21.0",
        kind="tpot",
        concurrency=concurrency,
        prompt_tokens=215,
        output_tokens=198,
        statistic=f"median TPOT (tpot_p50_ms), {tpot_ms:g} ms",
        value=tpot_ms,
        role=role,
        assumptions=assumptions,
    )


MEASUREMENTS: list[Measurement] = [
    # Hopper ----------------------------------------------------------------------------------------
    _h100_sweep(
        1,
        6.48,
        assumptions="ShareGPT-v3 prompts whose lengths the page does not give: taken as vLLM's ShareGPT means "
        "(215 in, 198 out); at one sequence the KV read is 0.3 % of the weights, so the lengths barely matter",
    ),
    _h100_sweep(4, 6.59, role=HELD_OUT, assumptions="as at concurrency 1"),
    _h100_sweep(
        16,
        10.9,
        assumptions="as at concurrency 1; the TPOT grows far faster than a batch of 16 short sequences costs "
        "on an H100: 16 streams through one API server, whose per-token cost (and the benchmark client's, "
        "on the same host) paces every stream, 16 × that cost per token",
    ),
    _h100_sweep(
        64,
        46.9,
        role=HELD_OUT,
        assumptions="as at concurrency 16: the per-token cost fitted there, four times the streams",
    ),
    Measurement(
        key="h100-latency-b8",
        source=VLLM_CI + "9555",
        gpu=_catalog("H100"),
        tp=1,
        model=LLAMA_8B,
        dtype="bf16",
        engine="vLLM main at that build",
        kind="latency",
        concurrency=8,
        prompt_tokens=32,
        output_tokens=128,
        statistic="mean end-to-end latency, 997.542 ms",
        value=997.542,
        assumptions=CI_LATENCY + "; one H100 of an 8×H100 machine",
    ),
    Measurement(
        key="h200-latency-b8",
        source=VLLM_CI + "9513",
        gpu=H200,
        tp=1,
        model=LLAMA_8B,
        dtype="bf16",
        engine="vLLM main at that build",
        kind="latency",
        concurrency=8,
        prompt_tokens=32,
        output_tokens=128,
        statistic="mean end-to-end latency, 834.059 ms",
        value=834.059,
        role=HELD_OUT,
        assumptions=CI_LATENCY + "; an H200: Hopper's tensor cores with 4.8 TB/s",
    ),
    Measurement(
        key="h100-throughput-1000in",
        source="https://github.com/vllm-project/vllm/pull/4600",
        gpu=_catalog("H100"),
        tp=1,
        model=LLAMA_8B,
        dtype="bf16",
        engine="vLLM 0.4.1",
        kind="throughput",
        concurrency=1000,
        prompt_tokens=1000,
        output_tokens=100,
        statistic="request throughput of benchmark_throughput, 20.72 requests/s",
        value=20.72,
        role=REFERENCE,
        assumptions=SATURATED + "; Meta-Llama-3-8B-Instruct (Llama 3.1 8B's shapes); benchmark_throughput's default "
        "1,000 prompts; vLLM 0.4's default scheduler: no chunked prefill, prompts in steps of their own of "
        "up to 8,192 tokens (the model's length)",
    ),
    Measurement(
        key="h100-throughput-256in",
        source="https://github.com/vllm-project/vllm/pull/7117",
        gpu=_catalog("H100"),
        tp=1,
        model=LLAMA_8B,
        dtype="bf16",
        engine="vLLM main, 2024-08",
        kind="throughput",
        concurrency=1000,
        prompt_tokens=256,
        output_tokens=256,
        statistic="request throughput of benchmark_throughput, median of 3 trials on main, 24.29 requests/s",
        value=24.29,
        role=REFERENCE,
        assumptions=SATURATED + "; Meta-Llama-3-8B (Llama 3.1 8B's shapes); 1,000 prompts (the default); prompts in "
        "steps of up to 8,192 tokens",
    ),
    # Ampere ----------------------------------------------------------------------------------------
    Measurement(
        key="a100-40gb-tpot-c1",
        source="https://johnmusgrave.com/p/vllm-throughput-latency-sweep-on",
        gpu=_catalog("A100-40GB"),
        tp=1,
        model=LLAMA_8B,
        dtype="bf16",
        engine="vLLM 0.23.0",
        kind="tpot",
        concurrency=1,
        prompt_tokens=1024,
        output_tokens=128,
        statistic="decode at one request at a time, about 75 tokens/s (13.3 ms a token)",
        value=1000 / 75,
        role=HELD_OUT,
        assumptions="the post's rounded decode rate, read as one over the time per output token",
    ),
    Measurement(
        key="a100-80gb-latency-b8",
        source=VLLM_CI + "9523",
        gpu=A100_80GB,
        tp=1,
        model=LLAMA_8B,
        dtype="bf16",
        engine="vLLM main at that build",
        kind="latency",
        concurrency=8,
        prompt_tokens=32,
        output_tokens=128,
        statistic="mean end-to-end latency, 1579.27 ms",
        value=1579.27,
        assumptions=CI_LATENCY,
    ),
    Measurement(
        key="a10g-tp2-throughput-sharegpt",
        source="https://github.com/arc53/llm-price-compass/issues/6",
        gpu=_catalog("A10G"),
        tp=2,
        model=LLAMA_8B,
        dtype="bf16",
        engine="vLLM (version not given)",
        kind="throughput",
        concurrency=1000,
        prompt_tokens=215.196,
        output_tokens=43.140,
        statistic="1,000 ShareGPT requests at an infinite rate in 97.65 s (10.24 requests/s)",
        value=10.24,
        role=REFERENCE,
        token_budget=2048,
        assumptions=SATURATED + ", and TP 2 over PCIe adds an all-reduce per layer the step model does not "
        "count; two A10G of a g5.12xlarge at TP 2; a fine-tune of Meta-Llama-3-8B (the same shapes); "
        "the run's mean lengths (215,196 and 43,140 tokens over 1,000 requests); a 2,048-token step budget",
    ),
    # Ada -------------------------------------------------------------------------------------------
    Measurement(
        key="l4-throughput-sharegpt",
        source="https://github.com/arc53/llm-price-compass/blob/main/gpu-benchmarks.csv",
        gpu=_catalog("L4"),
        tp=1,
        model=LLAMA_8B,
        dtype="bf16",
        engine="vLLM (version not given)",
        kind="throughput",
        concurrency=1000,
        prompt_tokens=215.196,
        output_tokens=197.739,
        statistic="1,000 ShareGPT requests at an infinite rate in 385.30 s (2.595 requests/s)",
        value=2.5953591536015312,
        role=REFERENCE,
        token_budget=2048,
        assumptions=SATURATED
        + "; Meta-Llama-3.1-8B-Instruct on one L4 (Scaleway); the dtype is not given (BF16 taken, the "
        "model's); the run's mean lengths; a 2,048-token step budget",
    ),
]

# What the data leave unmeasured, per GPU of the catalog: it takes its family's figures.
UNMEASURED = {
    "L4": "its one published run here is a saturated reference, not fitted: the Ada figures stay assumed",
    "L40S": "no published vLLM run of an 8B model on an L40S with its lengths found: the Ada figures stay assumed",
    "A10G": "its one published run here (TP 2) is a saturated reference, not fitted: the GA102 figures stay "
    "assumed (the Ampere ones are fitted on the A100, whose memory is HBM2e, not the A10G's GDDR6)",
}
# Nothing here measures a prompt's prefill on its own (a TTFT at known lengths): every family's
# prefill MFU stays assumed, and `make bench-compare`'s TTFT probe is what measures it.


def device_of(m: Measurement, efficiency: Efficiency) -> Device:
    return Device(
        f"{m.gpu.model} ×{m.tp}",
        peak_flops=m.gpu.peak_bf16_tflops * 1e12,
        memory_bytes_per_s=m.gpu.memory_bandwidth_gbps * 1e9,
        tp=m.tp,
        efficiency=efficiency,
    )


def kv_capacity_tokens(m: Measurement) -> float:
    """The KV cache vLLM's default memory share leaves after the weights, as the planner counts it."""
    budget = m.tp * (GPU_MEMORY_UTILIZATION * m.gpu.memory_gib - RUNTIME_OVERHEAD_GIB) * GIB
    return max(budget - m.model.num_parameters * 2, 0) / m.model.kv_bytes_per_token(2)


def _prefill_seconds(cost: StepCost, prompts: float, prompt_tokens: float, budget: int) -> float:
    """``prompts`` prompts prefilled together in steps of up to ``budget`` tokens, whole prompts per step."""
    per_step = max(1.0, math.floor(budget / prompt_tokens))
    steps = math.ceil(prompts / per_step)
    seconds = 0.0
    left = prompts
    for _ in range(steps):
        n = min(per_step, left)
        tokens = n * prompt_tokens
        seconds += cost.step_seconds(0, 0, tokens, tokens * prompt_tokens / 2, 0, n)
        left -= n
    return seconds


def predict(m: Measurement, efficiency: Efficiency) -> float:
    """The measurement's figure as the advisor's step model gives it with these efficiencies."""
    cost = StepCost.of(m.model, device_of(m, efficiency))
    p, o, c = m.prompt_tokens, m.output_tokens, m.concurrency
    if m.kind == "tpot":
        # c clients in a closed loop: every step a token for each of the c sequences at their mean
        # context, and on average the prompt chunks of the others' next requests, one prompt per
        # client per output length. The front end passes one token at a time: each stream's next
        # token waits for the other c - 1 streams' (planner/simulate.py), so a stream gets a token
        # no faster than every c tokens of the front end.
        chunk = (c - 1) * p / o
        step = cost.step_seconds(c, c * (p + o / 2), chunk, chunk * p / 2, 0, chunk / p)
        return max(step, c * efficiency.token_overhead_s) * 1e3
    if m.kind == "latency":
        seconds = _prefill_seconds(cost, c, p, m.token_budget)
        for generated in range(1, int(o)):
            seconds += cost.step_seconds(c, c * (p + generated), 0, 0.0, 0, 0)
        return seconds * 1e3
    if m.kind == "throughput":
        # All at once: waves of as many sequences as the slots and the KV cache hold, each its
        # prompts' prefill then its decode steps (a wave's tail and the next's head do not overlap).
        batch = min(MAX_NUM_SEQS, c, max(1.0, math.floor(kv_capacity_tokens(m) / (p + o))))
        wave = _prefill_seconds(cost, batch, p, m.token_budget)
        wave += (o - 1) * cost.step_seconds(batch, batch * (p + o / 2), 0, 0.0, 0, 0)
        return c / (c / batch * wave)
    raise ValueError(f"unknown measurement kind {m.kind!r}")


# The fit --------------------------------------------------------------------------------------------

FIGURES = ("prefill_mfu", "decode_bandwidth", "step_overhead_s", "token_overhead_s")
# The figures pulled towards an assumption. The front end's per-token cost is not: its assumed figure
# is "too small to matter" (planner/performance.py ASSUMED_TOKEN_OVERHEAD_S), not an estimate a
# measurement should be weighed against, so where a run measures it the run alone decides it.
PULLED = ("prefill_mfu", "decode_bandwidth", "step_overhead_s")


def _with(efficiency: Efficiency, logs: dict[str, float]) -> Efficiency:
    figures: dict[str, Any] = {name: math.exp(value) for name, value in logs.items()}
    return replace(efficiency, **figures)


def _residuals(measurements: list[Measurement], efficiency: Efficiency) -> list[float]:
    return [math.log(predict(m, efficiency) / m.value) for m in measurements]


def objective(measurements: list[Measurement], efficiency: Efficiency, prior: Efficiency) -> float:
    data = sum(r * r for r in _residuals(measurements, efficiency))
    pull = sum((PRIOR_WEIGHT * math.log(getattr(efficiency, f) / getattr(prior, f))) ** 2 for f in PULLED)
    return data + pull


def _golden(function, low: float, high: float, steps: int = 40) -> float:
    """The x in [low, high] minimising ``function`` (golden-section search)."""
    ratio = (math.sqrt(5) - 1) / 2
    a, b = low, high
    c, d = b - ratio * (b - a), a + ratio * (b - a)
    fc, fd = function(c), function(d)
    for _ in range(steps):
        if fc < fd:
            b, d, fd = d, c, fc
            c = b - ratio * (b - a)
            fc = function(c)
        else:
            a, c, fc = c, d, fd
            d = a + ratio * (b - a)
            fd = function(d)
    return (a + b) / 2


def least_squares(measurements: list[Measurement], prior: Efficiency) -> Efficiency:
    """The family's figures minimising :func:`objective`: coordinate descent in log space, each
    figure by golden-section search within its bounds, until a sweep moves none by more than 0.1 %."""
    logs = {f: math.log(getattr(prior, f)) for f in FIGURES}
    for _ in range(60):
        moved = 0.0
        for name in FIGURES:
            low, high = (math.log(b) for b in BOUNDS[name])

            def cost(x: float, name: str = name) -> float:
                return objective(measurements, _with(prior, {**logs, name: x}), prior)

            best = _golden(cost, low, high)
            moved = max(moved, abs(best - logs[name]))
            logs[name] = best
        if moved < 1e-3:
            break
    return _with(prior, logs)


def _inverse_diagonal(matrix: list[list[float]]) -> list[float]:
    """The diagonal of a small symmetric positive-definite matrix's inverse (Gauss-Jordan)."""
    n = len(matrix)
    rows = [[*row, *(1.0 if i == j else 0.0 for j in range(n))] for i, row in enumerate(matrix)]
    for col in range(n):
        pivot = max(range(col, n), key=lambda r: abs(rows[r][col]))
        rows[col], rows[pivot] = rows[pivot], rows[col]
        head = rows[col][col]
        rows[col] = [v / head for v in rows[col]]
        for r in range(n):
            if r != col:
                factor = rows[r][col]
                rows[r] = [v - factor * w for v, w in zip(rows[r], rows[col], strict=True)]
    return [rows[i][n + i] for i in range(n)]


def determined(measurements: list[Measurement], efficiency: Efficiency) -> dict[str, float]:
    """Per figure, its uncertainty after the fit over its uncertainty before (variances, in log space):
    1 where no measurement depends on it, near 0 where the measurements pin it down alone, between
    where they pin down only a combination with another figure (a decode step's memory time and its
    fixed cost, say, from one step size)."""
    step = 1e-4
    base = _residuals(measurements, efficiency)
    columns = []
    for figure in FIGURES:
        moved = replace(efficiency, **{figure: getattr(efficiency, figure) * math.exp(step)})
        columns.append([(r - b) / step for r, b in zip(_residuals(measurements, moved), base, strict=True)])
    prior = PRIOR_WEIGHT**2
    information = [
        [sum(a * b for a, b in zip(ci, cj, strict=True)) + (prior if i == j else 0.0) for j, cj in enumerate(columns)]
        for i, ci in enumerate(columns)
    ]
    return {f: v * prior for f, v in zip(FIGURES, _inverse_diagonal(information), strict=True)}


# What a held-out measurement may miss by, predicted with its family's fitted figures: 20 %. The
# fitted runs themselves are matched by one pair of bandwidth share and per-step cost only to about
# 10 % (they span vLLM from 2024's main to 0.21-0.23, whose per-step costs differ by more than a
# millisecond, a sixth of an H100's decode step), and a held-out run is another version or another
# GPU of the family: twice the fitted runs' own spread is what a family-wide figure can promise. The
# assumed figures missed the same held-out runs by 32 to 68 %.
HELD_OUT_BOUND = 0.20

# A figure whose uncertainty the measurements leave at this share or more is not measured by them:
# it stays exactly the assumed figure. Below a tenth it is measured on its own; between, it moved
# with another figure, by as much as the two together were measured.
ASSUMED_SHARE = 0.9
MEASURED_SHARE = 0.1


@dataclass(frozen=True)
class FamilyFit:
    family: str
    efficiency: Efficiency
    shares: dict[str, float]  # figure -> uncertainty left after the fit (see :func:`determined`)
    fitted: tuple[Measurement, ...]
    held_out: tuple[Measurement, ...]
    reference: tuple[Measurement, ...]

    def status(self, figure: str) -> str:
        share = self.shares.get(figure, 1.0)
        if share >= ASSUMED_SHARE:
            return "assumed"
        return "measured" if share <= MEASURED_SHARE else "shared"

    def errors(self, which: tuple[Measurement, ...]) -> dict[str, float]:
        """Each measurement's relative error, predicted over measured less one, with the fitted figures."""
        return {m.key: predict(m, self.efficiency) / m.value - 1 for m in which}

    @property
    def held_out_error(self) -> float | None:
        """The largest held-out error, in absolute value; None where nothing is held out."""
        errors = self.errors(self.held_out)
        return max(abs(e) for e in errors.values()) if errors else None

    @property
    def sources(self) -> tuple[str, ...]:
        return tuple(dict.fromkeys(m.source for m in (*self.fitted, *self.held_out, *self.reference)))


def fit_family(family: str, measurements: list[Measurement] | None = None) -> FamilyFit:
    rows = [m for m in (MEASUREMENTS if measurements is None else measurements) if m.family == family]
    fitted = tuple(m for m in rows if m.role == FIT)
    held_out = tuple(m for m in rows if m.role == HELD_OUT)
    reference = tuple(m for m in rows if m.role == REFERENCE)
    prior = ASSUMED_EFFICIENCY[family]
    if not fitted:
        return FamilyFit(family, prior, {}, fitted, held_out, reference)
    result = least_squares(list(fitted), prior)
    shares = determined(list(fitted), result)
    unmeasured = [f for f in FIGURES if shares[f] >= ASSUMED_SHARE]
    # What no measurement determines is the assumption, exactly, not where the pull left it.
    result = replace(result, **{f: getattr(prior, f) for f in unmeasured})
    source = (
        f"fitted to {len(fitted)} published vLLM measurement(s), {len(held_out)} more held out "
        "(planner/measurements.py)"
        + (
            f"; assumed, as nothing there measures it: {', '.join(f.replace('_', ' ') for f in unmeasured)}"
            if unmeasured
            else ""
        )
    )
    return FamilyFit(family, replace(result, source=source), shares, fitted, held_out, reference)


@cache
def fits() -> dict[str, FamilyFit]:
    """Every GPU family of the catalog, fitted where it has measurements."""
    return {family: fit_family(family) for family in dict.fromkeys(GPU_FAMILY.values())}


def family_efficiencies() -> dict[str, Efficiency]:
    """The efficiencies the advisor uses: fitted per family; the CPU's and any family without a
    fitted measurement stay assumed."""
    return {**ASSUMED_EFFICIENCY, **{family: f.efficiency for family, f in fits().items()}}


# The report -----------------------------------------------------------------------------------------


def render(rows: bool = False) -> str:
    lines = [
        "| family | prefill MFU | decode bandwidth | per-step cost | front end per token | measurements (fitted + held out + reference) | sources | held-out error |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for family, f in fits().items():

        def figure(name: str, text: str, f: FamilyFit = f) -> str:
            at_bound = f.status(name) != "assumed" and getattr(f.efficiency, name) >= BOUNDS[name][1] * 0.999
            return f"{text} ({f.status(name)}{', at its bound' if at_bound else ''})"

        e = f.efficiency
        held = f.held_out_error
        lines.append(
            f"| {family} ({', '.join(g for g, fam in GPU_FAMILY.items() if fam == family)}) "
            f"| {figure('prefill_mfu', f'{e.prefill_mfu:.2f}')} "
            f"| {figure('decode_bandwidth', f'{e.decode_bandwidth:.2f}')} "
            f"| {figure('step_overhead_s', f'{e.step_overhead_s * 1e3:.1f} ms')} "
            f"| {figure('token_overhead_s', f'{e.token_overhead_s * 1e3:.3g} ms')} "
            f"| {len(f.fitted)} + {len(f.held_out)} + {len(f.reference)} | {len(f.sources)} "
            f"| {'none held out' if held is None else f'{held:.0%}'} |"
        )
    lines.append("")
    lines += [f"{gpu}: {why}." for gpu, why in UNMEASURED.items()]
    lines.append(
        "Prefill MFU: no published TTFT at known lengths was found for any family, so it stays assumed; "
        "`make bench-compare` (its TTFT probe) measures it."
    )
    if rows:
        lines += [
            "",
            "| measurement | GPU | engine | statistic | measured | predicted (assumed) | predicted (fitted) | side |",
            "|---|---|---|---|---|---|---|---|",
        ]
        for m in MEASUREMENTS:
            f = fits()[m.family]
            assumed = predict(m, ASSUMED_EFFICIENCY[m.family])
            fitted = predict(m, f.efficiency)
            lines.append(
                f"| {m.key} | {m.gpu.model} ×{m.tp} | {m.engine} | {m.statistic} | {m.value:.4g} "
                f"| {assumed:.4g} ({assumed / m.value - 1:+.0%}) | {fitted:.4g} ({fitted / m.value - 1:+.0%}) "
                f"| {m.role} |"
            )
    return "\n".join(lines) + "\n"


def as_dict() -> dict[str, object]:
    return {
        family: {
            "efficiency": asdict(f.efficiency),
            "status": {figure: f.status(figure) for figure in FIGURES},
            "fitted": f.errors(f.fitted),
            "held_out": f.errors(f.held_out),
            "reference": f.errors(f.reference),
            "held_out_error": f.held_out_error,
            "sources": list(f.sources),
        }
        for family, f in fits().items()
    }


def main(argv: list[str] | None = None) -> int:
    parser = ArgumentParser(
        prog="python -m planner.measurements",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--rows", action="store_true", help="also every measurement, measured against predicted")
    parser.add_argument("--json", action="store_true", help="the fit as JSON instead of the table")
    args = parser.parse_args(argv)
    print(json.dumps(as_dict(), indent=2) if args.json else render(rows=args.rows), end="")
    return 0


if __name__ == "__main__":
    sys.exit(main())
