"""The metric names the vLLM in this environment declares, as Ray exports them under Serve.

Read from vLLM's own source (every ``name="vllm:…"`` given to a counter, gauge or histogram) rather
than listed by hand, so that a dashboard or a recorded fixture naming a metric vLLM does not export
fails. Ray's wrappers (vllm/v1/metrics/ray_wrappers.py) replace what OpenTelemetry disallows (the
colon) with ``_``, Ray's exporter prefixes ``ray_``, and Prometheus' text format adds ``_total`` to a
counter and ``_bucket``, ``_sum``, ``_count`` to a histogram.
"""

from __future__ import annotations

import ast
import functools
import importlib.util
import re
from pathlib import Path

# Where the engine (its stat loggers, spec decode, offload) and the KV connectors declare their metrics.
SEARCHED = ("v1", "distributed/kv_transfer")
SUFFIXES = {"counter": ("_total",), "gauge": ("",), "histogram": ("_bucket", "_sum", "_count")}


def _kind(call: ast.Call) -> str | None:
    func = call.func
    name = func.attr if isinstance(func, ast.Attribute) else func.id if isinstance(func, ast.Name) else ""
    return next((kind for kind in SUFFIXES if kind in name.lower()), None)


@functools.cache
def declared() -> dict[str, str]:
    """{vllm:<name>: counter | gauge | histogram} for every metric vLLM's source declares."""
    # Found, not imported: importing vLLM loads PyTorch, which takes far longer than reading it.
    spec = importlib.util.find_spec("vllm")
    assert spec is not None and spec.origin is not None, "vLLM is not installed in this environment"
    found: dict[str, str] = {}
    root = Path(spec.origin).parent
    for path in (p for folder in SEARCHED for p in (root / folder).rglob("*.py")):
        text = path.read_text(errors="replace")
        if 'name="vllm:' not in text:
            continue
        for node in ast.walk(ast.parse(text)):
            if not isinstance(node, ast.Call) or (kind := _kind(node)) is None:
                continue
            for keyword in node.keywords:
                value = keyword.value
                if keyword.arg == "name" and isinstance(value, ast.Constant) and str(value.value).startswith("vllm:"):
                    found[value.value] = kind
    return found


@functools.cache
def ray_exported() -> frozenset[str]:
    return frozenset(
        "ray_" + re.sub(r"[^a-zA-Z0-9_]", "_", name) + suffix
        for name, kind in declared().items()
        for suffix in SUFFIXES[kind]
    )
