"""The figures a benchmark measured, in the shape `make plan CALIBRATION=…` fits the model to
(planner/calibration.py): ``calibration.json`` beside the run's report.

- ``ttft_probe``: per mode, each probe size's median TTFT (ms) of sequential, unique prompts,
  which is prefill and the fixed costs around it, with no queue; ``ttft_probe_samples``: how many
  requests each median is of (the fit refuses a size with too few);
- ``rows``: per mode and concurrency, the workload's TTFT, TPOT and ITL (mean, median, p90, p95, p99,
  under `vllm bench serve`'s names: mean_ttft_ms, median_itl_ms, …) and output tokens/s; for a local
  server also ``host_cpu``, the CPU seconds each of its process roles and the client spent in the
  level and its wall time (bench/host_cpu.py), with ``host_cores``, the cores they shared, and
  ``prefix_cache``, per phase the prompt tokens its engines looked up in their prefix cache and found
  there, per request, and ``engine_steps``, per phase the steps its engines took over the level, the tokens
  they generated and the prompt tokens they computed (vLLM's counters); and ``host_priority``, how
  the client was put ahead of the local servers for the CPU (bench/host_cpu.py, ``behind_the_client``).
"""

from __future__ import annotations

import datetime as dt
import json
import os
from pathlib import Path

FILE_NAME = "calibration.json"


def write_calibration(
    out_dir: Path,
    *,
    model: str,
    workload,
    rows,
    ttft: dict | None = None,
    pd_min_prompt_tokens: int = 0,
    host_priority: str | None = None,
) -> Path:
    """``rows``: bench.run's Rows, whose labels are the modes; ``ttft``: {mode: [SizeResult]};
    ``pd_min_prompt_tokens``: the P/D deployment's selective threshold (its shorter prompts never
    crossed the KV link)."""
    data = {
        "measured_at": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        "model": model,
        "pd_min_prompt_tokens": pd_min_prompt_tokens,
        "workload": {
            "name": workload.name,
            "input_len": workload.input_len,
            "output_len": workload.output_len,
            "range_ratio": workload.range_ratio,
            "num_prompts": workload.num_prompts,
        },
        "ttft_probe": {
            mode: {str(r.tokens): round(r.percentile(50) * 1e3, 2) for r in results if r.ttft_s}
            for mode, results in (ttft or {}).items()
        },
        "ttft_probe_samples": {
            mode: {str(r.tokens): len(r.ttft_s) for r in results} for mode, results in (ttft or {}).items()
        },
        "rows": [
            {
                "mode": r.label,
                "concurrency": r.concurrency,
                # `vllm bench serve`'s own names, which the advisor's --json uses too.
                **r.latency_ms,
                "output_tokens_per_s": r.output_throughput,
                **({"host_cpu": r.host_cpu} if r.host_cpu else {}),
                **({"prefix_cache": r.prefix_cache} if r.prefix_cache else {}),
                **({"engine_steps": r.engine_steps} if r.engine_steps else {}),
            }
            for r in rows
        ],
    }
    if any(r.host_cpu for r in rows):
        # The cores the local servers and the client shared (planner/local_check.py models them).
        data["host_cores"] = len(os.sched_getaffinity(0))
    if host_priority:
        data["host_priority"] = host_priority
    path = out_dir / FILE_NAME
    path.write_text(json.dumps(data, indent=2) + "\n")
    return path
