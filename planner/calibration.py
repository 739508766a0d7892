"""Fit the advisor's efficiencies and fixed costs to what a benchmark measured.

    python -m planner.calibration RESULTS [--fit-on 20,500] [--local] [--json]
    make plan CALIBRATION=RESULTS        # the same fit, then the advisor with it

``RESULTS`` is a ``calibration.json`` that `make bench-compare` (and `make bench`) write, or the
results folder holding it. The fit uses the TTFT probe (sequential requests at three prompt sizes,
no queue, so each is one prefill and the fixed costs around it) of both modes, and the workload's
ITL at concurrency 1 where there is one:

1. the per-step cost from the ITL (one decode step of one sequence, minus what it reads and computes);
2. prefill MFU from how colocated TTFT grows between the two fitted prompt sizes;
3. the per-request cost from what colocated TTFT has beyond that prefill;
4. the KV link from how the P/D-minus-colocated gap grows between the sizes (its bandwidth) and what
   is left at the smaller one (its fixed cost).

Every other size is held out: its predicted TTFT and gap are compared with what was measured, before
and after the fit. ``--local`` fits the tiny model of `make local` on this CPU (nominal peak and
bandwidth: only the fitted numbers mean anything there).
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from cmdline import ArgumentParser
from planner.errors import PlanningError
from planner.performance import ASSUMED_EFFICIENCY, Device, Efficiency, Link, StepCost

FILE_NAME = "calibration.json"
MODES = ("colocated", "disaggregated")
# The fewest requests a fitted probe size's median may be of (bench/ttft.py measures 10 per size).
MIN_PROBE_SAMPLES = 5
# Where a fitted bandwidth comes out at or below zero (a gap that does not grow), the wire is free.
UNLIMITED_BYTES_PER_S = 1e15
# Rounds of the decode and prefill fits, each on the other's result: the third moves no figure.
FIT_ROUNDS = 3
# A nominal CPU for --local: the fit scales it, so only the product with the fitted shares matters.
LOCAL_CPU = dict(peak_flops=100e9, memory_bytes_per_s=10e9)
# The step budget of a local engine whose engine_kwargs set none. Ray Serve LLM makes each engine's
# config for an OpenAI server (ray/llm/_internal/serve/engines/vllm/vllm_engine.py,
# usage_context=UsageContext.OPENAI_API_SERVER), and vLLM's CPU default for that is 2048 tokens per
# worker (vllm/engine/arg_utils.py, get_batch_defaults), not the 4096 of its LLM class.
LOCAL_DEFAULT_TOKEN_BUDGET = 2048


def single_request_ttft(
    cost: StepCost,
    tokens: int,
    budget: int,
    mode: str,
    link: Link | None,
    min_prompt_tokens: int = 0,
    cached: int = 0,
) -> float:
    """Seconds from arrival to first token of one request on idle engines (P/D below
    ``min_prompt_tokens``: decode prefills it, as colocated does). ``cached``: the prompt's tokens
    both engines hold already, neither computed nor moved. The first token passes the front end's
    per-token stage too (``token_overhead_s``)."""
    efficiency = cost.device.efficiency
    seconds, offset = efficiency.request_overhead_s + efficiency.token_overhead_s, cached
    while offset < tokens:
        take = min(budget, tokens - offset)
        seconds += cost.step_seconds(0, 0, take, take * (offset + take / 2), offset, 1)
        offset += take
    if mode == "disaggregated" and tokens >= min_prompt_tokens:
        assert link is not None
        moved = (tokens - cached) * cost.kv_bytes_per_token
        seconds += link.seconds(moved) + cost.step_seconds(1, tokens, 0, 0.0, 0, 0)
    return seconds


@dataclass(frozen=True)
class Fit:
    efficiency: Efficiency
    link: Link
    fitted_on: tuple[int, int]
    measured_ms: dict[str, dict[int, float]]  # mode -> size -> ms
    before_ms: dict[str, dict[int, float]]
    after_ms: dict[str, dict[int, float]]

    def _gaps(self, table: dict[str, dict[int, float]]) -> dict[int, float]:
        return {t: table["disaggregated"][t] - table["colocated"][t] for t in table["colocated"]}

    def errors(self) -> dict[str, dict[int, dict[str, float]]]:
        """For each size: the relative error of each mode's TTFT and the absolute error of the gap (ms),
        before and after the fit."""
        out: dict[str, dict[int, dict[str, float]]] = {}
        measured_gap = self._gaps(self.measured_ms)
        for label, table in (("before", self.before_ms), ("after", self.after_ms)):
            gaps = self._gaps(table)
            out[label] = {
                t: {
                    **{
                        f"{mode}_ttft_error": table[mode][t] / self.measured_ms[mode][t] - 1
                        for mode in ("colocated", "disaggregated")
                    },
                    "gap_error_ms": gaps[t] - measured_gap[t],
                }
                for t in self.measured_ms["colocated"]
            }
        return out

    def as_dict(self) -> dict[str, Any]:
        return {
            "fitted_on": list(self.fitted_on),
            "efficiency": self.efficiency.__dict__,
            "link": {
                "bytes_per_s": self.link.network_bytes_per_s,
                "fixed_ms": round(self.link.fixed_s * 1e3, 3),
            },
            "measured_ms": self.measured_ms,
            "before_ms": self.before_ms,
            "after_ms": self.after_ms,
            "errors": self.errors(),
        }

    def render(self) -> str:
        e, errors = self.efficiency, self.errors()
        sizes = sorted(self.measured_ms["colocated"])
        lines = [
            f"Calibration (fitted on {self.fitted_on[0]}- and {self.fitted_on[1]}-token prompts): "
            f"prefill MFU {e.prefill_mfu:.3g}, {e.step_overhead_s * 1e3:.2f} ms per step, "
            f"{e.request_overhead_s * 1e3:.1f} ms per request, KV link "
            + (
                "unlimited"
                if self.link.network_bytes_per_s >= UNLIMITED_BYTES_PER_S
                else f"{self.link.network_bytes_per_s / 1e9:.3g} GB/s"
            )
            + f" + {self.link.fixed_s * 1e3:.1f} ms per transfer",
            "",
            "| prompt tokens | measured colocated / P/D / gap ms | uncalibrated | calibrated | held out |",
            "|---|---|---|---|---|",
        ]
        for t in sizes:
            row = []
            for table in (self.measured_ms, self.before_ms, self.after_ms):
                co, pd = table["colocated"][t], table["disaggregated"][t]
                row.append(f"{co:.1f} / {pd:.1f} / {pd - co:+.1f}")
            held = "yes" if t not in self.fitted_on else "no"
            lines.append(f"| {t} | {' | '.join(row)} | {held} |")
        for t in sizes:
            if t in self.fitted_on:
                continue
            b, a = errors["before"][t], errors["after"][t]
            lines.append(
                f"held out {t} tokens: colocated TTFT {a['colocated_ttft_error']:+.0%} (uncalibrated "
                f"{b['colocated_ttft_error']:+.0%}), P/D TTFT {a['disaggregated_ttft_error']:+.0%} "
                f"({b['disaggregated_ttft_error']:+.0%}), gap {a['gap_error_ms']:+.1f} ms "
                f"({b['gap_error_ms']:+.1f} ms)"
            )
        return "\n".join(lines) + "\n"


def _bisect(function, target: float, low: float, high: float, steps: int = 60) -> float:
    """The x in [low, high] (log scale) where the non-increasing ``function`` meets ``target``."""
    import math

    if function(low) <= target:
        return low
    if function(high) >= target:
        return high
    lo, hi = math.log(low), math.log(high)
    for _ in range(steps):
        mid = (lo + hi) / 2
        if function(math.exp(mid)) > target:
            lo = mid
        else:
            hi = mid
    return math.exp((lo + hi) / 2)


def _median_itl_ms(row: dict[str, Any]) -> float | None:
    """A row's median ITL under `vllm bench serve`'s name; results written before the rows took vLLM's
    names call it itl_ms_p50."""
    return row.get("median_itl_ms") or row.get("itl_ms_p50")


def probe_of(data: dict[str, Any]) -> dict[str, dict[int, float]]:
    """The TTFT probe of both modes (ms per prompt size), refused in one line naming what is missing: a
    mode, a second size both modes measured, a size measured by too few requests."""
    probe = data.get("ttft_probe") or {}
    missing = [mode for mode in MODES if not probe.get(mode)]
    if missing:
        found = ", ".join(sorted(m for m in probe if probe[m])) or "no mode"
        raise PlanningError(
            f"the calibration needs the TTFT probe of both modes and has {found}, not {' and '.join(missing)}: run "
            "`make bench-compare` (it writes calibration.json with both), not `make bench` on one endpoint"
        )
    samples = data.get("ttft_probe_samples") or {}
    measured: dict[str, dict[int, float]] = {}
    for mode in MODES:
        measured[mode] = {}
        for size, ms in probe[mode].items():
            count = samples.get(mode, {}).get(size)
            if count is not None and count < MIN_PROBE_SAMPLES:
                raise PlanningError(
                    f"the TTFT probe of {mode} at {size} tokens is the median of {count} request(s); the fit needs "
                    f"{MIN_PROBE_SAMPLES} at least: run `make bench-compare` again until its probe completes"
                )
            if not isinstance(ms, int | float) or not math.isfinite(ms) or ms <= 0:
                raise PlanningError(
                    f"the TTFT probe of {mode} at {size} tokens holds {ms!r}, not a time: its requests failed; run "
                    "`make bench-compare` again"
                )
            measured[mode][int(size)] = float(ms)
    both = sorted(set(measured["colocated"]) & set(measured["disaggregated"]))
    if len(both) < 2:
        raise PlanningError(
            "the calibration needs the TTFT probe at two prompt sizes at least, measured in both modes; it has "
            + "; ".join(f"{mode} at {', '.join(map(str, sorted(measured[mode])))} tokens" for mode in MODES)
        )
    return measured


def fit(data: dict[str, Any], cost: StepCost, budget: int, link: Link, fit_on: tuple[int, int] | None = None) -> Fit:
    measured = probe_of(data)
    sizes = sorted(set(measured["colocated"]) & set(measured["disaggregated"]))
    t1, t2 = fit_on or (sizes[0], sizes[-1])
    if t1 not in sizes or t2 not in sizes or t1 == t2:
        raise PlanningError(f"--fit-on takes two of the measured sizes {', '.join(map(str, sizes))}")
    threshold = int(data.get("pd_min_prompt_tokens", 0))
    if min(t1, t2) < threshold:
        raise PlanningError(
            f"the P/D deployment prefilled prompts under {threshold} tokens on decode (serving.pd_min_prompt_tokens): "
            "fit on two sizes at or above it, or measure with pd_min_prompt_tokens: 0"
        )

    def predict(c: StepCost, lk: Link) -> dict[str, dict[int, float]]:
        return {
            mode: {t: single_request_ttft(c, t, budget, mode, lk, threshold) * 1e3 for t in sizes}
            for mode in ("colocated", "disaggregated")
        }

    before = predict(cost, link)
    efficiency = cost.device.efficiency
    itl_ms_at: dict[int, float] = {}
    single = [r for r in data.get("rows", []) if r.get("concurrency") == 1 and _median_itl_ms(r)]
    if single:
        mode = "colocated" if any(r["mode"] == "colocated" for r in single) else single[0]["mode"]
        workload = data.get("workload") or {}
        if not all("context_tokens" in r for r in single) and not {"input_len", "output_len"} <= set(workload):
            raise PlanningError(
                "the rows at concurrency 1 name no workload (input_len, output_len) to read their ITL by"
            )
        itl_ms_at = {
            int(r.get("context_tokens", workload.get("input_len", 0) + workload.get("output_len", 0) // 2)): float(
                _median_itl_ms(r) or 0.0
            )
            for r in single
            if r["mode"] == mode
        }

    measured_growth = (measured["colocated"][t2] - measured["colocated"][t1]) / 1e3
    if measured_growth <= 0:
        raise PlanningError(
            f"colocated TTFT does not grow from {t1} to {t2} tokens ({measured['colocated'][t1]:g} ms, then "
            f"{measured['colocated'][t2]:g} ms): the probe measured noise, not prefill; run `make bench-compare` on an "
            "otherwise idle deployment, or fit on sizes further apart (--fit-on)"
        )

    def growth(mfu: float) -> float:
        c = cost.with_efficiency(replace(efficiency, prefill_mfu=mfu, request_overhead_s=0.0))
        return single_request_ttft(c, t2, budget, "colocated", None) - single_request_ttft(
            c, t1, budget, "colocated", None
        )

    # A decode step's compute (its attention over the context) comes with the MFU, and the prefill's
    # steps with the per-step cost: each fit is redone on the other's result until neither moves.
    for _ in range(FIT_ROUNDS):
        if itl_ms_at:
            efficiency = decode_fit(cost, efficiency, itl_ms_at)
        efficiency = replace(efficiency, prefill_mfu=_bisect(growth, measured_growth, 1e-6, 1.0))
    efficiency = replace(efficiency, request_overhead_s=0.0)
    bare_ttft = single_request_ttft(cost.with_efficiency(efficiency), t1, budget, "colocated", None)
    efficiency = replace(efficiency, request_overhead_s=max(measured["colocated"][t1] / 1e3 - bare_ttft, 0.0))
    fitted = cost.with_efficiency(efficiency)

    def gap(t: int) -> float:
        return (measured["disaggregated"][t] - measured["colocated"][t]) / 1e3

    first_token = {t: fitted.step_seconds(1, t, 0, 0.0, 0, 0) for t in (t1, t2)}
    kv = cost.kv_bytes_per_token
    moving_s = (gap(t2) - first_token[t2]) - (gap(t1) - first_token[t1])
    bandwidth = kv * (t2 - t1) / moving_s if moving_s > 0 else UNLIMITED_BYTES_PER_S
    fixed = max(gap(t1) - first_token[t1] - kv * t1 / bandwidth, 0.0)
    fitted_link = Link(bandwidth, None, fixed)
    return Fit(efficiency, fitted_link, (t1, t2), measured, before, predict(fitted, fitted_link))


# A share of the nominal memory bandwidth so high that a step's reads cost nothing beside its compute.
HIDDEN_SHARE_CEILING = 1e3


def decode_fit(cost: StepCost, efficiency: Efficiency, itl_ms_at: dict[int, float]) -> Efficiency:
    """One sequence's decode step, from its median ITL at each context measured (context tokens ->
    ms). At two contexts or more, the share of the memory bandwidth its KV reads reach first, from how
    the ITL grows between the shortest and the longest. Where it grows more than the step's compute
    (its attention over the context) explains, the share that gives that growth. Where it grows no
    more, or not at all (on a CPU the growth can sit below the runs' noise), the reads were hidden
    under the compute: the lowest share that still hides them at the longest context, not the assumed
    share, which may price them above what was measured. Then the per-step cost, what the ITL at the
    shortest has beyond the step's reads and compute."""
    shortest, longest = min(itl_ms_at), max(itl_ms_at)

    def bare_step(share: float, context: int) -> float:
        bare = replace(efficiency, decode_bandwidth=share, step_overhead_s=0.0)
        return cost.with_efficiency(bare).step_seconds(1, context, 0, 0.0, 0, 0)

    if longest > shortest:
        compute_only = bare_step(HIDDEN_SHARE_CEILING, longest)
        hidden = _bisect(lambda s: bare_step(s, longest), compute_only * (1 + 1e-6), 1e-3, HIDDEN_SHARE_CEILING)
        growth = (itl_ms_at[longest] - itl_ms_at[shortest]) / 1e3
        if growth > bare_step(hidden, longest) - bare_step(hidden, shortest):
            share = _bisect(lambda s: bare_step(s, longest) - bare_step(s, shortest), growth, 1e-3, 1e3)
        else:
            share = hidden
        efficiency = replace(efficiency, decode_bandwidth=share)
    moving = bare_step(efficiency.decode_bandwidth, shortest)
    return replace(efficiency, step_overhead_s=max(itl_ms_at[shortest] / 1e3 - moving, 0.0))


@contextmanager
def in_file(path: str | Path) -> Iterator[None]:
    """Names the calibration file in what is refused inside."""
    try:
        yield
    except PlanningError as exc:
        raise PlanningError(f"calibration {path}: {exc}") from None


def load(path: str | Path, *, model_id: str | None = None) -> dict[str, Any]:
    """A calibration.json (or the results folder holding it), refused in one line when it is not one,
    or when it was measured on a model other than ``model_id`` (the served model's id)."""
    file = Path(path)
    if file.is_dir():
        file = file / FILE_NAME
    if not file.is_file():
        raise PlanningError(f"no {FILE_NAME} there (`make bench-compare` writes one in its results folder)")
    try:
        data = json.loads(file.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise PlanningError(f"not JSON ({exc}): give the {FILE_NAME} a benchmark wrote") from None
    if not isinstance(data, dict) or "ttft_probe" not in data:
        raise PlanningError(f"no ttft_probe in it: give the {FILE_NAME} `make bench-compare` wrote")
    measured_on = data.get("model")
    if model_id is not None and measured_on != model_id:
        raise PlanningError(
            f"measured on model {measured_on!r}, not {model_id!r} (serving.model.model_id): calibrate with a run of "
            f"{model_id} (`make bench-compare MODEL={model_id}`)"
        )
    return data


def calibrate_file(path: str | Path, inputs, model_id: str, fit_on: tuple[int, int] | None = None) -> Fit:
    """The fit of a results file of ``model_id`` for the advisor's inputs (planner/advisor.py
    AdvisorInputs): its decode engine, on the configured instance, and the link between the groups."""
    from config.catalog import INSTANCES

    decode = INSTANCES[inputs.decode_instance]
    prefill = INSTANCES[inputs.prefill_instance]
    cost = StepCost.of(inputs.model, Device.of(decode, inputs.decode_tp, inputs.efficiency), inputs.dtype_bytes)
    link = Link.between(prefill, decode, inputs.network_efficiency)
    with in_file(path):
        return fit(load(path, model_id=model_id), cost, inputs.token_budget, link, fit_on)


def local_spec():
    """config/local.yaml, the local servers' serving spec."""
    from serve_app.spec import load_spec

    return load_spec(str(Path(__file__).resolve().parent.parent / "config" / "local.yaml"))


def local_model_id() -> str:
    """The model id the local servers serve, which their benchmarks record."""
    return local_spec().model.model_id


def local_cost() -> tuple[StepCost, int]:
    """The tiny model of `make local` on this CPU, and its engines' step budget."""
    from planner.models import load_architecture

    spec = local_spec()
    model_dir = Path(__file__).resolve().parent.parent / spec.model.source
    if not (model_dir / "config.json").is_file():
        raise PlanningError(f"{model_dir} has no config.json: run `make local` once to generate the tiny model")
    model = load_architecture(spec.model.model_id, model_dir)
    device = Device("this CPU (nominal)", tp=1, efficiency=ASSUMED_EFFICIENCY["CPU"], **LOCAL_CPU)
    dtype_bytes = 4 if spec.dtype == "float32" else 2
    budget = int(spec.decode.engine_kwargs.get("max_num_batched_tokens", LOCAL_DEFAULT_TOKEN_BUDGET))
    return StepCost.of(model, device, dtype_bytes), budget


def main(argv: list[str] | None = None) -> int:
    parser = ArgumentParser(
        prog="python -m planner.calibration", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("results", help="calibration.json, or the results folder that holds it")
    parser.add_argument(
        "--fit-on", default=None, help="the two prompt sizes to fit on, e.g. 20,500 (default: the ends)"
    )
    parser.add_argument("--local", action="store_true", help="fit the tiny model of `make local` on this CPU")
    parser.add_argument("--config", default=None, help="an environment's config, to fit its decode instance")
    parser.add_argument("--json", action="store_true", help="print the fit as JSON")
    args = parser.parse_args(argv)
    if args.local == bool(args.config):
        parser.error("give --local or --config CONFIG")
    fit_on = None
    if args.fit_on:
        try:
            first, second = (int(v) for v in args.fit_on.split(","))
        except ValueError:
            parser.error(f"--fit-on {args.fit_on!r}: two sizes, e.g. 20,500")
        fit_on = (first, second)
    try:
        if args.local:
            cost, budget = local_cost()
            with in_file(args.results):
                data = load(args.results, model_id=local_model_id())
                result = fit(data, cost, budget, Link(UNLIMITED_BYTES_PER_S, None), fit_on)
        else:
            from config.loader import load_config
            from planner.from_config import advisor_inputs, plan_config

            config = load_config(args.config)
            inputs = advisor_inputs(config, plan_config(config))
            result = calibrate_file(args.results, inputs, config.serving.model.model_id, fit_on)
    except PlanningError as exc:
        print(exc, file=sys.stderr)
        return 2
    print(json.dumps(result.as_dict(), indent=2) if args.json else result.render())
    return 0


if __name__ == "__main__":
    sys.exit(main())
