"""Who may open a connection to a pod of the serving namespace: its NetworkPolicies, as data.

The Amazon VPC CNI enforces them (``enableNetworkPolicy`` in the add-on's configuration,
``cdk_constructs.cluster``). Ingress only; egress stays open (S3, ECR, Secrets Manager, the store).

- Everything is refused unless a policy below admits it (``default-deny-ingress``).
- Ray's own traffic, between the pods of the Ray cluster (KubeRay's ``ray.io/is-ray-node=yes``),
  on every TCP port except the three that must stay closed to it: the GCS, the raylets, object
  transfers, the core workers, the dashboard and its agents, the client server. Ray picks several
  of these ports at random on each node (the node manager's and the object manager's, the dashboard
  agent's gRPC, the runtime-env agent's, a worker's in 10002-19999), so the rule names what it keeps
  closed rather than what Ray opens: a port Ray adds in a release still works.
- The head's dashboard from the KubeRay operator, which submits the Serve config there and reads
  the app's status (with Ray's token since authOptions).
- Each phase's NIXL side-channel ports from the other phase only: Ray Serve LLM listens at the
  phase's base plus ``replica rank × devices + TP rank`` (``_compute_port_offset``), and the ranks
  Serve hands out stay below what the phase's node group can hold (:func:`replica_ranks`), so
  ``replica_ranks × tensor_parallel_size`` ports from the base. Ports past them would be Ray's own
  range, open to every Ray pod.
- Serve's port on the GPU workers from the internal load balancer, whose addresses are in the VPC's
  private subnets (``ray_service.endpoint.internal_nlb``); without one, from nothing: `kubectl
  port-forward` reaches a pod over its loopback, which no policy sees. The VPC CNI gives pods
  addresses in those subnets too, so this rule cannot tell the NLB from a pod; the API key is what
  stands between a pod and the GPUs.
- The metrics port from the scraper: the CloudWatch agent's namespace (``cloudwatch``) or the
  managed scraper's network interfaces in the VPC (``amp``), and only with a backend.

The kubelet's probes need no rule: the VPC CNI's agent always admits the pod's own node.
"""

from __future__ import annotations

from typing import Any

from config import catalog
from config.schema import AppConfig
from manifests.contract import (
    DASHBOARD_PORT,
    KUBERAY_NAMESPACE,
    KUBERAY_OPERATOR_LABELS,
    METRICS_PORT,
    PHASES,
    RAY_GROUP_LABEL,
    RAY_NODE_LABEL,
    RAY_NODE_TYPE_LABEL,
    SERVE_PORT,
    worker_group_name,
)
from manifests.observability import CLOUDWATCH_NAMESPACE

NAMESPACE_NAME_LABEL = "kubernetes.io/metadata.name"
RAY_PODS = {"matchLabels": {RAY_NODE_LABEL: "yes"}}
HEAD = {"matchLabels": {RAY_NODE_TYPE_LABEL: "head"}}
WORKERS = {"matchLabels": {RAY_NODE_TYPE_LABEL: "worker"}}
HIGHEST_PORT = 65535


def replica_ranks(config: AppConfig, phase: str) -> int:
    """How many replica ranks of a phase's deployment Serve can have handed out at once: as many
    replicas as the phase's node group holds at its largest.

    Not ``max_replicas``. Serve gives a replica the lowest free rank once the replica is placed, in
    its placement group on a node of the phase (Ray 2.58 ``serve/_private/deployment_state.py``:
    ``RankManager.assign_rank``, called from the replica's ``check_ready``, :1448), and frees it
    only after that replica has stopped and its placement group is removed (``check_stopped``, then
    ``release_rank``, :5179-5186). A replica that stops drains for up to its graceful shutdown
    timeout (``drain_timeout_s``, 600 s by default) while its replacement already starts with the
    next rank, and a replacement that fails during that drain adds another: ``max_replicas`` bounds
    none of it. What does bound it: every rank held is a placement group holding GPUs on the
    phase's nodes, so ranks stay below the replicas those nodes hold at once (the same count the
    config rules check ``max_replicas`` against). A node that dies takes its replicas' actors with
    it, and Serve frees their ranks without a drain."""
    group = getattr(config.cluster.gpu_node_groups, phase)
    spec = config.serving.phase(phase)
    per_node = catalog.replicas_per_node(group.instance_type, spec.tensor_parallel_size, spec.gpu_fraction)
    return group.max_size * per_node


def side_channel_ports(config: AppConfig, phase: str) -> tuple[int, int]:
    """(first, last) NIXL side-channel port of a phase's engines, inclusive: every rank Serve can
    give a replica (:func:`replica_ranks`), each ``tensor_parallel_size`` ports."""
    spec = config.serving.phase(phase)
    first = config.serving.side_channel_port(phase)
    return first, first + replica_ranks(config, phase) * spec.tensor_parallel_size - 1


def closed_to_ray(config: AppConfig) -> list[tuple[int, int]]:
    """The port ranges Ray's own traffic may not use: Serve's, the metrics', each phase's side channel."""
    closed = [(SERVE_PORT, SERVE_PORT), (METRICS_PORT, METRICS_PORT)]
    if config.serving.mode == "disaggregated":
        closed += [side_channel_ports(config, phase) for phase in PHASES]
    return sorted(closed)


def open_ranges(closed: list[tuple[int, int]]) -> list[tuple[int, int]]:
    """Every TCP port from 1 to 65535 outside ``closed`` (sorted, inclusive ranges), as ranges."""
    ranges, start = [], 1
    for first, last in closed:
        if first > start:
            ranges.append((start, first - 1))
        start = max(start, last + 1)
    if start <= HIGHEST_PORT:
        ranges.append((start, HIGHEST_PORT))
    return ranges


def _ports(ranges: list[tuple[int, int]]) -> list[dict[str, Any]]:
    return [{"protocol": "TCP", "port": first, **({"endPort": last} if last > first else {})} for first, last in ranges]


def _policy(name: str, namespace: str, selector: dict[str, Any], ingress: list[dict[str, Any]]) -> dict[str, Any]:
    return {
        "apiVersion": "networking.k8s.io/v1",
        "kind": "NetworkPolicy",
        "metadata": {"name": name, "namespace": namespace, "labels": {"app.kubernetes.io/part-of": "pd-serving"}},
        "spec": {"podSelector": selector, "policyTypes": ["Ingress"], "ingress": ingress},
    }


def network_policies(config: AppConfig) -> list[dict[str, Any]]:
    """The serving namespace's NetworkPolicies (``cluster.network_policies`` on)."""
    namespace = config.ray_service.namespace
    policies = [
        _policy("default-deny-ingress", namespace, {}, []),
        _policy(
            "ray-cluster-internal",
            namespace,
            RAY_PODS,
            [{"from": [{"podSelector": RAY_PODS}], "ports": _ports(open_ranges(closed_to_ray(config)))}],
        ),
        _policy(
            "ray-dashboard-from-kuberay",
            namespace,
            HEAD,
            [
                {
                    "from": [
                        {
                            "namespaceSelector": {"matchLabels": {NAMESPACE_NAME_LABEL: KUBERAY_NAMESPACE}},
                            "podSelector": {"matchLabels": dict(KUBERAY_OPERATOR_LABELS)},
                        }
                    ],
                    "ports": _ports([(DASHBOARD_PORT, DASHBOARD_PORT)]),
                }
            ],
        ),
    ]
    if config.serving.mode == "disaggregated":
        for phase, other in zip(PHASES, reversed(PHASES), strict=True):
            policies.append(
                _policy(
                    f"nixl-{phase}-from-{other}",
                    namespace,
                    {"matchLabels": {RAY_GROUP_LABEL: worker_group_name(phase)}},
                    [
                        {
                            "from": [{"podSelector": {"matchLabels": {RAY_GROUP_LABEL: worker_group_name(other)}}}],
                            "ports": _ports([side_channel_ports(config, phase)]),
                        }
                    ],
                )
            )
    if config.ray_service.endpoint.internal_nlb:
        policies.append(
            _policy(
                "serve-from-load-balancer",
                namespace,
                WORKERS,
                [
                    {
                        "from": [{"ipBlock": {"cidr": config.network.vpc_cidr}}],
                        "ports": _ports([(SERVE_PORT, SERVE_PORT)]),
                    }
                ],
            )
        )
    scrapers = scraper_peers(config)
    if scrapers:
        policies.append(
            _policy(
                "metrics-from-scraper",
                namespace,
                RAY_PODS,
                [{"from": scrapers, "ports": _ports([(METRICS_PORT, METRICS_PORT)])}],
            )
        )
    return policies


def scraper_peers(config: AppConfig) -> list[dict[str, Any]]:
    """Where the observability backend scrapes the metrics port from."""
    backend = config.observability.backend
    if backend == "cloudwatch":
        # The agent's pods; a host-network agent comes from its node's address, in the VPC.
        return [
            {"namespaceSelector": {"matchLabels": {NAMESPACE_NAME_LABEL: CLOUDWATCH_NAMESPACE}}},
            {"ipBlock": {"cidr": config.network.vpc_cidr}},
        ]
    if backend == "amp":
        # The managed scraper's network interfaces, in the cluster's private subnets.
        return [{"ipBlock": {"cidr": config.network.vpc_cidr}}]
    return []
