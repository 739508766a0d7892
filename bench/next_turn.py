"""A conversation's next turn against its cold first turn: time to first token, and what each
engine's prefix cache and the KV transfer did for it.

    python -m bench.next_turn --local                       # the local P/D server, then the colocated one
    python -m bench.next_turn --local --modes disaggregated --history-tokens 1500
    python -m bench.next_turn --url http://127.0.0.1:8000/v1   # any endpoint: TTFT only
    python -m bench.next_turn --local --two-replicas-of prefill  # the routers compared, HA shape
    python -m bench.next_turn --local --two-replicas-of prefill --conversations 32 --concurrency 4

Each conversation starts with a history no earlier request shares a prefix with (its first turn is
cold), then sends its next turn the way a chat client or an agent does, once the first has finished:
the whole history, the model's reply and a short new message (--turns: more turns, each resending
the one before; --concurrency: that many conversations at a time, each turn of them sent
together). The engines' counters (read from a local server's metrics, settled between turns) say
per request, for each phase:
prompt tokens computed, served from the engine's own prefix cache, and received over NIXL (decode);
prefix-cache queries and hits; NIXL transfers. The tiny local model's tokenizer is byte level, so a
character is a token. Results are printed, never asserted.

With --two-replicas-of PHASE, the local P/D server runs in the cluster's shape (make local HA=1)
with two replicas of that phase, once per request router (power_of_two, prefix_affinity, then
session_affinity; every conversation sends its own x-session-id): a next turn sent to the replica
that saw its history hits that replica's cache; one sent to the other replica computes (prefill) or
pulls (decode) the whole prompt.
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


@dataclass(frozen=True)
class Request:
    """One streamed completion as the client saw it (seconds, from ``time.perf_counter``)."""

    turn: int  # 0 for a conversation's first turn
    start_s: float
    ttft_s: float
    latency_s: float
    itl_s: list[float]
    prompt_tokens: int
    output_tokens: int
    text: str


@dataclass
class Turns:
    """Every request of the conversations, and what the engines' counters said per turn."""

    requests: list[Request] = field(default_factory=list)
    # {turn: {phase: {counter: tokens (or count) per request}}}
    engines: dict[str, dict[str, dict[str, float]]] = field(default_factory=dict)

    @property
    def turns(self) -> int:
        return 1 + max((r.turn for r in self.requests), default=-1)

    def of_turn(self, index: int) -> list[Request]:
        return [r for r in self.requests if r.turn == index]

    def median_ttft_ms(self) -> list[float]:
        """Median TTFT of each turn index, first turn first."""
        return [statistics.median(r.ttft_s for r in self.of_turn(i)) * 1e3 for i in range(self.turns)]

    def median_prompt_tokens(self) -> list[float]:
        return [statistics.median(r.prompt_tokens for r in self.of_turn(i)) for i in range(self.turns)]

    @property
    def duration_s(self) -> float:
        if not self.requests:
            return 0.0
        return max(r.start_s + r.latency_s for r in self.requests) - min(r.start_s for r in self.requests)


def turn_name(index: int) -> str:
    return f"turn {index + 1}"


def history_of(tokens: int) -> str:
    """A history of ``tokens`` characters that no earlier request starts with."""
    text = f"System: {uuid.uuid4().hex}\nUser: " + FILLER * (tokens // len(FILLER) + 2)
    return text[:tokens]


def text_of(tokens: int, tokenizer=None) -> str:
    """``tokens`` tokens no earlier request starts with: characters for the byte-level tiny model."""
    if tokenizer is None:
        return history_of(tokens)
    from bench.ttft import prompt_of

    return prompt_of(tokens, tokenizer)


def turn(client, model: str, prompt: str, max_tokens: int, index: int = 0, session: str | None = None) -> Request:
    """One streamed turn; ``session`` is the conversation's id, sent as a chat client would (the header
    session_affinity routes by)."""
    from serve_app.spec import SESSION_HEADER

    started = time.perf_counter()
    arrivals, parts, prompt_tokens, output_tokens = [], [], 0, 0
    stream = client.completions.create(
        model=model,
        prompt=prompt,
        max_tokens=max_tokens,
        temperature=0,
        stream=True,
        stream_options={"include_usage": True},
        extra_body={"ignore_eos": True},
        extra_headers={SESSION_HEADER: session} if session else None,
    )
    for chunk in stream:
        if chunk.choices:
            arrivals.append(time.perf_counter() - started)
            parts.append(chunk.choices[0].text or "")
        if chunk.usage:
            prompt_tokens, output_tokens = chunk.usage.prompt_tokens, chunk.usage.completion_tokens
    if not arrivals:
        raise RuntimeError("the stream ended without a token")
    return Request(
        turn=index,
        start_s=started,
        ttft_s=arrivals[0],
        latency_s=time.perf_counter() - started,
        itl_s=[b - a for a, b in zip(arrivals, arrivals[1:], strict=False)],
        prompt_tokens=prompt_tokens,
        output_tokens=output_tokens,
        text="".join(parts),
    )


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


def summed(changes: list[tuple[dict, dict, int]]) -> dict[str, dict[str, float]]:
    """Per request, over (before, after, requests between them) snapshots of ``engine_counters``."""
    requests = sum(n for _, _, n in changes)
    rows = [per_request(before, after, 1) for before, after, _ in changes]
    return {
        phase: {c: sum(r.get(phase, {}).get(c, 0.0) for r in rows) / requests for c in COUNTERS}
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
    turns: int = 2,
    concurrency: int = 1,
    system_tokens: int = 0,
    message_tokens: int = 0,
    tokenizer=None,
    counters=None,
) -> Turns:
    """Runs the conversations, ``concurrency`` at a time; ``counters`` (a settled snapshot function)
    adds the engines' view of each turn.

    Every conversation starts with the same ``system_tokens`` (a system prompt), then a task no
    other shares (``history_tokens``); each later turn resends all of it with the model's reply and
    a new message (``message_tokens``, or a short question). The conversations of a group send
    each turn together, once all of them have their previous reply, so the counters read between
    two turns belong to one turn index.
    """
    from concurrent.futures import ThreadPoolExecutor

    import openai

    from bench.run import endpoint_api_key

    client = openai.OpenAI(base_url=base_url, api_key=endpoint_api_key() or "unused", timeout=300, max_retries=0)
    system = text_of(system_tokens, tokenizer) + "\n" if system_tokens else ""

    def message() -> str:
        return "\nUser: " + text_of(message_tokens, tokenizer) if message_tokens else NEW_MESSAGE

    def group(size: int, result: Turns | None, changes: dict) -> None:
        prompts = [system + text_of(history_tokens, tokenizer) for _ in range(size)]
        sessions = [uuid.uuid4().hex for _ in range(size)]
        before = counters() if counters and result is not None else {}
        with ThreadPoolExecutor(max_workers=size) as pool:
            for index in range(turns):
                done = list(
                    pool.map(lambda p, s, i=index: turn(client, model, p, reply_tokens, i, s), prompts, sessions)
                )
                if result is not None:
                    result.requests += done
                    if counters:
                        after = counters()
                        changes.setdefault(turn_name(index), []).append((before, after, size))
                        before = after
                prompts = [p + r.text + message() for p, r in zip(prompts, done, strict=True)]

    for _ in range(warmups):
        group(1, None, {})
    result = Turns()
    changes: dict[str, list[tuple[dict, dict, int]]] = {}
    for first in range(0, conversations, concurrency):
        group(min(concurrency, conversations - first), result, changes)
    if counters:
        result.engines = {which: summed(pairs) for which, pairs in changes.items()}
    return result


def vllm_result(turns: Turns, *, slo_ms: dict[str, float], percentiles) -> dict:
    """The requests' figures as `vllm bench serve` computes and names them (its calculate_metrics)."""
    from vllm.benchmarks.datasets import SampleRequest
    from vllm.benchmarks.lib.endpoint_request_func import RequestFuncOutput
    from vllm.benchmarks.serve import calculate_metrics

    outputs = [
        RequestFuncOutput(
            generated_text=r.text,
            success=True,
            latency=r.latency_s,
            output_tokens=r.output_tokens,
            ttft=r.ttft_s,
            itl=r.itl_s,
            prompt_len=r.prompt_tokens,
            start_time=r.start_s,
        )
        for r in turns.requests
    ]
    inputs = [SampleRequest(prompt="", prompt_len=r.prompt_tokens) for r in turns.requests]
    metrics, _ = calculate_metrics(inputs, outputs, turns.duration_s, None, list(percentiles), slo_ms)
    result = {
        "duration": turns.duration_s,
        "completed": metrics.completed,
        "failed": metrics.failed,
        "request_throughput": metrics.request_throughput,
        "request_goodput": metrics.request_goodput,
        "output_throughput": metrics.output_throughput,
        "ttft_by_turn_ms": turns.median_ttft_ms(),
        "prompt_tokens_by_turn": turns.median_prompt_tokens(),
    }
    for metric in ("ttft", "tpot", "itl", "e2el"):
        for statistic in ("mean", "median", "std"):
            result[f"{statistic}_{metric}_ms"] = getattr(metrics, f"{statistic}_{metric}_ms")
        for p, value in getattr(metrics, f"percentiles_{metric}_ms"):
            result[f"p{int(p) if int(p) == p else p}_{metric}_ms"] = value
    return result


def report(runs: dict[str, Turns]) -> str:
    turns = max(t.turns for t in runs.values())
    lines = [
        "| server | "
        + " | ".join(f"{turn_name(i)} TTFT p50 ms" for i in range(turns))
        + f" | {turn_name(turns - 1)} / {turn_name(0)} | prompt tokens per turn |",
        "|---|" + "---|" * (turns + 2),
    ]
    for name, t in runs.items():
        ttft = t.median_ttft_ms()
        lines.append(
            f"| {name} | "
            + " | ".join(f"{ms:.1f}" for ms in ttft)
            + f" | {ttft[-1] / ttft[0]:.2f}x | "
            + ", ".join(f"{n:.0f}" for n in t.median_prompt_tokens())
            + " |"
        )
    for name, t in runs.items():
        if not t.engines:
            continue
        lines += [
            "",
            f"{name}: per request, from the engines' counters (each turn resends the one before, its reply "
            "and a new message)",
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


# The request timeout of the two-replica servers (seconds): the client's own.
BENCH_REQUEST_TIMEOUT_S = 300


def two_replica_spec(base: Path, phase: str, router: str, folder: Path) -> Path:
    """``base`` with two replicas of ``phase`` behind ``router``, written into ``folder``."""
    import yaml

    from local.paths import DEFAULT_SPEC
    from serve_app.spec import load_spec

    data = load_spec(str(base or DEFAULT_SPEC)).model_dump(mode="json")
    data["mode"] = "disaggregated"
    data[phase].update(min_replicas=2, max_replicas=2, request_router=router)
    # Three engines share the machine's cores: a turn queued behind the others' may take longer than
    # the local spec's timeout, which is there to catch a hung test, not to cut a measurement short.
    data["request_timeout_s"] = max(data["request_timeout_s"], BENCH_REQUEST_TIMEOUT_S)
    path = folder / f"{phase}-x2-{router}.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


def run_local(mode: str, spec: Path | None, ha: bool, **kwargs) -> Turns:
    from local.harness import LocalServer

    server = LocalServer(
        mode=mode, spec=spec, extra_args=["--gcs-fault-tolerance"] if ha else [], port=8000, metrics_port=8085
    ).start()
    try:
        return converse(server.base_url, server.status["model"], counters=server.counters, **kwargs)
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
    parser.add_argument(
        "--routers",
        nargs="+",
        default=None,
        help="with --two-replicas-of: the request routers to compare, in this order (default: every one)",
    )
    parser.add_argument("--model", default="tiny-llama", help="served model name with --url (default: tiny-llama)")
    parser.add_argument("--conversations", type=int, default=7, help="measured conversations (default: 7)")
    parser.add_argument("--history-tokens", type=int, default=1500, help="first turn's prompt (default: 1500)")
    parser.add_argument("--reply-tokens", type=int, default=16, help="tokens each turn generates (default: 16)")
    parser.add_argument("--warmups", type=int, default=2, help="conversations before measuring (default: 2)")
    parser.add_argument("--turns", type=int, default=2, help="turns of each conversation (default: 2)")
    parser.add_argument(
        "--concurrency", type=int, default=1, help="conversations in flight, each turn sent together (default: 1)"
    )
    parser.add_argument(
        "--system-tokens", type=int, default=0, help="a system prompt every conversation starts with (default: none)"
    )
    parser.add_argument(
        "--message-tokens",
        type=int,
        default=0,
        help=f"each later turn's new message (default: a short question of {len(NEW_MESSAGE)})",
    )
    args = parser.parse_args(argv)
    for name in ("conversations", "turns", "concurrency"):
        if getattr(args, name) < 1:
            parser.error(f"--{name} must be at least 1")
    shape = dict(
        conversations=args.conversations,
        history_tokens=args.history_tokens,
        reply_tokens=args.reply_tokens,
        warmups=args.warmups,
        turns=args.turns,
        concurrency=args.concurrency,
        system_tokens=args.system_tokens,
        message_tokens=args.message_tokens,
    )
    if args.two_replicas_of and not args.local:
        parser.error("--two-replicas-of starts local servers: add --local")
    from serve_app.spec import REQUEST_ROUTER_CLASSES

    routers = args.routers or list(REQUEST_ROUTER_CLASSES)
    if args.routers and not args.two_replicas_of:
        parser.error("--routers compares routers of two replicas: add --two-replicas-of PHASE")
    if unknown := [r for r in routers if r not in REQUEST_ROUTER_CLASSES]:
        parser.error(f"--routers: {', '.join(unknown)} unknown; choose from {', '.join(REQUEST_ROUTER_CLASSES)}")
    if args.url:
        runs = {"endpoint": converse(args.url, args.model, **shape)}
    elif args.two_replicas_of:
        import tempfile

        phase = args.two_replicas_of
        with tempfile.TemporaryDirectory() as folder:
            runs = {
                f"{phase} x2, {router}": run_local(
                    "disaggregated", two_replica_spec(args.spec, phase, router, Path(folder)), True, **shape
                )
                for router in routers
            }
    else:
        spec = Path(args.spec) if args.spec else None
        runs = {mode: run_local(mode, spec, args.ha, **shape) for mode in args.modes}
    print(report(runs))
    return 0


if __name__ == "__main__":
    sys.exit(main())
