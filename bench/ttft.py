"""Time to first token at short, medium and long prompts, and where a P/D request spends it.

    python -m bench.ttft --url http://127.0.0.1:8000/v1

Each request is a streamed completion whose prompt starts with a unique prefix, so the prefix
cache never serves a prompt twice and every measurement includes a real prefill. The client
measures TTFT (request sent to the first text chunk). For a local server, whose metrics
`make bench-compare` reads, the engines' own histograms, read before and after the measured
requests, say where it went: each engine's time from a request's arrival to its first token
(prefill: queue and prefill; decode: KV pull and first step) and the NIXL transfer within
decode's. Ray exports histogram sums from bucket midpoints, so those means are approximate; the
client's numbers are exact.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
import uuid
from collections import defaultdict
from dataclasses import dataclass, field

from cmdline import ArgumentParser

# Prompt lengths in tokens (the tiny local model's tokenizer is byte level: one token per byte).
PROMPT_TOKENS = {"short": 20, "medium": 500, "long": 1500}
FILLER = "the quick brown fox jumps over the lazy dog and keeps running through the long grass "

# The engines' histograms (sum/count, seconds) that place a request's time.
ENGINE_HISTOGRAMS = {
    "ttft": "ray_vllm_time_to_first_token_seconds",
    "nixl": "ray_vllm_nixl_xfer_time_seconds",
}


@dataclass
class SizeResult:
    name: str
    tokens: int
    ttft_s: list[float] = field(default_factory=list)

    def percentile(self, p: int) -> float:
        values = sorted(self.ttft_s)
        if not values:
            return float("nan")
        return values[min(len(values) - 1, round(p / 100 * (len(values) - 1)))]


def prompt_of(tokens: int, tokenizer=None) -> str:
    """A prompt of about ``tokens`` tokens that no earlier request shares a prefix with."""
    unique = f"{uuid.uuid4().hex} "
    text = unique + FILLER * (tokens // len(FILLER) + 2)
    if tokenizer is None:  # byte-level: characters are tokens
        return text[:tokens]
    ids = tokenizer.encode(text, add_special_tokens=False)[:tokens]
    return tokenizer.decode(ids)


def first_token_seconds(client, model: str, prompt: str) -> float:
    started = time.perf_counter()
    first = None
    stream = client.completions.create(
        model=model, prompt=prompt, max_tokens=4, temperature=0, stream=True, extra_body={"ignore_eos": True}
    )
    for chunk in stream:
        # A chunk per generated token; its text may be empty (a byte-level token that ends inside
        # a UTF-8 character is held back), but it marks the first token all the same.
        if first is None and chunk.choices:
            first = time.perf_counter() - started
    if first is None:
        raise RuntimeError("the stream ended without a token")
    return first


def histogram_totals(metrics_url: str, replicas: dict[str, str]) -> dict[tuple[str, str], float]:
    """{(deployment, "<metric>_sum"|"<metric>_count"): total} for the engines' histograms."""
    from local.metrics import deployment_of, scrape

    wanted = set(ENGINE_HISTOGRAMS.values())
    totals: dict[tuple[str, str], float] = defaultdict(float)
    for sample in scrape(metrics_url):
        base = sample.name.removesuffix("_sum").removesuffix("_count")
        if base not in wanted or sample.name == base:
            continue
        totals[(deployment_of(sample, replicas).split(":")[0], sample.name)] += sample.value
    return dict(totals)


def means_ms(before: dict, after: dict) -> dict[str, float]:
    """Mean milliseconds per observation of each histogram between two snapshots, by deployment."""
    out: dict[str, float] = {}
    for (deployment, name), value in after.items():
        if not name.endswith("_sum"):
            continue
        base = name.removesuffix("_sum")
        count = after.get((deployment, f"{base}_count"), 0) - before.get((deployment, f"{base}_count"), 0)
        if count <= 0:
            continue
        total = value - before.get((deployment, name), 0.0)
        label = next(k for k, v in ENGINE_HISTOGRAMS.items() if v == base)
        out[f"{deployment} {label}"] = total / count * 1000.0
    return out


def measure(
    base_url: str,
    model: str,
    *,
    tokenizer=None,
    warmups: int = 3,
    runs: int = 10,
    metrics_url: str | None = None,
    replicas=None,
) -> tuple[list[SizeResult], dict[str, dict[str, float]]]:
    """TTFT per prompt size, and (with ``metrics_url``) the histogram means per size."""
    import openai

    from bench.run import endpoint_api_key

    client = openai.OpenAI(base_url=base_url, api_key=endpoint_api_key() or "unused", timeout=120, max_retries=0)
    results, where = [], {}
    for name, tokens in PROMPT_TOKENS.items():
        for _ in range(warmups):
            first_token_seconds(client, model, prompt_of(tokens, tokenizer))
        before = histogram_totals(metrics_url, replicas()) if metrics_url else {}
        result = SizeResult(name, tokens)
        for _ in range(runs):
            result.ttft_s.append(first_token_seconds(client, model, prompt_of(tokens, tokenizer)))
        if metrics_url:
            time.sleep(2.5)  # Ray exports the engines' metrics every second
            where[name] = means_ms(before, histogram_totals(metrics_url, replicas()))
        results.append(result)
    return results, where


def ttft_table(rows: dict[str, list[SizeResult]], pd_min_prompt_tokens: int = 0) -> str:
    """TTFT p50/p90 per mode and size, and P/D minus colocated when both were measured; with selective
    P/D (``pd_min_prompt_tokens``), which path each size's P/D requests took."""
    sizes = [r.name for r in next(iter(rows.values()))]
    header = ["mode"] + [
        f"{s} ({r.tokens} tok) p50 / p90 ms" for s, r in zip(sizes, next(iter(rows.values())), strict=False)
    ]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for mode, results in rows.items():
        lines.append(
            "| "
            + " | ".join([mode] + [f"{r.percentile(50) * 1e3:.0f} / {r.percentile(90) * 1e3:.0f}" for r in results])
            + " |"
        )
    if {"disaggregated", "colocated"} <= set(rows):
        gaps = [
            f"{(pd.percentile(50) - co.percentile(50)) * 1e3:+.0f} / {(pd.percentile(90) - co.percentile(90)) * 1e3:+.0f}"
            for pd, co in zip(rows["disaggregated"], rows["colocated"], strict=False)
        ]
        lines.append("| " + " | ".join(["P/D − colocated"] + gaps) + " |")
    if pd_min_prompt_tokens and "disaggregated" in rows:
        paths = [
            f"decode alone (< {pd_min_prompt_tokens})" if r.tokens < pd_min_prompt_tokens else "prefill + KV transfer"
            for r in rows["disaggregated"]
        ]
        lines.append("| " + " | ".join(["P/D path"] + paths) + " |")
    return "\n".join(lines)


def where_it_goes(
    results: list[SizeResult], where: dict[str, dict[str, float]], mode: str
) -> dict[str, dict[str, float]]:
    """Mean ms per request, per size: each engine's own TTFT (from its arrival to its first token), the
    KV transfer inside decode's, and what is left of the client's TTFT outside the engines (Serve's
    hops, tokenizing, stream batching, HTTP)."""
    rows: dict[str, dict[str, float]] = {}
    for result in results:
        steps = where.get(result.name, {})
        client = statistics.mean(result.ttft_s) * 1e3
        if mode == "disaggregated":
            prefill, decode = steps.get("Prefill ttft", 0.0), steps.get("Decode ttft", 0.0)
            row = {
                "client TTFT": client,
                "prefill engine (queue + prefill)": prefill,
                "decode engine (KV pull + first step)": decode,
                "  of which NIXL transfer": steps.get("Decode nixl", 0.0),
                "outside the engines (hand-off, tokenizing, batching, HTTP)": client - prefill - decode,
            }
        else:
            engine = steps.get("LLMServer ttft", 0.0)
            row = {
                "client TTFT": client,
                "engine (queue + prefill)": engine,
                "outside the engine (tokenizing, batching, HTTP)": client - engine,
            }
        rows[result.name] = row
    return rows


def where_table(rows: dict[str, dict[str, float]]) -> str:
    sizes = list(rows)
    steps = list(next(iter(rows.values())))
    lines = ["| mean ms | " + " | ".join(sizes) + " |", "|" + "---|" * (len(sizes) + 1)]
    for step in steps:
        lines.append(f"| {step} | " + " | ".join(f"{rows[s][step]:.0f}" for s in sizes) + " |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = ArgumentParser(
        prog="python -m bench.ttft", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--url", required=True, help="OpenAI base URL of the server, e.g. http://127.0.0.1:8000/v1")
    parser.add_argument("--model", default="tiny-llama", help="served model name (default: tiny-llama)")
    parser.add_argument("--tokenizer", default=None, help="tokenizer path or id (default: byte-level, the tiny model)")
    parser.add_argument("--runs", type=int, default=10, help="measured requests per prompt size (default: 10)")
    parser.add_argument("--warmups", type=int, default=3, help="requests before measuring, not counted (default: 3)")
    args = parser.parse_args(argv)
    tokenizer = None
    if args.tokenizer:
        from transformers import AutoTokenizer

        tokenizer = AutoTokenizer.from_pretrained(args.tokenizer)
    results, _ = measure(args.url, args.model, tokenizer=tokenizer, warmups=args.warmups, runs=args.runs)
    print(ttft_table({"endpoint": results}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
