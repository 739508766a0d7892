"""`make bench`: one workload against one OpenAI-compatible endpoint, swept over concurrency.

    python -m bench.run --url http://127.0.0.1:8000/v1 --workload chat [--model M] [--tokenizer T]

The load generator is vLLM's `bench serve` (called in-process through its own argument parser):
it is maintained with the engine we serve, reports TTFT, TPOT and ITL percentiles and goodput
under an SLO, and needs nothing beyond the serving stack. Results land in a dated folder as the
raw JSON of each run, a Markdown table and PNG plots. What vLLM's generator prints, and what
libraries print as the interpreter exits, goes to ``bench.log`` there: the terminal ends with the
report and where it was written.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import math
import os
import sys
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager, nullcontext
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from cmdline import ArgumentParser
from local.metrics import PREFIX_CACHE_QUERIES
from planner.simulate import LATENCY_METRICS, REPORTED_PERCENTILES, statistic_names

ROOT = Path(__file__).resolve().parent.parent
WORKLOADS_FILE = Path(__file__).resolve().parent / "workloads.yaml"
RESULTS_DIR = ROOT / "results"
# In the results folder: the output of the libraries a run calls (see output_to).
THIRD_PARTY_LOG = "bench.log"
# vLLM's result has each metric's mean and median besides these; the advisor (planner/simulate.py)
# predicts the same statistics under the same names.
PERCENTILES = REPORTED_PERCENTILES


class Slo(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
    ttft_ms: float = Field(gt=0, description="Time to first token a request must meet.")
    tpot_ms: float = Field(gt=0, description="Time per output token a request must meet.")


class Workload(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
    name: str = Field(description="Preset name.")
    description: str = Field(description="What traffic this stands for.")
    input_len: int = Field(ge=1, description="Mean prompt length in tokens, after the shared prefix.")
    prefix_len: int = Field(
        default=0,
        ge=0,
        description=(
            "Tokens of one context every prompt of the run starts with (vLLM's --random-prefix-len): a system "
            "prompt and documents that many questions share, which each engine's prefix cache can reuse."
        ),
    )
    output_len: int = Field(ge=1, description="Mean output length in tokens.")
    range_ratio: float = Field(ge=0, lt=1, description="Uniform spread of both lengths (±ratio).")
    num_prompts: int = Field(ge=1, description="Requests per concurrency level; conversations, with turns.")
    concurrency: list[int] = Field(min_length=1, description="Concurrency levels to sweep.")
    slo: Slo = Field(description="The SLO that defines goodput.")
    turns: int = Field(
        default=1,
        ge=1,
        description=(
            "Turns of each conversation. Above 1, every later turn resends the whole history with the model's "
            "reply and a new message of followup_len tokens (bench/next_turn.py drives it: vLLM's bench serve "
            "sends no reply back); prefix_len is then the system prompt all conversations share and input_len "
            "each conversation's own task."
        ),
    )
    followup_len: int = Field(default=0, ge=0, description="Tokens of each later turn's new message.")

    @model_validator(mode="after")
    def _turns_and_their_messages_go_together(self) -> Workload:
        if self.turns > 1 and self.followup_len == 0:
            raise ValueError(f"{self.name}: turns is {self.turns} but followup_len is 0: set followup_len")
        if self.turns == 1 and self.followup_len:
            raise ValueError(f"{self.name}: followup_len is set but turns is 1: set turns above 1 or drop followup_len")
        if self.turns > 1 and self.range_ratio:
            raise ValueError(
                f"{self.name}: range_ratio is {self.range_ratio} but conversations (turns > 1) have fixed lengths: "
                "set range_ratio: 0"
            )
        return self

    def longest_request_tokens(self) -> int:
        """The most tokens one request holds, its prompt and its reply: what a server's max_model_len
        must fit. A conversation's last turn carries the system prompt and its newline, the task, and
        per earlier turn the reply, the new message and its framing (characters are tokens in the
        driver's messages, bench/next_turn.py)."""
        if self.turns == 1:
            spread = 1 + self.range_ratio
            return self.prefix_len + math.ceil(self.input_len * spread) + math.ceil(self.output_len * spread)
        from bench.next_turn import NEW_MESSAGE

        framing = NEW_MESSAGE.index(":") + 2
        history = self.prefix_len + 1 + self.input_len
        return history + (self.turns - 1) * (self.output_len + framing + self.followup_len) + self.output_len

    @property
    def repeated(self) -> bool:
        """Whether its requests repeat earlier input, for each engine's prefix cache to serve."""
        return self.turns > 1 or self.prefix_len > 0


def load_workloads(path: Path = WORKLOADS_FILE) -> dict[str, Workload]:
    workloads = {}
    for name, body in yaml.safe_load(path.read_text()).items():
        try:
            workloads[name] = Workload(name=name, **body)
        except ValidationError as error:
            first = error.errors()[0]
            field = ".".join(str(part) for part in (name, *first["loc"]))
            raise SystemExit(f"{path.name}: {field}: {first['msg']}") from None
    return workloads


def workload_named(name: str) -> Workload:
    workloads = load_workloads()
    if name not in workloads:
        raise SystemExit(f"unknown workload {name!r}; use one of {', '.join(workloads)} (bench/workloads.yaml)")
    return workloads[name]


def server_root(url: str) -> str:
    """vLLM's generator wants the server root and the endpoint path separately."""
    url = url.rstrip("/")
    return url[: -len("/v1")] if url.endswith("/v1") else url


def bench_args(
    *, url: str, model: str, tokenizer: str, workload: Workload, concurrency: int, out_dir: Path, label: str
) -> list[str]:
    slo = workload.slo
    return [
        "--backend",
        "openai",
        "--base-url",
        server_root(url),
        "--endpoint",
        "/v1/completions",
        "--model",
        model,
        "--tokenizer",
        tokenizer,
        "--dataset-name",
        "random",
        "--random-input-len",
        str(workload.input_len),
        "--random-output-len",
        str(workload.output_len),
        "--random-range-ratio",
        str(workload.range_ratio),
        "--random-prefix-len",
        str(workload.prefix_len),
        "--num-prompts",
        str(workload.num_prompts),
        "--max-concurrency",
        str(concurrency),
        "--request-rate",
        "inf",
        "--ignore-eos",
        "--percentile-metrics",
        "ttft,tpot,itl,e2el",
        "--metric-percentiles",
        ",".join(str(p) for p in PERCENTILES),
        "--goodput",
        f"ttft:{slo.ttft_ms}",
        f"tpot:{slo.tpot_ms}",
        "--label",
        label,
        "--save-result",
        "--result-dir",
        str(out_dir),
        "--result-filename",
        f"{label}-{workload.name}-c{concurrency}.json",
        "--disable-tqdm",
        # The prompts of vLLM's random dataset follow from the seed alone. One seed for every level
        # would send each level the prompts of the one before, which the server's prefix cache then
        # serves: every level after the first would measure cache hits, not prefills. A level's own
        # seed gives both deployments of a comparison the same prompts at that level.
        "--seed",
        str(concurrency),
    ]


# The endpoint's API key, when it asks for one: the Makefile's API_KEY, from the environment.
API_KEY_ENV = "API_KEY"


def endpoint_api_key() -> str | None:
    return os.environ.get(API_KEY_ENV, "").strip() or None


def run_one(args: list[str]) -> dict:
    from vllm.benchmarks.serve import add_cli_args, main
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    key = endpoint_api_key()
    if key:
        # vLLM's benchmark sends OPENAI_API_KEY as the Bearer key (benchmarks/lib/endpoint_request_func.py).
        os.environ["OPENAI_API_KEY"] = key

    parser = FlexibleArgumentParser()
    add_cli_args(parser)
    return main(parser.parse_args(args))


def _redirect(log: Path) -> tuple[int, int]:
    """Points this process's stdout and stderr (the file descriptors: C code and child processes
    write there too) at ``log``; returns the descriptors they had."""
    for stream in (sys.stdout, sys.stderr):
        stream.flush()
    saved = os.dup(1), os.dup(2)
    target = os.open(log, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    os.dup2(target, 1)
    os.dup2(target, 2)
    os.close(target)
    return saved


@contextmanager
def output_to(log: Path) -> Iterator[None]:
    """What the block prints goes to ``log``, not the terminal: vLLM's generator prints its own
    table and tips (termplotlib's) for each run, which the report has in one place."""
    saved = _redirect(log)
    try:
        yield
    finally:
        for stream in (sys.stdout, sys.stderr):
            stream.flush()
        for fd, original in zip((1, 2), saved, strict=True):
            os.dup2(original, fd)
            os.close(original)


def exit_output_to(log: Path) -> None:
    """Once the report is printed, what follows goes to ``log``: at interpreter exit triton's
    nanobind bindings report their leaked objects (some thirty lines on stderr) after the report."""
    _redirect(log)


@dataclass(frozen=True)
class Row:
    label: str
    concurrency: int
    completed: int
    failed: int
    request_throughput: float
    output_throughput: float
    goodput: float
    latency_ms: dict[str, float]  # vLLM's names: "mean_ttft_ms", "median_itl_ms", "p99_tpot_ms" -> ms
    # Repeated workloads: the median TTFT of each turn index (one for single requests), and per phase
    # the engines' prefix-cache token counters over the level ({phase: {"queries": n, "hits": n}}),
    # or None where the endpoint's metrics were not read (prefix_cache_note says why).
    ttft_by_turn_ms: tuple[float, ...] = ()
    prefix_cache: dict[str, dict[str, float]] | None = None
    prefix_cache_note: str = ""
    # Per phase, the steps its engines took over the level, the tokens they generated and the prompt
    # tokens they computed (vLLM's counters): what the local check needs to split an engine's CPU into a
    # cost per step, per sequence in it and per prompt token. None where prefix_cache is.
    engine_steps: dict[str, dict[str, float]] | None = None
    # A local server's level: the CPU seconds each of its process roles and the client spent, and the
    # level's wall time (bench/host_cpu.py); None elsewhere.
    host_cpu: dict[str, float] | None = None


def row_from_result(label: str, concurrency: int, result: dict) -> Row:
    latency = {name: float(result.get(name) or 0.0) for m in LATENCY_METRICS for name in statistic_names(m)}
    return Row(
        label=label,
        concurrency=concurrency,
        completed=int(result.get("completed", 0)),
        failed=int(result.get("failed", 0) or 0),
        request_throughput=float(result.get("request_throughput") or 0.0),
        output_throughput=float(result.get("output_throughput") or 0.0),
        goodput=float(result.get("request_goodput") or 0.0),
        latency_ms=latency,
        ttft_by_turn_ms=tuple(result.get("ttft_by_turn_ms") or [float(result.get("median_ttft_ms") or 0.0)]),
    )


def run_conversations(
    *, url: str, model: str, tokenizer: str, workload: Workload, concurrency: int, out_dir: Path, label: str
) -> dict:
    """A multi-turn workload at one concurrency, as `vllm bench serve` would report it, saved beside its runs."""
    from bench.next_turn import converse, vllm_result

    tok = None
    if model != "tiny-llama":  # the tiny model's tokenizer is byte level: its prompts are counted in characters
        from transformers import AutoTokenizer

        tok = AutoTokenizer.from_pretrained(tokenizer)
    turns = converse(
        server_root(url) + "/v1",
        model,
        conversations=workload.num_prompts,
        history_tokens=workload.input_len,
        reply_tokens=workload.output_len,
        warmups=1,
        turns=workload.turns,
        concurrency=concurrency,
        system_tokens=workload.prefix_len,
        message_tokens=workload.followup_len,
        tokenizer=tok,
    )
    slo = {"ttft": workload.slo.ttft_ms, "tpot": workload.slo.tpot_ms}
    result = vllm_result(turns, slo_ms=slo, percentiles=PERCENTILES)
    (out_dir / f"{label}-{workload.name}-c{concurrency}.json").write_text(json.dumps(result, indent=2))
    return result


def cache_by_phase(before: dict, after: dict) -> dict[str, dict[str, float]]:
    """{phase: {"queries": tokens, "hits": tokens}} of the engines' prefix caches between two snapshots."""
    from bench.next_turn import per_request

    return {
        phase: {"queries": row["cache queries"], "hits": row["cache hits"]}
        for phase, row in per_request(before, after, 1).items()
    }


# What each phase's engines did over a level, from vLLM's counters as Ray exports them: the steps they
# took (the count of the histogram of tokens per step; Ray's sum of it is of bucket midpoints, not of
# tokens, so it is not read), the tokens they generated, and the prompt tokens they computed.
ENGINE_WORK = {
    ("ray_vllm_iteration_tokens_total_count", ""): "steps",
    ("ray_vllm_generation_tokens_total", ""): "generated",
    ("ray_vllm_prompt_tokens_by_source_total", "local_compute"): "prompt_computed",
}


def steps_by_phase(before: dict, after: dict) -> dict[str, dict[str, float]]:
    """{phase: {"steps": n, "generated": tokens, "prompt_computed": tokens}} of each phase's engines
    between two snapshots of ``engine_counters`` (a phase: a deployment's name before its first colon,
    as for the cache)."""
    out: dict[str, dict[str, float]] = {}
    for (deployment, metric, source), value in after.items():
        key = ENGINE_WORK.get((metric, source))
        if key is None:
            continue
        phase = out.setdefault(deployment.split(":")[0], dict.fromkeys(ENGINE_WORK.values(), 0.0))
        phase[key] += value - before.get((deployment, metric, source), 0.0)
    return out


def metrics_counters(metrics_url: str | None) -> tuple[Callable[[], dict] | None, str]:
    """A settled snapshot of the engines' counters at an endpoint's Ray metrics URL, or why there is none."""
    if not metrics_url:
        return None, "no metrics URL given (the cluster's Ray metrics, e.g. http://<node>:8080/metrics)"
    from local.metrics import engine_counters, scrape, serve_replica_deployments, settled

    def snapshot() -> dict:
        samples = scrape(metrics_url)
        return engine_counters(samples, serve_replica_deployments(samples))

    try:
        first = snapshot()
    except (OSError, ValueError) as error:
        return None, f"{metrics_url} did not answer ({error})"
    if not any(name == PREFIX_CACHE_QUERIES for _, name, _ in first):
        return None, f"{metrics_url} exports no {PREFIX_CACHE_QUERIES}"
    return (lambda: settled(snapshot, 1.5, 30)), ""


def run_workload(
    *,
    url: str,
    model: str,
    tokenizer: str,
    workload: Workload,
    out_dir: Path,
    label: str,
    counters: Callable[[], dict] | None = None,
    counters_note: str = "",
    host_cpu: Callable[[], AbstractContextManager[dict[str, float]]] | None = None,
) -> list[Row]:
    """Each concurrency level of ``workload``; ``counters`` (a settled snapshot of the engines'
    counters) adds each level's prefix-cache hits, else ``counters_note`` says why they are missing;
    ``host_cpu`` (bench/host_cpu.py's ``accounted`` for a local server) each level's CPU per process."""
    out_dir.mkdir(parents=True, exist_ok=True)
    rows = []
    for concurrency in workload.concurrency:
        print(f"[bench] {label}: {workload.name} at concurrency {concurrency}", flush=True)
        before = counters() if counters else {}
        shape: dict[str, Any] = dict(
            url=url,
            model=model,
            tokenizer=tokenizer,
            workload=workload,
            concurrency=concurrency,
            out_dir=out_dir,
            label=label,
        )
        with output_to(out_dir / THIRD_PARTY_LOG), host_cpu() if host_cpu else nullcontext({}) as spent:
            result = run_conversations(**shape) if workload.turns > 1 else run_one(bench_args(**shape))
        row = replace(row_from_result(label, concurrency, result), host_cpu=dict(spent) if host_cpu else None)
        print(
            f"[bench] {label}: {row.completed} ok, {row.failed} failed, {row.request_throughput:.2f} req/s", flush=True
        )
        if counters:
            after = counters()
            row = replace(row, prefix_cache=cache_by_phase(before, after), engine_steps=steps_by_phase(before, after))
        rows.append(replace(row, prefix_cache_note=counters_note))
    return rows


def table(rows: list[Row]) -> str:
    header = ["endpoint", "conc", "ok", "fail", "req/s", "out tok/s", "goodput req/s"] + [
        name for m in LATENCY_METRICS for name in statistic_names(m)
    ]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for r in rows:
        cells = [
            r.label,
            str(r.concurrency),
            str(r.completed),
            str(r.failed),
            f"{r.request_throughput:.2f}",
            f"{r.output_throughput:.1f}",
            f"{r.goodput:.2f}",
        ]
        cells += [f"{r.latency_ms[name]:.1f}" for m in LATENCY_METRICS for name in statistic_names(m)]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def hit_rates(row: Row) -> str:
    """Each phase's prefix-cache hit rate over the row's level: tokens hit / tokens looked up."""
    if row.prefix_cache is None:
        return f"not measured: {row.prefix_cache_note or 'no metrics endpoint given'}"
    rates = [
        f"{phase} {c['hits'] / c['queries']:.0%} ({c['hits']:.0f} / {c['queries']:.0f})"
        for phase, c in sorted(row.prefix_cache.items())
        if c["queries"]
    ]
    return ", ".join(rates) or "no engine counted a prefix-cache lookup"


def repeated_table(rows: list[Row]) -> str:
    """Median TTFT of each turn index beside each phase's prefix-cache hit rate, per endpoint and level."""
    turns = max(len(r.ttft_by_turn_ms) for r in rows)
    header = ["endpoint", "conc"] + [f"turn {i + 1} TTFT p50 ms" for i in range(turns)]
    header += ["prefix-cache hit rate (tokens hit / looked up)"]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for r in rows:
        ttft = [f"{ms:.1f}" for ms in r.ttft_by_turn_ms] + ["-"] * (turns - len(r.ttft_by_turn_ms))
        lines.append("| " + " | ".join([r.label, str(r.concurrency), *ttft, hit_rates(r)]) + " |")
    return "\n".join(lines)


def plot(rows: list[Row], path: Path, title: str) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 3, figsize=(15, 4))
    for label in sorted({r.label for r in rows}):
        mine = sorted((r for r in rows if r.label == label), key=lambda r: r.concurrency)
        xs = [r.concurrency for r in mine]
        for ax, metric in zip(axes, LATENCY_METRICS, strict=False):
            for statistic, style in (("median", ":"), ("mean", "--"), ("p99", "-")):
                name = f"{statistic}_{metric}_ms"
                ax.plot(xs, [r.latency_ms[name] for r in mine], style, marker="o", label=f"{label} {statistic}")
            ax.set_title(f"{metric.upper()} (ms)")
            ax.set_xlabel("concurrency")
    axes[0].legend(fontsize="small")
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


def dated_dir(base: Path = RESULTS_DIR, *, now: dt.datetime | None = None) -> Path:
    return base / (now or dt.datetime.now()).strftime("%Y-%m-%d_%H%M%S")


def shape_line(workload: Workload) -> str:
    if workload.turns > 1:
        return (
            f"{workload.num_prompts} conversations of {workload.turns} turns per level: a {workload.prefix_len}-token "
            f"system prompt all share, a {workload.input_len}-token task each, then per turn the "
            f"{workload.output_len}-token reply and a {workload.followup_len}-token message"
        )
    shared = f" after a {workload.prefix_len}-token prefix all share" if workload.prefix_len else ""
    return (
        f"{workload.input_len} in{shared} / {workload.output_len} out tokens (±{workload.range_ratio:.0%}), "
        f"{workload.num_prompts} requests per level"
    )


def repeated_section(rows: list[Row], workload: Workload) -> str:
    if not workload.repeated:
        return ""
    return "\n## Repeated input: TTFT per turn and prefix-cache hit rates\n\n" + repeated_table(rows) + "\n"


def write_report(rows: list[Row], out_dir: Path, workload: Workload, extra: str = "") -> Path:
    report = out_dir / "report.md"
    report.write_text(
        f"# {workload.name}: {workload.description}\n\n"
        f"{shape_line(workload)}; goodput SLO TTFT ≤ {workload.slo.ttft_ms:g} ms, "
        f"TPOT ≤ {workload.slo.tpot_ms:g} ms.\n\n{table(rows)}\n{repeated_section(rows, workload)}{extra}"
    )
    (out_dir / "rows.json").write_text(json.dumps([r.__dict__ for r in rows], indent=2))
    return report


def default_tokenizer() -> str:
    return str(ROOT / ".local" / "tiny-llama")


def main(argv: list[str] | None = None, *, exiting: bool = False) -> int:
    """``exiting``: the process exits after this (``python -m bench.run``), so what the
    interpreter's exit prints goes to the results folder's log (see exit_output_to)."""
    parser = ArgumentParser(
        prog="python -m bench.run", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--url", required=True, help="OpenAI base URL, e.g. http://127.0.0.1:8000/v1")
    parser.add_argument(
        "--workload",
        default="chat",
        help="preset in bench/workloads.yaml: chat, long-prompt, shared-context-rag, multi-turn-agent, tiny "
        "(default: chat)",
    )
    parser.add_argument("--model", default="tiny-llama", help="model id served at the URL")
    parser.add_argument("--tokenizer", default=default_tokenizer(), help="tokenizer path or Hugging Face id")
    parser.add_argument(
        "--label",
        default="endpoint",
        help="name of this endpoint in the results, e.g. disaggregated or colocated, which is how "
        "calibration.json names its mode (default: endpoint)",
    )
    parser.add_argument(
        "--metrics-url",
        default=None,
        help="the endpoint's Ray metrics (Prometheus text), for the prefix-cache hit rates of a repeated workload",
    )
    parser.add_argument("--out", default=None, help="results folder (default results/<date>)")
    args = parser.parse_args(argv)
    workload = workload_named(args.workload)
    out_dir = Path(args.out) if args.out else dated_dir()
    counters, note = metrics_counters(args.metrics_url) if workload.repeated else (None, "")
    rows = run_workload(
        url=args.url,
        model=args.model,
        tokenizer=args.tokenizer,
        workload=workload,
        out_dir=out_dir,
        label=args.label,
        counters=counters,
        counters_note=note,
    )
    plot(rows, out_dir / f"{workload.name}.png", f"{workload.name} at {args.url}")
    report = write_report(rows, out_dir, workload)
    from bench.calibration import write_calibration

    write_calibration(out_dir, model=args.model, workload=workload, rows=rows)
    print(report.read_text())
    print(f"results in {out_dir}", flush=True)
    if exiting:
        exit_output_to(out_dir / THIRD_PARTY_LOG)
    return 0 if all(r.failed == 0 for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main(exiting=True))
