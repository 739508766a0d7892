"""The serving dashboard as data: one row per phase, rendered for Grafana (AMP) and for CloudWatch.

The Grafana JSON is checked in next to this module (``pd_serving.grafana.json``) so that it can be
imported into any Grafana without running CDK; ``python -m cli.dashboards`` rewrites it
and a test fails when the file and this module disagree.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from manifests.contract import PHASES

GRAFANA_FILE = Path(__file__).with_name("pd_serving.grafana.json")
# The Serve deployments of serve_app are named "<Phase>:<model id with '.' as '_'>".
SERVE_DEPLOYMENT = {"prefill": "Prefill:.*", "decode": "Decode:.*"}
RATE_WINDOW = "5m"


@dataclass(frozen=True)
class CloudWatchSeries:
    """One CloudWatch metric of a widget; ``dimensions`` beyond ClusterName and the phase's."""

    metric: str
    stat: str
    label: str
    dimensions: tuple[tuple[str, str], ...] = ()
    # Gauges are summed per minute over every scrape; dividing by the scrapes per minute gives
    # the total over replicas at one instant.
    per_scrape: bool = False


@dataclass(frozen=True)
class Panel:
    title: str
    unit: str
    promql: tuple[tuple[str, str], ...]  # (legend, PromQL with @vllm / @serve for the phase selector)
    cloudwatch: tuple[CloudWatchSeries, ...] = ()
    phases: tuple[str, ...] = PHASES  # the rows it is drawn in
    alarm_above: float | None = None  # drawn red above this value (Grafana threshold, CloudWatch annotation)


def _quantiles(metric: str) -> tuple[tuple[str, str], ...]:
    return tuple(
        (f"p{int(q * 100)}", f"histogram_quantile({q}, sum by (le) (rate({metric}{{@vllm}}[{RATE_WINDOW}])))")
        for q in (0.5, 0.99)
    )


def _rate(metric: str, selector: str = "@vllm") -> str:
    return f"sum(rate({metric}{{{selector}}}[{RATE_WINDOW}]))"


PANELS: tuple[Panel, ...] = (
    Panel(
        "Requests running / waiting",
        "short",
        (
            ("running", "sum(ray_vllm_num_requests_running{@vllm})"),
            ("waiting", "sum(ray_vllm_num_requests_waiting{@vllm})"),
        ),
        (
            CloudWatchSeries("ray_vllm_num_requests_running", "Sum", "running", per_scrape=True),
            CloudWatchSeries("ray_vllm_num_requests_waiting", "Sum", "waiting", per_scrape=True),
        ),
    ),
    Panel("Time to first token", "s", _quantiles("ray_vllm_time_to_first_token_seconds_bucket")),
    Panel(
        "Time per output token",
        "s",
        _quantiles("ray_vllm_request_time_per_output_token_seconds_bucket")
        + (("inter-token p99", _quantiles("ray_vllm_inter_token_latency_seconds_bucket")[1][1]),),
    ),
    Panel(
        "KV cache usage",
        "percentunit",
        (("max over engines", "max(ray_vllm_kv_cache_usage_perc{@vllm})"),),
        (
            CloudWatchSeries("ray_vllm_kv_cache_usage_perc", "Maximum", "max over engines"),
            CloudWatchSeries("ray_vllm_kv_cache_usage_perc", "Average", "mean over engines"),
        ),
    ),
    Panel("NIXL KV transfer time", "s", _quantiles("ray_vllm_nixl_xfer_time_seconds_bucket")),
    Panel("NIXL KV bytes transferred", "Bps", (("bytes/s", _rate("ray_vllm_nixl_bytes_transferred_sum")),)),
    Panel(
        "Prompt tokens: computed here vs pulled over NIXL",
        "short",
        (
            (
                "tokens/s {{source}}",
                f"sum by (source) (rate(ray_vllm_prompt_tokens_by_source_total{{@vllm}}[{RATE_WINDOW}]))",
            ),
        ),
        tuple(
            CloudWatchSeries("ray_vllm_prompt_tokens_by_source_total", "Sum", f"{source} tokens", (("source", source),))
            for source in ("local_compute", "external_kv_transfer")
        ),
    ),
    # The share of queried prompt tokens each phase found in its own prefix cache. With P/D decode keeps
    # what it pulled on a conversation's earlier turn, so it hits about as often as prefill; near 0
    # while prefill hits, decode pulls each whole history over NIXL again (`make verify` flags it).
    Panel(
        "Prefix cache hit rate",
        "percentunit",
        (
            (
                "hit tokens / queried tokens",
                f"{_rate('ray_vllm_prefix_cache_hits_total')} / {_rate('ray_vllm_prefix_cache_queries_total')}",
            ),
        ),
        (
            CloudWatchSeries("ray_vllm_prefix_cache_hits_total", "Sum", "prefix cache hit tokens"),
            CloudWatchSeries("ray_vllm_prefix_cache_queries_total", "Sum", "prefix cache queried tokens"),
        ),
    ),
    # With P/D decode computes no prompt token itself. Above zero, KV pulls fail and
    # kv_transfer.load_failure_policy recompute hides it as slow serving, as a stale NIXL peer after
    # a prefill restart does (vLLM issue #49238): `make verify` names it and the remedy.
    Panel(
        "Prompt tokens recomputed (a failed KV pull; 0 when P/D works)",
        "short",
        (("tokens/s recomputed", _rate("ray_vllm_prompt_tokens_by_source_total", '@vllm,source="local_compute"')),),
        (
            CloudWatchSeries(
                "ray_vllm_prompt_tokens_by_source_total", "Sum", "recomputed tokens", (("source", "local_compute"),)
            ),
        ),
        phases=("decode",),
        alarm_above=0,
    ),
    Panel(
        "Errors",
        "reqps",
        (
            (
                "Serve HTTP 5xx/s",
                _rate("ray_serve_num_deployment_http_error_requests_total", '@serve,error_code=~"5.."'),
            ),
            (
                "vLLM aborted or failed/s",
                _rate("ray_vllm_request_success_total", '@vllm,finished_reason=~"abort|error"'),
            ),
            ("NIXL failed transfers/s", _rate("ray_vllm_nixl_num_failed_transfers_total")),
        ),
        tuple(
            CloudWatchSeries("ray_vllm_request_success_total", "Sum", f"vLLM {reason}", (("finished_reason", reason),))
            for reason in ("abort", "error")
        ),
    ),
)

METRIC_NAME = re.compile(r"\bray_[a-z0-9_]+\b")


def referenced_metrics() -> set[str]:
    """Every metric name the dashboard reads, in either rendering."""
    names = {n for panel in PANELS for _, expr in panel.promql for n in METRIC_NAME.findall(expr)}
    return names | {s.metric for panel in PANELS for s in panel.cloudwatch}


def _bind(expr: str, phase: str) -> str:
    return expr.replace("@vllm", f'namespace="$namespace",phase="{phase}"').replace(
        "@serve", f'namespace="$namespace",deployment=~"{SERVE_DEPLOYMENT[phase]}"'
    )


def grafana_dashboard() -> dict[str, Any]:
    panels: list[dict[str, Any]] = []
    width, per_row = 8, 3
    y = 0
    for phase in PHASES:
        panels.append({"type": "row", "title": phase, "collapsed": False, "gridPos": {"x": 0, "y": y, "w": 24, "h": 1}})
        y += 1
        drawn = [p for p in PANELS if phase in p.phases]
        for index, panel in enumerate(drawn):
            defaults: dict[str, Any] = {"unit": panel.unit}
            if panel.alarm_above is not None:
                defaults["thresholds"] = {
                    "mode": "absolute",
                    "steps": [{"color": "green", "value": None}, {"color": "red", "value": panel.alarm_above}],
                }
                defaults["custom"] = {"thresholdsStyle": {"mode": "line+area"}}
            panels.append(
                {
                    "type": "timeseries",
                    "title": f"{phase}: {panel.title}",
                    "datasource": {"type": "prometheus", "uid": "${datasource}"},
                    "fieldConfig": {"defaults": defaults, "overrides": []},
                    "gridPos": {"x": (index % per_row) * width, "y": y + (index // per_row) * 8, "w": width, "h": 8},
                    "targets": [
                        {"refId": chr(ord("A") + i), "legendFormat": legend, "expr": _bind(expr, phase)}
                        for i, (legend, expr) in enumerate(panel.promql)
                    ],
                }
            )
        y += -(-len(drawn) // per_row) * 8
    for number, rendered in enumerate(panels, start=1):
        rendered["id"] = number
    return {
        "title": "Ray Serve LLM prefill/decode",
        "uid": "pd-serving",
        "schemaVersion": 39,
        "time": {"from": "now-1h", "to": "now"},
        "refresh": "30s",
        "tags": ["ray", "vllm", "pd-disaggregation"],
        "templating": {
            "list": [
                {"name": "datasource", "type": "datasource", "query": "prometheus", "label": "Prometheus"},
                {
                    "name": "namespace",
                    "type": "query",
                    "datasource": {"type": "prometheus", "uid": "${datasource}"},
                    "query": "label_values(ray_vllm_num_requests_running, namespace)",
                    "refresh": 2,
                },
            ]
        },
        "panels": panels,
    }


def grafana_json() -> str:
    return json.dumps(grafana_dashboard(), indent=2, sort_keys=True) + "\n"


def cloudwatch_body(*, region: str, cluster_name: str, namespace: str, scrape_interval_seconds: int) -> dict[str, Any]:
    """CloudWatch dashboard body over the agent's EMF metrics (``namespace`` is the metric namespace)."""
    scrapes_per_minute = 60 // scrape_interval_seconds
    widgets: list[dict[str, Any]] = []
    y = 0
    for phase in PHASES:
        widgets.append(
            {
                "type": "text",
                "x": 0,
                "y": y,
                "width": 24,
                "height": 2,
                "properties": {
                    "markdown": (
                        f"## {phase}\nTTFT, TPOT and NIXL transfer time and bytes are Prometheus histograms, which the "
                        "CloudWatch agent drops; set `observability.backend: amp` for them."
                    )
                },
            }
        )
        y += 2
        charts = [p for p in PANELS if p.cloudwatch and phase in p.phases]
        for index, panel in enumerate(charts):
            metrics: list[list[Any]] = []
            for n, series in enumerate(panel.cloudwatch):
                ident = f"m{n}"
                dims = [
                    d for pair in (("ClusterName", cluster_name), ("phase", phase), *series.dimensions) for d in pair
                ]
                options: dict[str, Any] = {"id": ident, "stat": series.stat, "label": series.label}
                if series.per_scrape:
                    metrics.append([{"expression": f"{ident} / {scrapes_per_minute}", "label": series.label}])
                    options.update(visible=False)
                metrics.append([namespace, series.metric, *dims, options])
            widgets.append(
                {
                    "type": "metric",
                    "x": (index % 3) * 8,
                    "y": y + (index // 3) * 6,
                    "width": 8,
                    "height": 6,
                    "properties": {
                        "title": f"{phase}: {panel.title}",
                        "region": region,
                        "view": "timeSeries",
                        "period": 60,
                        "metrics": metrics,
                        **(
                            {"annotations": {"horizontal": [{"label": "alarm", "value": panel.alarm_above}]}}
                            if panel.alarm_above is not None
                            else {}
                        ),
                    },
                }
            )
        y += -(-len(charts) // 3) * 6
    return {"widgets": widgets}
