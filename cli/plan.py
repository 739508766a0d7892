"""`make plan`: `python -m cli.plan CONFIG` prints the deployment plan of an environment and the
advisor's comparison of colocated and P/D serving for one workload.

    python -m cli.plan config/dev.yaml [--prompt-tokens 4096 --output-tokens 256 --concurrency 8 | --rate 2]
                                       [--ttft-slo-ms 3000 --itl-slo-ms 100] [--prefix-hit-share 0.8]
                                       [--calibration BENCH.json] [--json]

The workload defaults to the config's planner section (typical_prompt_tokens, typical_output_tokens,
typical_concurrency, ttft_slo_ms, itl_slo_ms). ``--calibration`` takes the figures `make bench`
wrote (bench/calibration.json in its results folder) and fits the model's efficiencies and fixed
costs to them first (planner/calibration.py). ``--prefix-hit-share`` is the share of each prompt the
prefix cache serves (a conversation's history, a shared context): prefill computes only the rest and
only the rest crosses to decode; the report says at which share, if any, the verdict flips
(planner/reuse.py).
"""

from __future__ import annotations

import argparse
import json
import sys

from cmdline import ArgumentParser
from config.loader import ConfigError, load_config
from planner import PlanningError, render_text
from planner.advisor import advise, local_prefill_cap, with_calibration
from planner.advisor_report import render_advice
from planner.band import verdict_band
from planner.from_config import advisor_inputs, plan_config
from planner.reuse import reuse_verdicts
from planner.simulate import Slo, Workload


def positive_int(value: str) -> int:
    number = int(value)
    if number < 1:
        raise argparse.ArgumentTypeError(f"{value} is not a positive whole number")
    return number


def positive_float(value: str) -> float:
    number = float(value)
    if number <= 0:
        raise argparse.ArgumentTypeError(f"{value} is not above 0")
    return number


def share(value: str) -> float:
    try:
        number = float(value)
    except ValueError:
        number = float("nan")
    if not 0 <= number <= 1:
        raise argparse.ArgumentTypeError(
            f"{value} is not a share from 0 to 1: give the fraction of each prompt served from the prefix cache, "
            "e.g. 0.8 for 80%"
        )
    return number


def cap_sentence(cap: int, batch: int, slo: Slo, configured: int) -> str:
    """What `make plan` says of serving.pd_max_local_prefill_tokens."""
    figure = (
        f"decode can prefill up to {cap} tokens of a prompt beside {batch} streams within the ITL target "
        f"({slo.itl_ms:g} ms)"
        if cap
        else f"decode cannot prefill even a short prompt beside {batch} streams within the ITL target ({slo.itl_ms:g} ms)"
    )
    if configured <= cap:
        advice = "within it"
    elif cap:
        advice = f"above it: lower it to {cap} to keep the ITL target"
    else:
        advice = "so set serving.pd_min_prompt_tokens: 0 (every prompt through prefill) to keep the ITL target"
    return f"Local prefill cap: {figure}; serving.pd_max_local_prefill_tokens is {configured}, {advice}."


def parser() -> ArgumentParser:
    p = ArgumentParser(
        prog="python -m cli.plan", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("config", help="the environment's config, e.g. config/dev.yaml")
    p.add_argument(
        "--prompt-tokens", type=positive_int, help="mean prompt length (default: planner.typical_prompt_tokens)"
    )
    p.add_argument(
        "--output-tokens", type=positive_int, help="mean output length (default: planner.typical_output_tokens)"
    )
    p.add_argument(
        "--range-ratio",
        type=float,
        default=0.25,
        help="lengths spread uniformly over ±ratio around the means, as bench/workloads.yaml's (default 0.25)",
    )
    load = p.add_mutually_exclusive_group()
    load.add_argument(
        "--concurrency", type=positive_int, help="requests in flight (default: planner.typical_concurrency)"
    )
    load.add_argument("--rate", type=positive_float, help="Poisson arrivals per second, instead of a concurrency")
    p.add_argument("--ttft-slo-ms", type=positive_float, help="TTFT target (default: planner.ttft_slo_ms)")
    p.add_argument("--itl-slo-ms", type=positive_float, help="inter-token latency target (default: planner.itl_slo_ms)")
    p.add_argument("--slo-percentile", type=positive_int, help="percentile that must meet the targets (default 90)")
    p.add_argument(
        "--prefix-hit-share",
        type=share,
        default=0.0,
        help="share of each prompt served from the prefix cache on prefill and already held by decode (default 0)",
    )
    p.add_argument("--requests", type=positive_int, default=None, help="simulated requests (default: by the load)")
    p.add_argument("--calibration", default=None, help="bench results to calibrate the model with (calibration.json)")
    p.add_argument("--json", action="store_true", help="print the advisor's comparison as JSON, nothing else")
    return p


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    try:
        config = load_config(args.config)
        report = plan_config(config)
        settings = config.planner
        concurrency = None if args.rate else (args.concurrency or settings.typical_concurrency)
        requests = args.requests or (max(100, 10 * concurrency) if concurrency else 300)
        workload = Workload(
            prompt_tokens=args.prompt_tokens or settings.typical_prompt_tokens,
            output_tokens=args.output_tokens or settings.typical_output_tokens,
            range_ratio=args.range_ratio,
            concurrency=concurrency,
            rate=args.rate,
            requests=requests,
            prefix_hit_share=args.prefix_hit_share,
        )
        slo = Slo(
            ttft_ms=args.ttft_slo_ms or settings.ttft_slo_ms,
            itl_ms=args.itl_slo_ms or settings.itl_slo_ms,
            percentile=args.slo_percentile or settings.slo_percentile,
        )
        inputs = advisor_inputs(config, report)
        fit = None
        if args.calibration:
            from planner.calibration import calibrate_file

            fit = calibrate_file(args.calibration, inputs, config.serving.model.model_id)
            inputs = with_calibration(inputs, fit.efficiency, fit.link)
        advice = advise(inputs, workload, slo)
        cap_batch = concurrency or settings.typical_concurrency
        cap = local_prefill_cap(inputs, slo, cap_batch)
        band = verdict_band(inputs, advice)
        reuse = reuse_verdicts(inputs, advice)
    except ConfigError as exc:
        print(f"Config error:\n{exc}", file=sys.stderr)
        return 2
    except PlanningError as exc:
        print(f"{args.config}: {exc}", file=sys.stderr)
        return 2
    if args.json:
        data = advice.as_dict()
        data["recommendation"]["band"] = band.as_dict()
        data["prefix_hits"] = reuse.as_dict()
        data["local_prefill_cap"] = {
            "tokens": cap,
            "decode_batch": cap_batch,
            "configured": config.serving.pd_max_local_prefill_tokens,
        }
        if fit is not None:
            data["calibration"] = fit.as_dict()
        print(json.dumps(data, indent=2))
        return 0 if report.ok else 1
    print(render_text(report))
    if fit is not None:
        print(fit.render())
    print(render_advice(advice), end="")
    print(f"How sure: {band.sentence()}")
    print(reuse.verdict_sentence())
    if reuse.share:
        print(reuse.saving_sentence())
    print(cap_sentence(cap, cap_batch, slo, config.serving.pd_max_local_prefill_tokens))
    return 0 if report.ok else 1


if __name__ == "__main__":
    sys.exit(main())
