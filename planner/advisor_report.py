"""Plain-text rendering of the advisor's :class:`~planner.advisor.Advice`."""

from __future__ import annotations

from planner.advisor import Advice, Candidate
from planner.report import _table
from planner.simulate import LATENCY_METRICS, REPORTED_PERCENTILES, statistic_names

nan = float("nan")


def _ms(value: float) -> str:
    # Whole milliseconds where they are large (TTFT), a decimal where they are not (ITL, TPOT).
    return f"{value:,.0f}" if value >= 100 else f"{value:.1f}"


def _row(c: Candidate, marker: str = "") -> list[str]:
    o = c.outcome
    return [
        f"{c.split}{marker}",
        str(c.gpus),
        *(
            " / ".join(_ms(o.latency_ms.get(name, nan)) for name in statistic_names(metric))
            for metric in LATENCY_METRICS
        ),
        f"{o.output_tokens_per_s:,.0f}",
        f"{o.goodput_rps:.3f}",
        f"{c.goodput_per_gpu:.3f}",
        "saturated" if o.saturated else ("yes" if o.meets_slo else "no"),
    ]


def render_advice(advice: Advice) -> str:
    w, s = advice.workload, advice.slo
    load = f"concurrency {w.concurrency}" if w.concurrency is not None else f"{w.rate:g} requests/s (Poisson)"
    spread = f" ±{w.range_ratio:.0%}" if w.range_ratio else ""
    out = [
        f"Advisor: {w.prompt_tokens}{spread} prompt / {w.output_tokens}{spread} output tokens at {load}; "
        f"SLO TTFT p{s.percentile} ≤ {s.ttft_ms:g} ms, ITL p{s.percentile} ≤ {s.itl_ms:g} ms "
        f"(simulated, {w.requests} requests)",
        "",
    ]
    headers = [
        "candidate",
        "GPUs",
        *(
            f"{metric.upper()} ms mean/median/p{'/p'.join(map(str, REPORTED_PERCENTILES))}"
            for metric in LATENCY_METRICS
        ),
        "out tok/s",
        "goodput",
        "per GPU",
        "SLO",
    ]
    shown = [advice.colocated, advice.disaggregated]
    others = [c for c in advice.candidates if c not in shown]
    rows = [_row(advice.colocated, "  (colocated)"), _row(advice.disaggregated, "  (P/D)")]
    rows += [_row(c) for c in sorted(others, key=lambda c: -c.goodput_per_gpu)[:10]]
    out += _table(headers, rows)
    if len(others) > 10:
        out.append(f"({len(others) - 10} more candidates: --json lists them all)")
    r = advice.recommended
    threshold = (
        f"; serving.pd_min_prompt_tokens: {advice.recommended_min_prompt_tokens}"
        if advice.recommended_min_prompt_tokens
        else ""
    )
    a = advice.assumptions
    out += [
        "",
        f"Recommendation: serving.mode: {r.mode}{threshold}. {advice.reason}",
        f"Assumed: {a['efficiency']['prefill_mfu']:g} prefill MFU, {a['efficiency']['decode_bandwidth']:g} of peak memory "
        f"bandwidth, {a['efficiency']['step_overhead_s'] * 1e3:g} ms per step, "
        f"{a['efficiency']['request_overhead_s'] * 1e3:g} ms per request; KV over {a['kv_link_gbit_per_s']:g} Gbit/s"
        + (" staged through host memory" if a["host_staging"] else "")
        + f" + {a['kv_transfer_fixed_ms']:g} ms per transfer ({a['efficiency']['source']}). "
        "Calibrate with `make plan CALIBRATION=<bench results>`.",
    ]
    return "\n".join(out) + "\n"
