"""Reading the Prometheus text that Ray exports, and the vLLM counters that prove KV reuse.

Under Ray Serve, each engine's vLLM counters are exported as ``ray_vllm_*`` on Ray's metrics
port, labelled with the Serve replica. Counters are compared, never histogram sums: Ray reports
bucket midpoints for those.
"""

from __future__ import annotations

import re
import time
import urllib.request
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass

_SAMPLE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(.*)\})?\s+(\S+)$")
_LABEL = re.compile(r'(\w+)="((?:[^"\\]|\\.)*)"')

PROMPT_TOKENS_BY_SOURCE = "ray_vllm_prompt_tokens_by_source_total"
EXTERNAL_PREFIX_HITS = "ray_vllm_external_prefix_cache_hits_total"
NIXL_TRANSFERS = "ray_vllm_nixl_xfer_time_seconds_count"
# Prompt tokens an engine looked up in its own prefix cache, and those it found (whole blocks).
PREFIX_CACHE_QUERIES = "ray_vllm_prefix_cache_queries_total"
PREFIX_CACHE_HITS = "ray_vllm_prefix_cache_hits_total"
REPLICA_LABELS = ("ReplicaId", "replica", "WorkerId")
# Requests decode served on its own engine because prefill was gone (serve_app/pd_decode.py's Ray
# metric pd_prefill_fallbacks, a counter Ray exports with this name), by reason.
PREFILL_FALLBACKS = "ray_pd_prefill_fallbacks_total"
# KV reads decode failed for making no progress for kv_transfer.stall_timeout_s (serve_app/kv_wait.py's
# engine counter pd_kv_transfer_stalls, which Ray exports with this name).
KV_TRANSFER_STALLS = "ray_pd_kv_transfer_stalls_total"


def is_engine_counter(name: str) -> bool:
    """vLLM's counters of an engine, and the project's own of a decode replica."""
    return name.startswith("ray_vllm_") or name in (PREFILL_FALLBACKS, KV_TRANSFER_STALLS)


@dataclass(frozen=True)
class Sample:
    name: str
    labels: dict[str, str]
    value: float


def parse(text: str) -> list[Sample]:
    samples = []
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        match = _SAMPLE.match(line.strip())
        if match:
            try:
                value = float(match.group(3))
            except ValueError:
                continue
            samples.append(Sample(match.group(1), dict(_LABEL.findall(match.group(2) or "")), value))
    return samples


def scrape(url: str, timeout: float = 10) -> list[Sample]:
    with urllib.request.urlopen(url, timeout=timeout) as response:
        return parse(response.read().decode())


def replica_of(sample: Sample) -> str:
    for label in REPLICA_LABELS:
        if label in sample.labels:
            return sample.labels[label]
    return "?"


def serve_replica_deployments(samples: list[Sample]) -> dict[str, str]:
    """Replica id -> deployment, from Ray Serve's own replica metrics (vLLM labels an engine's
    counters with its replica id only)."""
    return {
        s.labels["replica"]: s.labels["deployment"]
        for s in samples
        if s.name.startswith("ray_serve_") and "replica" in s.labels and "deployment" in s.labels
    }


def known_replica_of(sample: Sample, replicas: dict[str, str]) -> str | None:
    """The id, as ``replicas`` (replica id to deployment) names it, of the replica that exported
    ``sample``; None for a replica it does not name."""
    replica = replica_of(sample)
    return next((rid for rid in replicas if rid == replica or replica.endswith(rid)), None)


def deployment_of(sample: Sample, replicas: dict[str, str]) -> str:
    """The deployment of the replica that exported ``sample`` (``replicas``: replica id to deployment)."""
    rid = known_replica_of(sample, replicas)
    return replicas[rid] if rid is not None else replica_of(sample)


def counter_source(sample: Sample) -> str:
    """What a counter's sample is counted by: vLLM's ``source`` label, or the fallbacks' ``reason``."""
    return sample.labels.get("source", sample.labels.get("reason", ""))


def engine_counters(samples: list[Sample], replicas: dict[str, str]) -> dict[tuple[str, str, str], float]:
    """{(deployment, metric, source): value} summed over the replicas of each deployment.

    ``replicas`` maps replica ids (as labelled in the metrics) to deployment names.
    """
    totals: dict[tuple[str, str, str], float] = defaultdict(float)
    for sample in samples:
        if not is_engine_counter(sample.name):
            continue
        totals[(deployment_of(sample, replicas), sample.name, counter_source(sample))] += sample.value
    return dict(totals)


def replica_counters(
    samples: list[Sample], replicas: dict[str, str], deployment_prefix: str, metric: str, source: str = ""
) -> dict[str, float]:
    """{replica id: value} of one engine counter, for each replica of the deployments named
    ``deployment_prefix``… (``replicas``: replica id to deployment, as for :func:`engine_counters`)."""
    totals: dict[str, float] = defaultdict(float)
    for sample in samples:
        if sample.name != metric or counter_source(sample) != source:
            continue
        rid = known_replica_of(sample, replicas)
        if rid is not None and replicas[rid].startswith(deployment_prefix):
            totals[rid] += sample.value
    return dict(totals)


def counter_delta(before: dict, after: dict, deployment_prefix: str, metric: str, source: str = "") -> float:
    def total(snapshot):
        return sum(
            v
            for (dep, name, src), v in snapshot.items()
            if dep.startswith(deployment_prefix) and name == metric and src == source
        )

    return total(after) - total(before)


def settled(snapshot: Callable[[], dict], poll: float = 2.0, timeout: float = 60) -> dict:
    """A snapshot once two in a row ``poll`` seconds apart agree.

    Ray exports each engine's counters on an interval, so a request that just finished may not
    be counted yet; a settled snapshot is a safe 'before' for a delta.
    """
    deadline = time.monotonic() + timeout
    previous = snapshot()
    while True:
        time.sleep(poll)
        current = snapshot()
        if current == previous or time.monotonic() > deadline:
            return current
        previous = current
