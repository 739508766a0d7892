"""What the metrics backends are given, as data: the Prometheus scrape configuration of the Ray pods,
the CloudWatch agent add-on's values, and the AMP scraper's RBAC.

Every Ray pod exports all of its node's metrics on the container port named ``metrics``. One scrape
configuration serves both backends; it turns the pod's ``ray.io/group`` label (``prefill-gpu`` /
``decode-gpu``) into a ``phase`` label, because the vLLM metrics themselves do not say which phase
an engine serves.
"""

from __future__ import annotations

from typing import Any

from manifests import dashboards
from manifests.contract import METRICS_PORT_NAME, WORKER_GROUP_PHASE_REGEX

SCRAPE_JOB = "ray"
CLOUDWATCH_ADDON = "amazon-cloudwatch-observability"
# The log groups the add-on's agents write to besides the Prometheus one, and create when missing.
CONTAINER_INSIGHTS_LOG_GROUPS = ("performance", "application", "host", "dataplane")


def container_insights_log_group(cluster_name: str, name: str) -> str:
    return f"/aws/containerinsights/{cluster_name}/{name}"


def scraper_log_group(cluster_name: str) -> str:
    """Where the Amazon Managed Prometheus scraper logs (a vended log group, named by the stack)."""
    return f"/aws/vendedlogs/prometheus/{cluster_name}/scraper"


def control_plane_log_group(cluster_name: str) -> str:
    """The name EKS writes control-plane logs to; the stack creates it first, with a retention."""
    return f"/aws/eks/{cluster_name}/cluster"


def fixed_log_groups(cluster_name: str, backend: str) -> list[str]:
    """The log groups the stack creates under names a service also writes to, so that one left by an
    earlier stack (or made by the service) blocks the create."""
    names = [control_plane_log_group(cluster_name)]
    if backend == "amp":
        names.append(scraper_log_group(cluster_name))
    if backend == "cloudwatch":
        names += [container_insights_log_group(cluster_name, n) for n in ("prometheus", *CONTAINER_INSIGHTS_LOG_GROUPS)]
    return names


CLOUDWATCH_NAMESPACE = "amazon-cloudwatch"
CLOUDWATCH_SERVICE_ACCOUNT = "cloudwatch-agent"
# The agent's operator mounts the add-on's prometheus config here.
AGENT_PROMETHEUS_CONFIG_PATH = "/etc/prometheusconfig/prometheus.yaml"
EMF_NAMESPACE = "PdServing/Prometheus"
# The Kubernetes user that EKS maps an AMP scraper's role to; the scraper's RBAC binds it.
AMP_SCRAPER_USER = "aps-collector-user"

# Every metric name a dashboard may read. The CloudWatch agent ships only the names listed here
# (a renamed metric would otherwise vanish silently), and a test checks the dashboards against it.
KNOWN_METRICS: tuple[str, ...] = (
    "ray_vllm_num_requests_running",
    "ray_vllm_num_requests_waiting",
    "ray_vllm_kv_cache_usage_perc",
    "ray_vllm_time_to_first_token_seconds_bucket",
    "ray_vllm_request_time_per_output_token_seconds_bucket",
    "ray_vllm_inter_token_latency_seconds_bucket",
    "ray_vllm_nixl_xfer_time_seconds_bucket",
    "ray_vllm_nixl_xfer_time_seconds_count",
    "ray_vllm_nixl_bytes_transferred_sum",
    "ray_vllm_nixl_num_failed_transfers_total",
    "ray_vllm_prompt_tokens_by_source_total",
    "ray_vllm_prefix_cache_queries_total",
    "ray_vllm_prefix_cache_hits_total",
    "ray_vllm_request_success_total",
    "ray_serve_num_deployment_http_error_requests_total",
)


def scrape_config(*, namespace: str, interval_seconds: int) -> dict[str, Any]:
    """Prometheus scrape configuration of the Ray pods in ``namespace`` (head and workers)."""
    return {
        "global": {"scrape_interval": f"{interval_seconds}s", "scrape_timeout": "10s"},
        "scrape_configs": [
            {
                "job_name": SCRAPE_JOB,
                "kubernetes_sd_configs": [{"role": "pod", "namespaces": {"names": [namespace]}}],
                "relabel_configs": [
                    {
                        "source_labels": ["__meta_kubernetes_pod_container_port_name"],
                        "action": "keep",
                        "regex": METRICS_PORT_NAME,
                    },
                    {
                        "source_labels": ["__meta_kubernetes_pod_label_ray_io_node_type"],
                        "action": "keep",
                        "regex": "head|worker",
                    },
                    {
                        "source_labels": ["__meta_kubernetes_pod_label_ray_io_group"],
                        "regex": WORKER_GROUP_PHASE_REGEX,
                        "target_label": "phase",
                        "replacement": "$1",
                    },
                    {"source_labels": ["__meta_kubernetes_namespace"], "target_label": "namespace"},
                    {"source_labels": ["__meta_kubernetes_pod_name"], "target_label": "pod"},
                    {
                        "source_labels": ["__meta_kubernetes_pod_label_ray_io_node_type"],
                        "target_label": "ray_node_type",
                    },
                ],
            }
        ],
    }


def _metric_declarations() -> list[dict[str, Any]]:
    """Which scraped series become CloudWatch metrics, and under which dimensions."""
    phase_dims: dict[str, list[str]] = {}
    for panel in dashboards.PANELS:
        for series in panel.cloudwatch:
            phase_dims.setdefault(series.metric, ["ClusterName", "phase", *(d for d, _ in series.dimensions)])
    grouped: dict[tuple[str, ...], list[str]] = {}
    for metric, dims in sorted(phase_dims.items()):
        grouped.setdefault(tuple(dims), []).append(metric)
    return [
        {
            "source_labels": ["job"],
            "label_matcher": f"^{SCRAPE_JOB}$",
            "dimensions": [list(dims)],
            "metric_selectors": [f"^{metric}$" for metric in metrics],
        }
        for dims, metrics in grouped.items()
    ]


def cloudwatch_addon_values(*, cluster_name: str, log_group_name: str, scrape: dict[str, Any]) -> dict[str, Any]:
    """Configuration values of the amazon-cloudwatch-observability add-on."""
    return {
        "agent": {
            "config": {
                "logs": {
                    "metrics_collected": {
                        # Replacing the agent's config replaces its default; keep Container Insights.
                        "kubernetes": {"enhanced_container_insights": True},
                        "prometheus": {
                            "cluster_name": cluster_name,
                            "log_group_name": log_group_name,
                            "prometheus_config_path": AGENT_PROMETHEUS_CONFIG_PATH,
                            "emf_processor": {
                                "metric_namespace": EMF_NAMESPACE,
                                "metric_declaration": _metric_declarations(),
                            },
                        },
                    }
                }
            },
            # The agent runs on every node; the target allocator hands each Ray pod to one agent
            # so that no series is scraped (and billed) once per node.
            "prometheus": {"config": scrape, "targetAllocator": {"enabled": True}},
        }
    }


def scraper_rbac() -> list[dict[str, Any]]:
    """What the AMP scraper may read: pods, for discovery. It scrapes them over the VPC."""
    name = "amp-scraper"
    return [
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "ClusterRole",
            "metadata": {"name": name},
            "rules": [{"apiGroups": [""], "resources": ["pods"], "verbs": ["get", "list", "watch"]}],
        },
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "ClusterRoleBinding",
            "metadata": {"name": name},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": name},
            "subjects": [{"kind": "User", "name": AMP_SCRAPER_USER, "apiGroup": "rbac.authorization.k8s.io"}],
        },
    ]
