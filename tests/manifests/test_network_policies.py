"""The serving namespace's NetworkPolicies against the connectivity the docs promise
(docs/security.md): every intended connection admitted, every other one refused, as the VPC CNI
evaluates them (``consumers.network_policy``, cross-checked against network-config-analyzer in
tests/consumers/test_network_policy.py), over stand-ins for the pods KubeRay creates.

The stand-ins carry the labels KubeRay 1.7.0 sets on a RayCluster's pods and the operator's labels
as the pinned chart renders them (checked below with the real Helm)."""

from __future__ import annotations

import itertools
from pathlib import Path

import pytest
import yaml

from config.loader import parse_config
from consumers.network_policy import External, Pod, admitted, explain, policy_problems
from manifests.contract import (
    KUBERAY_NAMESPACE,
    KUBERAY_OPERATOR_LABELS,
    KUBERAY_RELEASE,
    RAY_GROUP_LABEL,
    RAY_NODE_LABEL,
    RAY_NODE_TYPE_LABEL,
)
from manifests.network_policies import network_policies
from manifests.observability import CLOUDWATCH_NAMESPACE
from tests.conftest import CONFIG_DIR, ROOT

DOCS = ROOT / "docs" / "security.md"
SYSTEM_NODE, PREFILL_NODE, DECODE_NODE, OTHER_NODE = "system-a", "gpu-prefill-a", "gpu-decode-a", "system-b"
NODE_IPS = {SYSTEM_NODE: "10.40.32.4", PREFILL_NODE: "10.40.48.4", DECODE_NODE: "10.40.48.5", OTHER_NODE: "10.40.33.4"}


def ray_pod(name: str, node_type: str, group: str, ip: str, node: str) -> Pod:
    return Pod(
        name=name,
        namespace="llm",
        labels={RAY_NODE_LABEL: "yes", RAY_NODE_TYPE_LABEL: node_type, RAY_GROUP_LABEL: group},
        namespace_labels={},
        ip=ip,
        node=node,
    )


# Every pod that may open a connection, and what else reaches the pods: the names the table uses.
HEAD = ray_pod("pd-llm-abcde-head", "head", "headgroup", "10.40.32.10", SYSTEM_NODE)
PREFILL = ray_pod("pd-llm-abcde-prefill-gpu-worker-x1", "worker", "prefill-gpu", "10.40.48.11", PREFILL_NODE)
DECODE = ray_pod("pd-llm-abcde-decode-gpu-worker-y1", "worker", "decode-gpu", "10.40.48.12", DECODE_NODE)
OPERATOR = Pod(
    name="kuberay-operator-5d9f-abcde",
    namespace=KUBERAY_NAMESPACE,
    labels=dict(KUBERAY_OPERATOR_LABELS),
    namespace_labels={},
    ip="10.40.33.20",
    node=OTHER_NODE,
)
MIRROR_JOB = Pod(
    name="mirror-qwen-abcde",
    namespace="llm",
    labels={"app.kubernetes.io/name": "model-mirror"},
    namespace_labels={},
    ip="10.40.33.21",
    node=OTHER_NODE,
)
ELSEWHERE = Pod(
    name="some-app-abcde",
    namespace="default",
    labels={"app": "some-app"},
    namespace_labels={},
    ip="10.40.33.22",
    node=OTHER_NODE,
)
CLOUDWATCH_AGENT = Pod(
    name="cloudwatch-agent-abcde",
    namespace=CLOUDWATCH_NAMESPACE,
    labels={"app.kubernetes.io/name": "cloudwatch-agent"},
    namespace_labels={},
    ip="10.40.33.23",
    node=OTHER_NODE,
)
NLB = External("internal NLB", "10.40.16.30")
OUTSIDE = External("a client outside the VPC", "203.0.113.7")
SOURCES = {
    "head": HEAD,
    "prefill": PREFILL,
    "decode": DECODE,
    "KubeRay operator": OPERATOR,
    "another pod in llm": MIRROR_JOB,
    "a pod in another namespace": ELSEWHERE,
    "CloudWatch agent": CLOUDWATCH_AGENT,
    "internal NLB": NLB,
    "outside the VPC": OUTSIDE,
}
DESTINATIONS = {"head": HEAD, "prefill": PREFILL, "decode": DECODE}
# The ports a Ray pod listens on (a raylet's and a core worker's are random: two stand for them).
PORTS = {
    "GCS 6379": 6379,
    "dashboard 8265": 8265,
    "client 10001": 10001,
    "a worker 10005": 10005,
    "a raylet 41234": 41234,
    "dashboard agent 52365": 52365,
    "Serve 8000": 8000,
    "metrics 8080": 8080,
    "NIXL prefill 20000": 20000,
    "NIXL decode 22000": 22000,
}
RAY = {"head", "prefill", "decode"}
RAY_INTERNAL = {
    "GCS 6379",
    "dashboard 8265",
    "client 10001",
    "a worker 10005",
    "a raylet 41234",
    "dashboard agent 52365",
}
VPC = {"head", "prefill", "decode", "KubeRay operator", "another pod in llm", "a pod in another namespace",
       "CloudWatch agent", "internal NLB"}  # fmt: skip


RAY_PODS = "the Ray pods (head, prefill, decode)"
IN_THE_VPC = "any address in the VPC: pods of every namespace, the NLB, the nodes"
GROUPS = {RAY_PODS: RAY, IN_THE_VPC: VPC, "the GPU workers (prefill, decode)": {"prefill", "decode"}}
# The connectivity docs/security.md promises, row by row: (from, to, ports). Nothing else gets through.
TABLES = {
    "dev": [
        (RAY_PODS, RAY_PODS, sorted(RAY_INTERNAL, key=list(PORTS).index)),
        ("KubeRay operator", "head", ["dashboard 8265"]),
        ("decode", "prefill", ["NIXL prefill 20000"]),
        ("prefill", "decode", ["NIXL decode 22000"]),
        # amp: the managed scraper's interfaces have no fixed address in the private subnets.
        (IN_THE_VPC, RAY_PODS, ["metrics 8080"]),
    ],
}
# cloudwatch (the agent's namespace, or a host-network agent's node) and the internal NLB (Serve on
# the workers, from the VPC: the NLB's addresses, and with them every pod's).
TABLES["nlb-cloudwatch"] = [*TABLES["dev"], (IN_THE_VPC, "the GPU workers (prefill, decode)", ["Serve 8000"])]


def intended(variant: str) -> set[tuple[str, str, str]]:
    """(source, destination, port) of every connection that must get through."""
    return {
        (source, destination, port)
        for sources, destinations, ports in TABLES[variant]
        for source in GROUPS.get(sources, {sources})
        for destination in GROUPS.get(destinations, {destinations})
        for port in ports
    }


VARIANTS = {
    "dev": {},
    "nlb-cloudwatch": {
        "ray_service": {
            "endpoint": {"internal_nlb": True, "allowed_cidrs": ["10.0.0.0/8"], "open_to_vpc_without_key": True}
        },
        "observability": {"backend": "cloudwatch"},
    },
}


def policies_of(variant: str) -> list[dict]:
    data = yaml.safe_load((CONFIG_DIR / "dev.yaml").read_text())
    for section, values in VARIANTS[variant].items():
        data.setdefault(section, {}).update(values)
    return network_policies(parse_config(data))


@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_every_policy_is_one_the_api_server_and_the_agent_take(variant):
    for policy in policies_of(variant):
        assert policy_problems(policy) == [], policy["metadata"]["name"]


@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_exactly_the_intended_connections_get_through(variant):
    policies = policies_of(variant)
    pods = [p for p in SOURCES.values() if isinstance(p, Pod)]
    expected = intended(variant)
    wrong = []
    for (source, src), (destination, dst), (port_name, port) in itertools.product(
        SOURCES.items(), DESTINATIONS.items(), PORTS.items()
    ):
        if source == destination:
            continue  # a pod reaching itself is never refused
        verdict = explain(policies, src, dst, port, pods=pods)
        if verdict.admitted != ((source, destination, port_name) in expected):
            wrong.append(verdict.reason)
    assert wrong == []


def test_the_pods_own_node_reaches_every_port_the_kubelets_probes_included():
    policies = policies_of("dev")
    for pod in DESTINATIONS.values():
        kubelet = External("kubelet", NODE_IPS[pod.node], node=pod.node)
        assert all(admitted(policies, kubelet, pod, port) for port in PORTS.values())
        # Another node's address is only an address in the VPC: the metrics port (amp), nothing of Ray's.
        other_node = External("another node", NODE_IPS[OTHER_NODE], node=OTHER_NODE)
        assert not admitted(policies, other_node, pod, 52365)
        assert admitted(policies, other_node, pod, 8080)


def nixl_policy(policies: list[dict], phase: str) -> dict:
    (policy,) = [p for p in policies if p["metadata"]["name"].startswith(f"nixl-{phase}-from-")]
    return policy


def test_the_nixl_ports_follow_the_phases_node_group_and_tensor_parallelism():
    """Every rank the node group can hold replicas for, each tensor_parallel_size ports: prefill on
    three 4-GPU nodes with TP 2 holds 6 replicas (max_replicas 1 or not), so 12 ports."""
    data = yaml.safe_load((CONFIG_DIR / "dev.yaml").read_text())
    data["serving"]["prefill"] = {**data["serving"].get("prefill", {}), "max_replicas": 1, "tensor_parallel_size": 2}
    data["cluster"]["gpu_node_groups"]["prefill"].update(instance_type="g6.12xlarge", max_size=3)
    policies = network_policies(parse_config(data))
    assert nixl_policy(policies, "prefill")["spec"]["ingress"][0]["ports"] == [
        {"protocol": "TCP", "port": 20000, "endPort": 20011}
    ]
    for port in (20000, 20011):
        assert admitted(policies, DECODE, PREFILL, port)
        assert not admitted(policies, HEAD, PREFILL, port)
    assert admitted(policies, HEAD, PREFILL, 20012)  # past the side channel: Ray's own range again


def tp_worker_ports(config, phase: str, rank: int) -> list[int]:
    """Ray Serve LLM's side-channel ports of a replica of ``rank``: base + rank x devices, plus each
    TP worker's rank (kv_transfer/nixl.py ``_set_side_channel_port``, base.py ``_compute_port_offset``)."""
    tp = config.serving.phase(phase).tensor_parallel_size
    return [config.serving.side_channel_port(phase) + rank * tp + tp_rank for tp_rank in range(tp)]


def wrongly_reached(policies, config, phase: str, ranks) -> list[str]:
    """Who gets to the side channel of ``ranks`` but should not, or should but does not: the other
    phase, and no one else (the head stands for every other Ray pod)."""
    destination, other = (PREFILL, DECODE) if phase == "prefill" else (DECODE, PREFILL)
    return [
        explain(policies, source, destination, port, pods=[HEAD, PREFILL, DECODE]).reason
        for rank in ranks
        for port in tp_worker_ports(config, phase, rank)
        for source, expected in ((other, True), (HEAD, False))
        if admitted(policies, source, destination, port) != expected
    ]


@pytest.mark.parametrize("env", ["dev", "prod"])
@pytest.mark.parametrize("phase", ["prefill", "decode"])
def test_a_replacement_replicas_side_channel_is_the_other_phases_only(env, phase):
    """Serve frees a replica's rank only once it has stopped (drained), so a replacement started
    meanwhile gets rank max_replicas: its side channel is the other phase's only, as the first's is."""
    config = parse_config(yaml.safe_load((CONFIG_DIR / f"{env}.yaml").read_text()))
    max_replicas = config.serving.phase(phase).max_replicas
    assert wrongly_reached(network_policies(config), config, phase, [0, max_replicas]) == []


@pytest.mark.parametrize("env", ["dev", "prod"])
@pytest.mark.parametrize("phase", ["prefill", "decode"])
def test_every_rank_serve_can_give_is_the_other_phases_only_and_no_more(env, phase):
    """Every rank below ``replica_ranks`` (what the node group holds), and past the last one
    Ray's own range again."""
    from manifests.network_policies import replica_ranks, side_channel_ports

    config = parse_config(yaml.safe_load((CONFIG_DIR / f"{env}.yaml").read_text()))
    policies = network_policies(config)
    ranks = range(replica_ranks(config, phase))
    assert wrongly_reached(policies, config, phase, ranks) == []
    last = tp_worker_ports(config, phase, ranks[-1])[-1]
    assert last == side_channel_ports(config, phase)[1]
    assert admitted(policies, HEAD, PREFILL if phase == "prefill" else DECODE, last + 1)


@pytest.mark.serving
def test_serves_ranks_stay_below_the_bound_however_replicas_stop_and_start():
    """Ray Serve's own rank manager, driven through random starts and slow stops of a phase's
    replicas, with as many rank holders at once as the node group holds placement groups: every rank
    it gives stays below ``replica_ranks``, and ranks reach past max_replicas."""
    import random

    ray_state = pytest.importorskip("ray.serve._private.deployment_state")
    from manifests.network_policies import replica_ranks

    config = parse_config(yaml.safe_load((CONFIG_DIR / "prod.yaml").read_text()))
    for phase in ("prefill", "decode"):
        bound, max_replicas = replica_ranks(config, phase), config.serving.phase(phase).max_replicas
        seen: set[int] = set()
        for seed in range(20):
            chance = random.Random(seed)
            ranks = ray_state.DeploymentRankManager()
            holders: list[str] = []  # replicas placed and not yet stopped: each holds a placement group
            for step in range(200):
                if len(holders) < bound and (not holders or chance.random() < 0.6):
                    replica = f"{seed}-{step}"
                    seen.add(ranks.assign_rank(replica, f"node-{chance.randrange(8)}").rank)
                    holders.append(replica)
                else:
                    ranks.release_rank(holders.pop(chance.randrange(len(holders))))
        assert max(seen) == bound - 1 and max(seen) >= max_replicas, (phase, sorted(seen))


def test_without_network_policies_none_are_rendered_and_the_cni_enforces_nothing(variant):
    data = yaml.safe_load((CONFIG_DIR / "dev.yaml").read_text())
    data["cluster"]["network_policies"] = False
    stack, template, _ = variant("no-network-policies", data)
    assert stack.serving.network_policies is None
    (cni,) = [
        r for r in template.find_resources("AWS::EKS::Addon").values() if r["Properties"]["AddonName"] == "vpc-cni"
    ]
    assert "ConfigurationValues" not in cni["Properties"]


def test_the_stack_turns_the_cnis_enforcement_on_and_applies_the_policies_first(synthesized):
    import json

    _, stack, template, _, _ = synthesized("dev")
    (cni,) = [
        r for r in template.find_resources("AWS::EKS::Addon").values() if r["Properties"]["AddonName"] == "vpc-cni"
    ]
    assert json.loads(cni["Properties"]["ConfigurationValues"]) == {"enableNetworkPolicy": "true"}
    depends_on = {d.node.path for d in stack.serving.manifest.node.dependencies}
    assert stack.serving.network_policies.node.path in depends_on


def test_a_vpc_cni_that_cannot_enforce_them_is_refused():
    from tests.config.helpers import problems_for

    data = yaml.safe_load((CONFIG_DIR / "dev.yaml").read_text())
    data["cluster"]["addon_versions"] = {"vpc-cni": "v1.13.4-eksbuild.1"}
    assert problems_for(data).endswith(
        "network_policies is on, but addon_versions.vpc-cni v1.13.4-eksbuild.1 cannot enforce NetworkPolicy (the "
        "VPC CNI's network policy agent arrived in v1.14.0); use a newer vpc-cni version or leave it out (EKS's "
        "default for the cluster's version has it)"
    )


@pytest.mark.consumer  # the chart rendered by Helm
def test_the_operator_labels_are_the_ones_the_pinned_chart_gives_its_pod():
    """The real Helm renders KubeRay's chart at its pin: the policy's selector matches its pod."""
    from config import versions
    from consumers import charts

    archive = charts.chart_archive(versions.KUBERAY_OPERATOR.chart, versions.KUBERAY_OPERATOR.version)
    objects = charts.rendered_objects(
        charts.render(archive, release=KUBERAY_RELEASE, namespace=KUBERAY_NAMESPACE, values={}, kube_version="1.36")
    )
    (deployment,) = [o for o in objects if o["kind"] == "Deployment"]
    labels = deployment["spec"]["template"]["metadata"]["labels"]
    assert KUBERAY_OPERATOR_LABELS.items() <= labels.items()


def table_rows(variant: str) -> list[str]:
    return [f"| {sources} | {destinations} | {', '.join(ports)} |" for sources, destinations, ports in TABLES[variant]]


@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_the_docs_table_is_the_one_tested(variant):
    text = Path(DOCS).read_text()
    missing = [row for row in table_rows(variant) if row not in text]
    assert missing == [], "\n".join(missing)


def test_the_docs_state_the_ranks_dev_and_prod_open():
    from manifests.network_policies import replica_ranks

    ranks = {
        env: {phase: replica_ranks(parse_config(yaml.safe_load((CONFIG_DIR / f"{env}.yaml").read_text())), phase)
              for phase in ("prefill", "decode")}
        for env in ("dev", "prod")
    }  # fmt: skip
    assert ranks["dev"]["prefill"] == ranks["dev"]["decode"]
    text = " ".join(DOCS.read_text().split())
    stated = (
        f"dev: {ranks['dev']['prefill']} per phase, prod: {ranks['prod']['prefill']} for prefill and "
        f"{ranks['prod']['decode']} for decode"
    )
    assert stated in text


# Linux's default ip_local_port_range, where UCX's TCP transport binds its listeners (UCX_TCP_PORT_RANGE "0").
EPHEMERAL_PORTS = (32768, 45000, 60999)


def test_the_ucx_fallback_reaches_the_other_phase_on_the_ports_it_picks():
    """backend: UCX moves KV over TCP between the GPU pods, on ephemeral ports: the Ray-to-Ray policy admits
    them both ways, as it keeps closed only Serve's, the metrics' and the side channels' ports."""
    data = yaml.safe_load((CONFIG_DIR / "dev.yaml").read_text())
    data["serving"].setdefault("kv_transfer", {})["backend"] = "UCX"
    policies = network_policies(parse_config(data))
    pods = [p for p in SOURCES.values() if isinstance(p, Pod)]
    for source, destination in (("decode", "prefill"), ("prefill", "decode")):
        for port in EPHEMERAL_PORTS:
            verdict = explain(policies, SOURCES[source], DESTINATIONS[destination], port, pods=pods)
            assert verdict.admitted, verdict.reason
