"""What an agent's first turn (a short message, long tool schemas) costs the streams decode runs: their
inter-token latency while such turns arrive, on the local P/D server or any endpoint.

    python -m bench.agent_tools --local                          # start the local P/D server, measure, stop it
    python -m bench.agent_tools --url http://127.0.0.1:8000/v1   # a server already running
    python -m bench.agent_tools --local --streams 3 --agents 12 --tools 1

--streams chat streams (a short prompt each, --stream-tokens tokens, the end of text ignored) run
from start to end; once they run, --agents first turns are sent one after another: "hi" with
--tools function schemas of the agent's own (no two agents share a prefix), which the chat
template renders into the prompt (Qwen2.5's, and the local model's, into the system turn).
Selective P/D decides on that rendered prompt: long, it goes to prefill; counted without its tools,
it would be taken for short and prefilled inside decode's batch, stalling every stream there for the
length of that prefill.

Reported: the streams' ITL (p50, p95, p99, max) while the agents' turns arrived, the agents' TTFT
p50, and with --local the prompt tokens each phase computed over that window (vLLM's counters): who
prefilled the agents' prompts. Results are printed, never asserted.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import threading
import time
import uuid
from dataclasses import dataclass, field

from cmdline import ArgumentParser

STREAM_PROMPT = "Tell me a long story about a lighthouse keeper."
AGENT_MESSAGE = "hi"
# Tools per agent turn: two render to about 1,470 tokens for the local model (its context: 2,048).
DEFAULT_TOOLS = 2
COMPUTED = ("ray_vllm_prompt_tokens_by_source_total", "local_compute")
FINISHED = ("ray_vllm_request_success_total", "")


def tool_schemas(count: int, agent: str = "") -> list[dict]:
    """``count`` function tools of the size an agent's tools have (about 700 characters of JSON each,
    as many tokens for the local byte-level model: two fit its 2,048-token context with room), named
    for ``agent``: agents with tools of their own share no prefix a cache could serve."""
    fields = ("customer", "order_id", "since", "until", "status", "store", "currency", "limit")
    return [
        {
            "type": "function",
            "function": {
                "name": f"{agent}tool_{index}_lookup",
                "description": f"Tool {index}: look a record up by the fields below and return it as JSON.",
                "parameters": {
                    "type": "object",
                    "properties": {name: {"type": "string", "description": f"the {name}"} for name in fields},
                    "required": list(fields[:2]),
                },
            },
        }
        for index in range(count)
    ]


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q / 100 * (len(ordered) - 1)))] if ordered else float("nan")


@dataclass
class Window:
    """Chunk arrival gaps of the streams, and the agents' TTFTs (seconds)."""

    gaps: list[tuple[float, float]] = field(default_factory=list)  # (arrival, gap)
    agent_ttfts: list[float] = field(default_factory=list)
    start: float = 0.0
    end: float = 0.0

    def itl_ms(self) -> list[float]:
        return [gap * 1e3 for at, gap in self.gaps if self.start <= at <= self.end]


def measure(base_url: str, model: str, *, streams: int, stream_tokens: int, agents: int, tools: int) -> Window:
    import openai

    from bench.run import endpoint_api_key

    client = openai.OpenAI(base_url=base_url, api_key=endpoint_api_key() or "unused", timeout=300, max_retries=0)
    window, lock, stop = Window(), threading.Lock(), threading.Event()

    def stream() -> None:
        while not stop.is_set():
            last = None
            chunks = client.chat.completions.create(
                model=model,
                messages=[{"role": "user", "content": STREAM_PROMPT}],
                max_tokens=stream_tokens,
                temperature=0,
                stream=True,
                extra_body={"ignore_eos": True},
            )
            for chunk in chunks:
                if not chunk.choices or not chunk.choices[0].delta.content:
                    continue
                now = time.perf_counter()
                if last is not None:
                    with lock:
                        window.gaps.append((now, now - last))
                last = now

    threads = [threading.Thread(target=stream, daemon=True) for _ in range(streams)]
    for thread in threads:
        thread.start()
    time.sleep(2.0)  # the streams are running before the first agent's turn
    window.start = time.perf_counter()
    for _ in range(agents):
        sent, first = time.perf_counter(), None
        for chunk in client.chat.completions.create(
            model=model,
            messages=[{"role": "user", "content": AGENT_MESSAGE}],
            tools=tool_schemas(tools, f"a{uuid.uuid4().hex[:12]}_"),
            max_tokens=4,
            temperature=0,
            stream=True,
        ):
            # The first chunk that carries the model's output (a tool parser may hold text back and
            # send it with the last chunk, which then marks the first token).
            choice = chunk.choices[0] if chunk.choices else None
            if first is None and choice and (choice.delta.content or choice.delta.tool_calls or choice.finish_reason):
                first = time.perf_counter() - sent
        if first is not None:
            window.agent_ttfts.append(first)
        time.sleep(0.2)
    window.end = time.perf_counter()
    stop.set()
    for thread in threads:
        thread.join(timeout=300)
    return window


def phase_totals(before: dict, after: dict) -> dict[str, dict[str, float]]:
    """{phase: {"computed": prompt tokens computed, "requests": finished}} between two snapshots."""
    totals: dict[str, dict[str, float]] = {}
    for key, value in after.items():
        deployment, metric, source = key
        for label, wanted in (("computed", COMPUTED), ("requests", FINISHED)):
            if (metric, source) == wanted:
                row = totals.setdefault(deployment.split(":")[0], {"computed": 0.0, "requests": 0.0})
                row[label] += value - before.get(key, 0.0)
    return totals


def report(window: Window, totals: dict | None, agents: int) -> str:
    itl = window.itl_ms()
    ttft = [t * 1e3 for t in window.agent_ttfts]
    lines = [
        f"streams' ITL while {agents} agent turns arrived ({len(itl)} gaps): "
        f"p50 {percentile(itl, 50):.1f} ms, p95 {percentile(itl, 95):.1f} ms, p99 {percentile(itl, 99):.1f} ms, "
        f"max {max(itl, default=float('nan')):.1f} ms",
        f"agents' TTFT p50 {statistics.median(ttft) if ttft else float('nan'):.1f} ms",
    ]
    for phase, row in sorted((totals or {}).items()):
        lines.append(f"{phase}: {row['requests']:.0f} requests finished, {row['computed']:.0f} prompt tokens computed")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = ArgumentParser(
        prog="python -m bench.agent_tools", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    target = parser.add_mutually_exclusive_group(required=True)
    target.add_argument("--url", help="OpenAI base URL of a running server")
    target.add_argument("--local", action="store_true", help="start the local P/D server, then stop it")
    parser.add_argument("--model", default="tiny-llama", help="served model name with --url (default: tiny-llama)")
    parser.add_argument("--streams", type=int, default=2, help="streams running throughout (default: 2)")
    parser.add_argument("--stream-tokens", type=int, default=256, help="tokens of each stream (default: 256)")
    parser.add_argument("--agents", type=int, default=10, help="agent first turns, one after another (default: 10)")
    parser.add_argument(
        "--tools", type=int, default=DEFAULT_TOOLS, help=f"tool schemas of each agent turn (default: {DEFAULT_TOOLS})"
    )
    args = parser.parse_args(argv)
    for name in ("streams", "stream_tokens", "agents", "tools"):
        if getattr(args, name) < 1:
            parser.error(f"--{name.replace('_', '-')} must be at least 1")
    shape = dict(streams=args.streams, stream_tokens=args.stream_tokens, agents=args.agents, tools=args.tools)
    if args.url:
        print(report(measure(args.url, args.model, **shape), None, args.agents))
        return 0
    from local.harness import LocalServer

    server = LocalServer(mode="disaggregated", port=8000, metrics_port=8085).start()
    try:
        before = server.counters()
        window = measure(server.base_url, server.status["model"], **shape)
        totals = phase_totals(before, server.counters())
    finally:
        server.stop()
    print(report(window, totals, args.agents))
    return 0


if __name__ == "__main__":
    sys.exit(main())
