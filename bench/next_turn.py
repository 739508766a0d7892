"""A conversation's next turn against its cold first turn: time to first token, and what each
engine's prefix cache and the KV transfer did for it.

    python -m bench.next_turn --local                       # the local P/D server, then the colocated one
    python -m bench.next_turn --local --modes disaggregated --history-tokens 1500
    python -m bench.next_turn --url http://127.0.0.1:8000/v1   # any endpoint: TTFT only
    python -m bench.next_turn --local --two-replicas-of prefill  # the routers compared, HA shape

Each conversation starts with a history no earlier request shares a prefix with (its first turn is
cold), then sends its next turn the way a chat client or an agent does, once the first has finished:
the whole history, the model's reply and a short new message. The engines' counters (read from a
local server's metrics, settled before and after each request) say per request, for each phase:
prompt tokens computed, served from the engine's own prefix cache, and received over NIXL (decode);
prefix-cache queries and hits; NIXL transfers. The tiny local model's tokenizer is byte level, so a
character is a token. Results are printed, never asserted.

With --two-replicas-of PHASE, the local P/D server runs in the cluster's shape (make local HA=1)
with two replicas of that phase, once per request router (power_of_two, then prefix_affinity): a
next turn sent to the replica that saw its history hits that replica's cache; one sent to the
other replica computes (prefill) or pulls (decode) the whole prompt.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path

from cmdline import ArgumentParser

FILLER = "the quick brown fox jumps over the lazy dog and keeps running through the long grass "
NEW_MESSAGE = "\nUser: and what follows from that for the next step? "

# The engines' counters, with the prompt_tokens_by_source label where it has one.
COUNTERS = {
    "computed": ("ray_vllm_prompt_tokens_by_source_total", "local_compute"),
    "own cache": ("ray_vllm_prompt_tokens_by_source_total", "local_cache_hit"),
    "over NIXL": ("ray_vllm_prompt_tokens_by_source_total", "external_kv_transfer"),
    "cache queries": ("ray_vllm_prefix_cache_queries_total", ""),
    "cache hits": ("ray_vllm_prefix_cache_hits_total", ""),
    "NIXL transfers": ("ray_vllm_nixl_xfer_time_seconds_count", ""),
}


@dataclass
class Turns:
    """TTFTs and prompt lengths of the cold first turns and of the next turns."""

    first_s: list[float] = field(default_factory=list)
    next_s: list[float] = field(default_factory=list)
    first_tokens: list[int] = field(default_factory=list)
    next_tokens: list[int] = field(default_factory=list)
    # {turn: {phase: {counter: tokens (or count) per request}}}
    engines: dict[str, dict[str, dict[str, float]]] = field(default_factory=dict)


def history_of(tokens: int) -> str:
    """A history of ``tokens`` characters that no earlier request starts with."""
    text = f"System: {uuid.uuid4().hex}\nUser: " + FILLER * (tokens // len(FILLER) + 2)
    return text[:tokens]


def turn(client, model: str, prompt: str, max_tokens: int) -> tuple[float, str, int]:
    """(TTFT in seconds, the reply's text, the prompt's tokens as the server counted them)."""
    started = time.perf_counter()
    first, parts, prompt_tokens = None, [], 0
    stream = client.completions.create(
        model=model,
        prompt=prompt,
        max_tokens=max_tokens,
        temperature=0,
        stream=True,
        stream_options={"include_usage": True},
        extra_body={"ignore_eos": True},
    )
    for chunk in stream:
        if chunk.choices:
            if first is None:
                first = time.perf_counter() - started
            parts.append(chunk.choices[0].text or "")
        if chunk.usage:
            prompt_tokens = chunk.usage.prompt_tokens
    if first is None:
        raise RuntimeError("the stream ended without a token")
    return first, "".join(parts), prompt_tokens


def per_request(before: dict, after: dict, requests: int) -> dict[str, dict[str, float]]:
    """{phase: {counter: change per request}} between two snapshots of ``engine_counters``."""
    phases = sorted({deployment.split(":")[0] for deployment, _, _ in after})
    out: dict[str, dict[str, float]] = {}
    for phase in phases:
        row = {}
        for label, (metric, source) in COUNTERS.items():
            change = sum(
                v - before.get(key, 0.0)
                for key, v in after.items()
                if key[0].split(":")[0] == phase and key[1] == metric and key[2] == source
            )
            row[label] = change / requests
        out[phase] = row
    return out


def summed(pairs: list[tuple[dict, dict]]) -> dict[str, dict[str, float]]:
    """Mean of :func:`per_request` over (before, after) snapshots, one pair per request."""
    rows = [per_request(before, after, 1) for before, after in pairs]
    return {
        phase: {c: sum(r.get(phase, {}).get(c, 0.0) for r in rows) / len(rows) for c in COUNTERS}
        for phase in sorted({p for r in rows for p in r})
    }


def converse(
    base_url: str,
    model: str,
    *,
    conversations: int,
    history_tokens: int,
    reply_tokens: int,
    warmups: int,
    counters=None,
) -> Turns:
    """Runs the conversations; ``counters`` (a settled snapshot function) adds the engines' view."""
    import openai

    from bench.run import endpoint_api_key

    client = openai.OpenAI(base_url=base_url, api_key=endpoint_api_key() or "unused", timeout=120, max_retries=0)
    for _ in range(warmups):
        _, reply, _ = turn(client, model, history := history_of(history_tokens), reply_tokens)
        turn(client, model, history + reply + NEW_MESSAGE, reply_tokens)
    result = Turns()
    changes: dict[str, list[tuple[dict, dict]]] = {"first turn": [], "next turn": []}
    for _ in range(conversations):
        # A conversation's turns follow each other, so a slow moment of a shared machine falls on both alike.
        history = history_of(history_tokens)
        before = counters() if counters else {}
        seconds, reply, tokens = turn(client, model, history, reply_tokens)
        between = counters() if counters else {}
        result.first_s.append(seconds)
        result.first_tokens.append(tokens)
        seconds, _, tokens = turn(client, model, history + reply + NEW_MESSAGE, reply_tokens)
        result.next_s.append(seconds)
        result.next_tokens.append(tokens)
        if counters:
            changes["first turn"].append((before, between))
            changes["next turn"].append((between, counters()))
    if counters:
        result.engines = {which: summed(pairs) for which, pairs in changes.items()}
    return result


def report(runs: dict[str, Turns]) -> str:
    lines = [
        "| server | first turn TTFT p50 ms | next turn TTFT p50 ms | next / first | prompt tokens first, next |",
        "|---|---|---|---|---|",
    ]
    for name, t in runs.items():
        first, nxt = statistics.median(t.first_s) * 1e3, statistics.median(t.next_s) * 1e3
        lines.append(
            f"| {name} | {first:.1f} | {nxt:.1f} | {nxt / first:.2f}x | "
            f"{statistics.median(t.first_tokens):.0f}, {statistics.median(t.next_tokens):.0f} |"
        )
    for name, t in runs.items():
        if not t.engines:
            continue
        new_tokens = statistics.median(t.next_tokens) - statistics.median(t.first_tokens)
        lines += [
            "",
            f"{name}: per request, from the engines' counters (the next turn adds {new_tokens:.0f} tokens "
            "to what its first turn sent, the reply included)",
            "",
            "| turn | engine | " + " | ".join(COUNTERS) + " | hit rate |",
            "|---|---|" + "---|" * (len(COUNTERS) + 1),
        ]
        for which, phases in t.engines.items():
            for phase, row in phases.items():
                queries = row["cache queries"]
                rate = f"{row['cache hits'] / queries:.0%}" if queries else "-"
                values = " | ".join(f"{row[c]:.1f}" if c == "NIXL transfers" else f"{row[c]:.0f}" for c in COUNTERS)
                lines.append(f"| {which} | {phase} | {values} | {rate} |")
    return "\n".join(lines)


def two_replica_spec(base: Path, phase: str, router: str, folder: Path) -> Path:
    """``base`` with two replicas of ``phase`` behind ``router``, written into ``folder``."""
    import yaml

    from local.paths import DEFAULT_SPEC
    from serve_app.spec import load_spec

    data = load_spec(str(base or DEFAULT_SPEC)).model_dump(mode="json")
    data["mode"] = "disaggregated"
    data[phase].update(min_replicas=2, max_replicas=2, request_router=router)
    path = folder / f"{phase}-x2-{router}.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


def counters_of(server):
    """A settled snapshot of every engine's counters: in the cluster's shape each node exports its own."""
    from local.metrics import engine_counters, scrape, settled

    urls = list(server.status.get("cluster", {}).get("metrics_urls", {}).values()) or [server.status["metrics_url"]]

    def snapshot() -> dict:
        return engine_counters([sample for url in urls for sample in scrape(url)], server.replicas())

    return lambda: settled(snapshot, 1.5, 30)


def run_local(mode: str, spec: Path | None, ha: bool, **kwargs) -> Turns:
    from local.harness import LocalServer

    server = LocalServer(
        mode=mode, spec=spec, extra_args=["--gcs-fault-tolerance"] if ha else [], port=8000, metrics_port=8085
    ).start()
    try:
        return converse(server.base_url, server.status["model"], counters=counters_of(server), **kwargs)
    finally:
        server.stop()


def main(argv: list[str] | None = None) -> int:
    parser = ArgumentParser(
        prog="python -m bench.next_turn", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    target = parser.add_mutually_exclusive_group(required=True)
    target.add_argument("--url", help="OpenAI base URL of a running server (TTFT only)")
    target.add_argument("--local", action="store_true", help="start the local servers of --modes in turn")
    parser.add_argument(
        "--modes",
        nargs="+",
        choices=["disaggregated", "colocated"],
        default=["disaggregated", "colocated"],
        help="local servers to measure, in this order (default: both)",
    )
    parser.add_argument("--spec", default=None, help="serving spec of the local servers (default config/local.yaml)")
    parser.add_argument("--ha", action="store_true", help="the local server in the cluster's shape (make local HA=1)")
    parser.add_argument(
        "--two-replicas-of",
        choices=["prefill", "decode"],
        default=None,
        help="with --local: P/D in the cluster's shape with two replicas of this phase, once per request router",
    )
    parser.add_argument("--model", default="tiny-llama", help="served model name with --url (default: tiny-llama)")
    parser.add_argument("--conversations", type=int, default=7, help="measured conversations (default: 7)")
    parser.add_argument("--history-tokens", type=int, default=1500, help="first turn's prompt (default: 1500)")
    parser.add_argument("--reply-tokens", type=int, default=16, help="tokens each turn generates (default: 16)")
    parser.add_argument("--warmups", type=int, default=2, help="conversations before measuring (default: 2)")
    args = parser.parse_args(argv)
    shape = dict(
        conversations=args.conversations,
        history_tokens=args.history_tokens,
        reply_tokens=args.reply_tokens,
        warmups=args.warmups,
    )
    if args.two_replicas_of and not args.local:
        parser.error("--two-replicas-of starts local servers: add --local")
    if args.url:
        runs = {"endpoint": converse(args.url, args.model, **shape)}
    elif args.two_replicas_of:
        import tempfile

        from serve_app.spec import REQUEST_ROUTER_CLASSES

        phase = args.two_replicas_of
        with tempfile.TemporaryDirectory() as folder:
            runs = {
                f"{phase} x2, {router}": run_local(
                    "disaggregated", two_replica_spec(args.spec, phase, router, Path(folder)), True, **shape
                )
                for router in REQUEST_ROUTER_CLASSES
            }
    else:
        spec = Path(args.spec) if args.spec else None
        runs = {mode: run_local(mode, spec, args.ha, **shape) for mode in args.modes}
    print(report(runs))
    return 0


if __name__ == "__main__":
    sys.exit(main())
