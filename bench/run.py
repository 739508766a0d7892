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
import os
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import yaml
from pydantic import BaseModel, ConfigDict, Field

from cmdline import ArgumentParser
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
    num_prompts: int = Field(ge=1, description="Requests per concurrency level.")
    concurrency: list[int] = Field(min_length=1, description="Concurrency levels to sweep.")
    slo: Slo = Field(description="The SLO that defines goodput.")


def load_workloads(path: Path = WORKLOADS_FILE) -> dict[str, Workload]:
    data = yaml.safe_load(path.read_text())
    return {name: Workload(name=name, **body) for name, body in data.items()}


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
        "--seed",
        "0",
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
    )


def run_workload(*, url: str, model: str, tokenizer: str, workload: Workload, out_dir: Path, label: str) -> list[Row]:
    out_dir.mkdir(parents=True, exist_ok=True)
    rows = []
    for concurrency in workload.concurrency:
        print(f"[bench] {label}: {workload.name} at concurrency {concurrency}", flush=True)
        with output_to(out_dir / THIRD_PARTY_LOG):
            result = run_one(
                bench_args(
                    url=url,
                    model=model,
                    tokenizer=tokenizer,
                    workload=workload,
                    concurrency=concurrency,
                    out_dir=out_dir,
                    label=label,
                )
            )
        row = row_from_result(label, concurrency, result)
        print(
            f"[bench] {label}: {row.completed} ok, {row.failed} failed, {row.request_throughput:.2f} req/s", flush=True
        )
        rows.append(row)
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


def write_report(rows: list[Row], out_dir: Path, workload: Workload, extra: str = "") -> Path:
    report = out_dir / "report.md"
    report.write_text(
        f"# {workload.name}: {workload.description}\n\n"
        f"{workload.input_len} in / {workload.output_len} out tokens (±{workload.range_ratio:.0%}), "
        f"{workload.num_prompts} requests per level; goodput SLO TTFT ≤ {workload.slo.ttft_ms:g} ms, "
        f"TPOT ≤ {workload.slo.tpot_ms:g} ms.\n\n{table(rows)}\n{extra}"
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
        help="preset in bench/workloads.yaml: chat, long-prompt, shared-context-rag, tiny (default: chat)",
    )
    parser.add_argument("--model", default="tiny-llama", help="model id served at the URL")
    parser.add_argument("--tokenizer", default=default_tokenizer(), help="tokenizer path or Hugging Face id")
    parser.add_argument(
        "--label",
        default="endpoint",
        help="name of this endpoint in the results, e.g. disaggregated or colocated, which is how "
        "calibration.json names its mode (default: endpoint)",
    )
    parser.add_argument("--out", default=None, help="results folder (default results/<date>)")
    args = parser.parse_args(argv)
    workload = workload_named(args.workload)
    out_dir = Path(args.out) if args.out else dated_dir()
    rows = run_workload(
        url=args.url, model=args.model, tokenizer=args.tokenizer, workload=workload, out_dir=out_dir, label=args.label
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
