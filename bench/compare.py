"""`make bench-compare`: the same workload against disaggregated and colocated, ratios side by side.

    python -m bench.compare --pd-url URL --colocated-url URL --workload long-prompt [--model M --tokenizer T]
    python -m bench.compare --local --workload tiny      # starts each local CPU server in turn

Ratios are disaggregated / colocated from one run, so below 1 means disaggregation is lower
(better) for latencies, and above 1 means it is higher (better) for throughput and goodput.

Each endpoint also gets the TTFT probe of ``bench/ttft.py``: streamed completions at short,
medium and long prompts, each with a unique prefix, sequentially. The report gives P/D minus
colocated TTFT (p50, p90) per size and, for the local servers (whose metrics it reads), where
P/D's first token spends its time.

A repeated workload (a shared prefix, or conversations of several turns) adds, per endpoint and
concurrency, the median TTFT of each turn and each phase's prefix-cache hit rate (tokens hit /
looked up, from the engines' counters before and after the level): the local servers' metrics,
or a remote deployment's given with --pd-metrics-url / --colocated-metrics-url; without them the
report says the rate was not measured, and why.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from bench.calibration import write_calibration
from bench.run import (
    LATENCY_METRICS,
    THIRD_PARTY_LOG,
    Row,
    dated_dir,
    default_tokenizer,
    exit_output_to,
    load_workloads,
    metrics_counters,
    plot,
    repeated_section,
    run_workload,
    table,
    workload_named,
    write_report,
)
from cmdline import ArgumentParser
from planner.simulate import statistic_names

LOCAL_SPEC = Path(__file__).resolve().parent.parent / "config" / "local.yaml"


def ratio(a: float, b: float) -> str:
    # Below a microsecond a latency is a streaming artefact (several tokens in one event), not a
    # measurement worth dividing by.
    return f"{a / b:.2f}×" if b > 1e-3 else "n/a"


def ratio_table(pd_rows: list[Row], colocated_rows: list[Row]) -> str:
    by_level = {r.concurrency: r for r in colocated_rows}
    header = ["conc", "req/s", "out tok/s", "goodput"] + [name for m in LATENCY_METRICS for name in statistic_names(m)]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for pd in pd_rows:
        co = by_level.get(pd.concurrency)
        if co is None:
            continue
        cells = [
            str(pd.concurrency),
            ratio(pd.request_throughput, co.request_throughput),
            ratio(pd.output_throughput, co.output_throughput),
            ratio(pd.goodput, co.goodput),
        ]
        cells += [
            ratio(pd.latency_ms[name], co.latency_ms[name]) for m in LATENCY_METRICS for name in statistic_names(m)
        ]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def probe_ttft(url: str, model: str, tokenizer: str, **metrics):
    """The TTFT probe; byte-level prompts for the tiny model, the model's tokenizer otherwise."""
    from bench.ttft import measure

    tok = None
    if model != "tiny-llama":
        from transformers import AutoTokenizer

        tok = AutoTokenizer.from_pretrained(tokenizer)
    return measure(url, model, tokenizer=tok, **metrics)


def bench_local(mode: str, port: int, metrics_port: int, spec: Path | None = None, **kwargs):
    """The workload and the TTFT probe against a local server started for them."""
    from bench.host_cpu import accounted, behind_the_client
    from local.harness import LocalServer

    server = LocalServer(mode=mode, port=port, metrics_port=metrics_port, spec=spec).start()
    try:
        priority = behind_the_client(server.process.pid)
        print(f"[bench] {mode}: {priority}", flush=True)
        # Every level's prefix-cache hits, from the engines' own counters: the local model's byte-level
        # vocabulary makes vLLM's random prompts share prefixes, and the advisor's check
        # (planner/local_check.py) predicts each level with the hits it had.
        kwargs["counters"] = server.counters
        rows = run_workload(url=server.base_url, host_cpu=lambda: accounted(server.process.pid), **kwargs)
        ttft = probe_ttft(
            server.base_url,
            kwargs["model"],
            kwargs["tokenizer"],
            metrics_url=server.status["metrics_url"],
            replicas=server.replicas,
        )
        return rows, ttft, priority
    finally:
        server.stop()


def ttft_sections(pd, colocated, pd_min_prompt_tokens: int = 0) -> str:
    """TTFT per size and mode, P/D minus colocated, and where P/D's first token goes (local only)."""
    from bench.ttft import ttft_table, where_it_goes, where_table

    (pd_results, pd_where), (co_results, co_where) = pd, colocated
    out = (
        "\n## Time to first token (unique prompts, one at a time)\n\n"
        + ttft_table({"disaggregated": pd_results, "colocated": co_results}, pd_min_prompt_tokens)
        + "\n"
    )
    if pd_where:
        out += "\n### Where P/D's first token goes (engines' and Serve's histograms; approximate)\n\n"
        out += where_table(where_it_goes(pd_results, pd_where, "disaggregated")) + "\n"
        out += (
            "\n### Colocated, for comparison\n\n" + where_table(where_it_goes(co_results, co_where, "colocated")) + "\n"
        )
    return out


def compare(
    *,
    workload_name: str,
    model: str,
    tokenizer: str,
    out_dir: Path,
    pd_url: str | None = None,
    colocated_url: str | None = None,
    local: bool = False,
    spec: Path | None = None,
    pd_min_prompt_tokens: int = 0,
    pd_metrics_url: str | None = None,
    colocated_metrics_url: str | None = None,
) -> str:
    workload = workload_named(workload_name)
    common = dict(model=model, tokenizer=tokenizer, workload=workload, out_dir=out_dir)
    if local:
        from serve_app.spec import load_spec

        pd_min_prompt_tokens = load_spec(str(spec or LOCAL_SPEC)).pd_min_prompt_tokens
    host_priority = None
    if local:
        pd_rows, pd_ttft, host_priority = bench_local(
            "disaggregated", 8000, 8085, spec, label="disaggregated", **common
        )
        colocated_rows, co_ttft, _ = bench_local("colocated", 8000, 8085, spec, label="colocated", **common)
    else:
        pd_counters, pd_note = metrics_counters(pd_metrics_url) if workload.repeated else (None, "")
        pd_rows = run_workload(url=pd_url, label="disaggregated", counters=pd_counters, counters_note=pd_note, **common)
        pd_ttft = probe_ttft(pd_url, model, tokenizer)
        co_counters, co_note = metrics_counters(colocated_metrics_url) if workload.repeated else (None, "")
        colocated_rows = run_workload(
            url=colocated_url, label="colocated", counters=co_counters, counters_note=co_note, **common
        )
        co_ttft = probe_ttft(colocated_url, model, tokenizer)
    ratios = ratio_table(pd_rows, colocated_rows)
    ttft = ttft_sections(pd_ttft, co_ttft, pd_min_prompt_tokens)
    plot(pd_rows + colocated_rows, out_dir / f"{workload.name}-compare.png", f"{workload.name}: P/D vs colocated")
    write_report(
        pd_rows + colocated_rows,
        out_dir,
        workload,
        extra=f"\n## Disaggregated / colocated (one run)\n\n{ratios}\n{ttft}"
        + (f"\nThe CPU, client and local server: {host_priority}.\n" if host_priority else ""),
    )
    write_calibration(
        out_dir,
        model=model,
        workload=workload,
        rows=pd_rows + colocated_rows,
        ttft={"disaggregated": pd_ttft[0], "colocated": co_ttft[0]},
        pd_min_prompt_tokens=pd_min_prompt_tokens,
        host_priority=host_priority,
    )
    repeated = repeated_section(pd_rows + colocated_rows, workload)
    return f"{table(pd_rows + colocated_rows)}\n{repeated}\nDisaggregated / colocated:\n{ratios}\n{ttft}"


def refuse_what_the_local_servers_cannot_hold(parser: argparse.ArgumentParser, workload_name: str, spec: Path) -> None:
    """A preset whose requests pass the local servers' context is refused before two servers start
    for it only to answer every request 400."""
    from serve_app.spec import load_spec

    needed = workload_named(workload_name).longest_request_tokens()
    limit = load_spec(str(spec)).max_model_len
    if needed > limit:
        fitting = [w.name for w in load_workloads().values() if w.longest_request_tokens() <= limit]
        parser.error(
            f"--workload {workload_name}: its requests reach {needed} tokens, past the "
            f"local servers' max_model_len of {limit} ({spec}): pick one of {', '.join(fitting)} with --local, "
            "or compare two deployments with --pd-url and --colocated-url"
        )


def main(argv: list[str] | None = None, *, exiting: bool = False) -> int:
    """``exiting``: as for bench.run's main, what the interpreter's exit prints goes to the log."""
    parser = ArgumentParser(
        prog="python -m bench.compare", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--pd-url", help="OpenAI base URL of the disaggregated (P/D) deployment")
    parser.add_argument("--colocated-url", help="OpenAI base URL of the colocated deployment")
    parser.add_argument("--local", action="store_true", help="start the local servers in turn")
    parser.add_argument("--spec", default=None, help="serving spec of the local servers (default config/local.yaml)")
    parser.add_argument(
        "--workload",
        default="long-prompt",
        help="preset in bench/workloads.yaml: chat, long-prompt, shared-context-rag, multi-turn-agent, tiny "
        "(default: long-prompt)",
    )
    parser.add_argument("--model", default="tiny-llama", help="model id served at both URLs (default: tiny-llama)")
    parser.add_argument("--tokenizer", default=default_tokenizer(), help="tokenizer path or Hugging Face id")
    parser.add_argument(
        "--pd-min-prompt-tokens",
        type=int,
        default=0,
        help="serving.pd_min_prompt_tokens of the P/D deployment, to label which prompt sizes it prefilled "
        "on decode (the local servers': read from their spec)",
    )
    for which in ("pd", "colocated"):
        parser.add_argument(
            f"--{which}-metrics-url",
            default=None,
            help=f"Ray metrics (Prometheus text) of the {which} deployment, for a repeated workload's prefix-cache "
            "hit rates (the local servers': read from their status)",
        )
    parser.add_argument("--out", default=None, help="results folder (default results/<date>)")
    args = parser.parse_args(argv)
    if not args.local and not (args.pd_url and args.colocated_url):
        parser.error("give --pd-url and --colocated-url, or --local")
    if args.local:
        refuse_what_the_local_servers_cannot_hold(parser, args.workload, Path(args.spec) if args.spec else LOCAL_SPEC)
    out_dir = Path(args.out) if args.out else dated_dir()
    print(
        compare(
            workload_name=args.workload,
            model=args.model,
            tokenizer=args.tokenizer,
            out_dir=out_dir,
            pd_url=args.pd_url,
            colocated_url=args.colocated_url,
            local=args.local,
            spec=Path(args.spec) if args.spec else None,
            pd_min_prompt_tokens=args.pd_min_prompt_tokens,
            pd_metrics_url=args.pd_metrics_url,
            colocated_metrics_url=args.colocated_metrics_url,
        )
    )
    print(f"results in {out_dir}", flush=True)
    if exiting:
        exit_output_to(out_dir / THIRD_PARTY_LOG)
    return 0


if __name__ == "__main__":
    sys.exit(main(exiting=True))
