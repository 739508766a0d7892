"""consumers/network_policy.py: NetworkPolicy ingress as the Amazon VPC CNI enforces it.

The examples follow https://kubernetes.io/docs/concepts/services-networking/network-policies/; the
VPC CNI's own behaviour is cited in the module's docstring. The last tests cross-check the evaluator
against an independent one, IBM's network-config-analyzer (NCA, in .venv-nca), on a sample cluster.
"""

from __future__ import annotations

import dataclasses
import ipaddress
import re
import subprocess
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import pytest
import yaml

from consumers.network_policy import External, Pod, admitted, explain, policy_problems
from tests.conftest import ROOT

NCA = ROOT / ".venv-nca" / "bin" / "nca"


def netpol(name: str, namespace: str = "default", **spec: Any) -> dict:
    return {
        "apiVersion": "networking.k8s.io/v1",
        "kind": "NetworkPolicy",
        "metadata": {"name": name, "namespace": namespace},
        "spec": spec,
    }


_ips = (f"10.244.0.{i}" for i in range(2, 250))


def pod(
    name: str,
    namespace: str = "default",
    *,
    labels: dict[str, str] | None = None,
    namespace_labels: dict[str, str] | None = None,
    ip: str | None = None,
    node: str = "node-a",
    **kwargs: Any,
) -> Pod:
    return Pod(
        name=name,
        namespace=namespace,
        labels=labels or {},
        namespace_labels=namespace_labels or {},
        ip=ip or next(_ips),
        node=node,
        **kwargs,
    )


DENY_ALL = netpol("default-deny-ingress", podSelector={}, policyTypes=["Ingress"])
ALLOW_ALL = netpol("allow-all-ingress", podSelector={}, ingress=[{}], policyTypes=["Ingress"])


# --- isolation -----------------------------------------------------------------------------------


def test_no_policy_admits_everything():
    db, client = pod("db"), pod("client")
    assert admitted([], client, db, 5432)
    assert admitted([], External("internet", "203.0.113.9"), db, 1, "UDP")


def test_default_deny_refuses_every_pod_and_address():
    db, client = pod("db"), pod("client")
    assert not admitted([DENY_ALL], client, db, 5432)
    assert not admitted([DENY_ALL], External("internet", "203.0.113.9"), db, 5432)
    assert not admitted([DENY_ALL], client, db, 53, "UDP")


def test_allow_all_wins_over_default_deny():
    db, client = pod("db"), pod("client")
    assert admitted([DENY_ALL, ALLOW_ALL], client, db, 5432)
    assert admitted([DENY_ALL, ALLOW_ALL], External("internet", "203.0.113.9"), db, 9, "SCTP")


def test_a_policy_in_another_namespace_does_not_isolate():
    db, client = pod("db", "prod"), pod("client", "prod")
    deny_elsewhere = netpol("default-deny-ingress", "staging", podSelector={}, policyTypes=["Ingress"])
    assert admitted([deny_elsewhere], client, db, 5432)


def test_an_egress_only_policy_does_not_isolate_ingress():
    db, client = pod("db"), pod("client")
    egress_only = netpol("deny-egress", podSelector={}, policyTypes=["Egress"])
    assert admitted([egress_only], client, db, 5432)


def test_policy_types_default_to_ingress_even_with_only_egress_rules():
    # "all policies (whether or not they contain an ingress section) are assumed to affect ingress"
    db, client = pod("db"), pod("client")
    egress_rules_only = netpol("egress", podSelector={}, egress=[{"to": [{"podSelector": {}}]}])
    assert not admitted([egress_rules_only], client, db, 5432)


def test_a_policy_isolates_only_the_pods_it_selects():
    db, cache, client = pod("db", labels={"role": "db"}), pod("cache", labels={"role": "cache"}), pod("client")
    deny_db = netpol("deny-db", podSelector={"matchLabels": {"role": "db"}}, policyTypes=["Ingress"])
    assert not admitted([deny_db], client, db, 5432)
    assert admitted([deny_db], client, cache, 6379)


def test_match_labels_and_match_expressions_must_all_hold():
    selector = {
        "matchLabels": {"app": "db"},
        "matchExpressions": [
            {"key": "tier", "operator": "In", "values": ["backend", "storage"]},
            {"key": "env", "operator": "NotIn", "values": ["dev"]},
            {"key": "owner", "operator": "Exists"},
            {"key": "legacy", "operator": "DoesNotExist"},
        ],
    }
    deny = netpol("deny", podSelector=selector, policyTypes=["Ingress"])
    client = pod("client")
    base = {"app": "db", "tier": "storage", "owner": "team-a"}
    assert not admitted([deny], client, pod("selected", labels=base), 5432)
    assert not admitted([deny], client, pod("env-prod", labels={**base, "env": "prod"}), 5432)
    for changed in ({"app": "web"}, {"tier": "frontend"}, {"env": "dev"}, {"legacy": "yes"}):
        assert admitted([deny], client, pod("not-selected", labels={**base, **changed}), 5432), changed
    no_owner = {k: v for k, v in base.items() if k != "owner"}
    assert admitted([deny], client, pod("no-owner", labels=no_owner), 5432)


# --- from: the docs' example, and AND versus OR --------------------------------------------------

# The docs' "test-network-policy", its ingress half.
DOCS_EXAMPLE = netpol(
    "test-network-policy",
    podSelector={"matchLabels": {"role": "db"}},
    policyTypes=["Ingress"],
    ingress=[
        {
            "from": [
                {"ipBlock": {"cidr": "172.17.0.0/16", "except": ["172.17.1.0/24"]}},
                {"namespaceSelector": {"matchLabels": {"project": "myproject"}}},
                {"podSelector": {"matchLabels": {"role": "frontend"}}},
            ],
            "ports": [{"protocol": "TCP", "port": 6379}],
        }
    ],
)
DB = pod("db", labels={"role": "db"})


def test_docs_example_pod_selector_admits_frontends_in_the_policy_namespace():
    assert admitted([DOCS_EXAMPLE], pod("frontend", labels={"role": "frontend"}), DB, 6379)
    assert not admitted([DOCS_EXAMPLE], pod("frontend", labels={"role": "frontend"}), DB, 6380)
    assert not admitted([DOCS_EXAMPLE], pod("frontend", labels={"role": "frontend"}), DB, 6379, "UDP")
    assert not admitted([DOCS_EXAMPLE], pod("backend", labels={"role": "backend"}), DB, 6379)


def test_docs_example_pod_selector_alone_means_the_policy_namespace():
    elsewhere = pod("frontend", "other", labels={"role": "frontend"})
    assert not admitted([DOCS_EXAMPLE], elsewhere, DB, 6379)


def test_docs_example_namespace_selector_alone_admits_every_pod_there():
    anyone = pod("anything", "myproject", namespace_labels={"project": "myproject"})
    assert admitted([DOCS_EXAMPLE], anyone, DB, 6379)


def test_docs_example_ip_block_with_except():
    assert admitted([DOCS_EXAMPLE], External("lb", "172.17.0.5"), DB, 6379)
    assert admitted([DOCS_EXAMPLE], External("lb", "172.17.255.255"), DB, 6379)
    assert not admitted([DOCS_EXAMPLE], External("excepted", "172.17.1.5"), DB, 6379)
    assert not admitted([DOCS_EXAMPLE], External("outside", "172.18.0.1"), DB, 6379)


ALICE = {"user": "alice"}
AND_PEER = netpol(
    "and",
    podSelector={},
    ingress=[
        {"from": [{"namespaceSelector": {"matchLabels": ALICE}, "podSelector": {"matchLabels": {"role": "client"}}}]}
    ],
)
OR_PEERS = netpol(
    "or",
    podSelector={},
    ingress=[
        {"from": [{"namespaceSelector": {"matchLabels": ALICE}}, {"podSelector": {"matchLabels": {"role": "client"}}}]}
    ],
)


@pytest.mark.parametrize(
    "source, in_and, in_or",
    [
        (pod("client", "alice-ns", labels={"role": "client"}, namespace_labels=ALICE), True, True),
        (pod("other", "alice-ns", labels={"role": "other"}, namespace_labels=ALICE), False, True),
        (pod("client", "default", labels={"role": "client"}), False, True),
        (pod("client", "bob-ns", labels={"role": "client"}, namespace_labels={"user": "bob"}), False, False),
    ],
    ids=["client-in-alice", "other-in-alice", "client-in-policy-namespace", "client-in-bob"],
)
def test_docs_and_versus_or(source, in_and, in_or):
    """One peer with both selectors is an AND; two peers are an OR (the docs' two examples)."""
    db = pod("db")
    assert admitted([AND_PEER], source, db, 80) is in_and
    assert admitted([OR_PEERS], source, db, 80) is in_or


def test_namespace_selector_sees_the_metadata_name_label():
    system = pod("operator", "kuberay-system")
    assert system.namespace_labels == {"kubernetes.io/metadata.name": "kuberay-system"}
    by_name = netpol(
        "from-system",
        podSelector={},
        ingress=[{"from": [{"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "kuberay-system"}}}]}],
    )
    assert admitted([by_name], system, pod("head"), 8265)
    assert not admitted([by_name], pod("other", "llm"), pod("head"), 8265)


def test_empty_selectors_in_a_peer():
    every_namespace = netpol("all-ns", podSelector={}, ingress=[{"from": [{"namespaceSelector": {}}]}])
    same_namespace = netpol("same-ns", podSelector={}, ingress=[{"from": [{"podSelector": {}}]}])
    far = pod("far", "elsewhere")
    assert admitted([every_namespace], far, pod("db"), 1)
    assert not admitted([same_namespace], far, pod("db"), 1)
    assert admitted([same_namespace], pod("near"), pod("db"), 1)
    assert not admitted([every_namespace], External("internet", "203.0.113.9"), pod("db"), 1)


def test_rules_and_policies_are_a_union():
    web = {"podSelector": {"matchLabels": {"app": "web"}}}
    first = netpol("first", podSelector={}, ingress=[{"from": [web], "ports": [{"port": 80}]}])
    second = netpol(
        "second",
        podSelector={},
        ingress=[{"ports": [{"port": 443}]}, {"from": [web], "ports": [{"port": 8080}]}],
    )
    server, client = pod("server"), pod("client", labels={"app": "web"})
    assert [p for p in (80, 443, 8080, 9090) if admitted([first, second], client, server, p)] == [80, 443, 8080]
    assert [p for p in (80, 443, 8080) if admitted([first, second], pod("stranger"), server, p)] == [443]


# --- ports ---------------------------------------------------------------------------------------


def test_end_port_is_an_inclusive_range():
    # The docs' multi-port example: TCP 32000 to 32768.
    policy = netpol(
        "range", podSelector={}, ingress=[{"ports": [{"protocol": "TCP", "port": 32000, "endPort": 32768}]}]
    )
    server, client = pod("server"), pod("client")
    verdicts = {p: admitted([policy], client, server, p) for p in (31999, 32000, 32500, 32768, 32769)}
    assert verdicts == {31999: False, 32000: True, 32500: True, 32768: True, 32769: False}
    assert not admitted([policy], client, server, 32000, "UDP")


def test_protocol_defaults_to_tcp_and_a_port_without_number_is_every_port():
    policy = netpol("dns", podSelector={}, ingress=[{"ports": [{"port": 53}, {"protocol": "UDP"}]}])
    server, client = pod("server"), pod("client")
    assert admitted([policy], client, server, 53)
    assert not admitted([policy], client, server, 54)
    assert admitted([policy], client, server, 54, "UDP")
    assert not admitted([policy], client, server, 53, "SCTP")


def test_named_ports_resolve_on_each_destination():
    policy = netpol("http", podSelector={}, ingress=[{"ports": [{"port": "http"}]}])
    api = pod("api", ports={"http": (8080, "TCP")})
    web = pod("web", ports={"http": (9090, "TCP")})
    udp = pod("udp", ports={"http": (8080, "UDP")})
    nameless = pod("nameless", ports={"metrics": (8080, "TCP")})
    client = pod("client")
    assert admitted([policy], client, api, 8080) and not admitted([policy], client, api, 9090)
    assert admitted([policy], client, web, 9090) and not admitted([policy], client, web, 8080)
    assert not admitted([policy], client, udp, 8080), "the policy's port is TCP, the container's UDP"
    assert not admitted([policy], client, udp, 8080, "UDP")
    assert not admitted([policy], client, nameless, 8080), "a name the pod lacks matches nothing"


def test_a_rule_whose_named_ports_resolve_nowhere_is_dropped_but_others_stay():
    policy = netpol(
        "mixed",
        podSelector={},
        ingress=[{"ports": [{"port": "nosuch"}]}, {"ports": [{"port": "nosuch"}, {"port": 9000}]}],
    )
    server, client = pod("server", ports={"http": (8080, "TCP")}), pod("client")
    assert admitted([policy], client, server, 9000)
    assert not admitted([policy], client, server, 8080)


# --- the VPC CNI's own behaviour -----------------------------------------------------------------


def test_an_ip_block_also_matches_pods_inside_it():
    """Pod IPs are VPC addresses, and the agent matches addresses: a VPC-wide ipBlock admits pods."""
    vpc = netpol("from-vpc", podSelector={}, ingress=[{"from": [{"ipBlock": {"cidr": "10.0.0.0/16"}}]}])
    inside, outside = pod("inside", ip="10.0.3.4"), pod("outside", ip="10.1.3.4")
    assert admitted([vpc], inside, pod("db"), 5432)
    assert not admitted([vpc], outside, pod("db"), 5432)


def test_the_destination_node_is_always_admitted():
    db = pod("db", node="node-a", node_ip="10.0.0.11")
    kubelet = External("kubelet", "10.0.0.11", node="node-a")
    other_kubelet = External("kubelet-b", "10.0.0.12", node="node-b")
    assert admitted([DENY_ALL], kubelet, db, 8080)
    assert admitted([DENY_ALL], External("by-address", "10.0.0.11"), db, 8080), "the agent matches the node's IP"
    assert not admitted([DENY_ALL], other_kubelet, db, 8080)
    # Without the destination's node_ip, the node named by the source stands in for it.
    assert admitted([DENY_ALL], kubelet, pod("db2", node="node-a"), 8080)


def test_a_pod_cannot_block_access_to_itself():
    db = pod("db")
    assert admitted([DENY_ALL], db, db, 5432)


def test_host_network_destinations_are_never_isolated():
    exporter = pod("node-exporter", host_network=True, node_ip="10.0.0.11", ip="10.0.0.11")
    assert admitted([DENY_ALL], pod("client"), exporter, 9100)
    assert "hostNetwork" in str(explain([DENY_ALL], pod("client"), exporter, 9100))


def test_a_host_network_source_is_its_node_address():
    db = pod("db", node="node-a", node_ip="10.0.0.11")
    here = pod("agent", host_network=True, node="node-a", node_ip="10.0.0.11", ip="10.0.0.11")
    there = pod("agent-b", host_network=True, node="node-b", node_ip="10.0.0.12", ip="10.0.0.12")
    nodes = netpol("from-nodes", podSelector={}, ingress=[{"from": [{"ipBlock": {"cidr": "10.0.0.0/24"}}]}])
    pods_only = netpol("from-pods", podSelector={}, ingress=[{"from": [{"podSelector": {"matchLabels": {"x": "y"}}}]}])
    assert admitted([DENY_ALL], here, db, 5432), "its node is the destination's"
    assert not admitted([DENY_ALL], there, db, 5432)
    assert admitted([nodes], there, db, 5432)
    assert not admitted([pods_only], there, db, 5432)


def test_selecting_a_host_network_pod_admits_its_whole_node():
    """The controller resolves a selected hostNetwork pod to its IP, the node's, so everything on
    that node gets in (TestEndpointsResolver_IncludesHostNetworkPodsInIngressEgressRules)."""
    db = pod("db", node="node-a")
    agent = pod("agent", labels={"app": "agent"}, host_network=True, node="node-b", node_ip="10.0.0.12", ip="10.0.0.12")
    from_agent = netpol(
        "from-agent", podSelector={}, ingress=[{"from": [{"podSelector": {"matchLabels": {"app": "agent"}}}]}]
    )
    assert admitted([from_agent], agent, db, 5432)
    neighbour = External("node-b-process", "10.0.0.12", node="node-b")
    assert admitted([from_agent], neighbour, db, 5432, pods=[agent])
    assert not admitted([from_agent], neighbour, db, 5432), "without the agent pod, nothing selects 10.0.0.12"


def test_a_rule_for_exactly_the_node_address_replaces_its_allow_all():
    """The agent writes the node's allow-all first and a rule's entry for the same /32 over it."""
    db = pod("db", node="node-a", node_ip="10.0.0.11")
    kubelet = External("kubelet", "10.0.0.11", node="node-a")
    node_on_443 = netpol(
        "node-443",
        podSelector={},
        ingress=[{"from": [{"ipBlock": {"cidr": "10.0.0.11/32"}}], "ports": [{"port": 443}]}],
    )
    assert admitted([node_on_443], kubelet, db, 443)
    assert not admitted([node_on_443], kubelet, db, 8080)
    wider = netpol(
        "subnet-443",
        podSelector={},
        ingress=[{"from": [{"ipBlock": {"cidr": "10.0.0.0/24"}}], "ports": [{"port": 443}]}],
    )
    assert admitted([wider], kubelet, db, 8080), "a wider block leaves the node's own entry alone"


def test_named_ports_resolve_over_every_pod_the_policy_selects():
    """The controller resolves a named port over all the policy's pods and gives the union to each."""
    policy = netpol("http", podSelector={}, ingress=[{"ports": [{"port": "http"}]}])
    api = pod("api", ports={"http": (8080, "TCP")})
    web = pod("web", ports={"http": (9090, "TCP"), "admin": (8080, "TCP")})
    client = pod("client")
    assert not admitted([policy], client, web, 8080), "alone, web's http is 9090"
    assert admitted([policy], client, web, 8080, pods=[api]), "with api selected too, http is 8080 and 9090"
    assert admitted([policy], client, api, 9090, pods=[web])


def test_an_except_shadows_an_every_source_rule():
    """The agent writes an except CIDR as a deny-all entry, and the longest prefix wins, so it also
    refuses what a broader rule admits (compare aws/aws-network-policy-agent#180)."""
    lb = netpol(
        "from-lb",
        podSelector={},
        ingress=[
            {"from": [{"ipBlock": {"cidr": "10.0.0.0/16", "except": ["10.0.99.0/24"]}}], "ports": [{"port": 8000}]}
        ],
    )
    health = netpol("health", podSelector={}, ingress=[{"ports": [{"port": 52365}]}])
    head = pod("head")
    assert admitted([health], External("excepted", "10.0.99.7"), head, 52365)
    assert not admitted([lb, health], External("excepted", "10.0.99.7"), head, 52365)
    assert admitted([lb, health], External("elsewhere", "192.168.1.1"), head, 52365)
    assert admitted([lb, health], External("inside", "10.0.7.7"), head, 52365), (
        "a narrower CIDR inherits the broader's ports"
    )
    assert "denies all" in str(explain([lb, health], External("excepted", "10.0.99.7"), head, 52365))
    # A pod in the excepted range that a selector names gets its own /32, which inherits /0's ports.
    ray = pod("ray-worker", labels={"ray": "yes"}, ip="10.0.99.8")
    internal = netpol(
        "internal",
        podSelector={},
        ingress=[{"from": [{"podSelector": {"matchLabels": {"ray": "yes"}}}], "ports": [{"port": 6379}]}],
    )
    assert admitted([lb, health, internal], ray, head, 52365)
    assert not admitted([lb, health, internal], ray, head, 8000)


def test_an_except_named_exactly_by_another_rule_keeps_that_rule():
    lb = netpol(
        "from-lb",
        podSelector={},
        ingress=[
            {"from": [{"ipBlock": {"cidr": "10.0.0.0/16", "except": ["10.0.99.0/24"]}}], "ports": [{"port": 8000}]},
            {"from": [{"ipBlock": {"cidr": "10.0.99.0/24"}}], "ports": [{"port": 9000}]},
        ],
    )
    head, excepted = pod("head"), External("excepted", "10.0.99.7")
    assert admitted([lb], excepted, head, 9000)
    assert not admitted([lb], excepted, head, 8000)


def test_pods_that_share_the_agent_identifier_share_policies():
    """web-0 and web-1 are both "web" to the agent: a policy that selects one applies to both."""
    web0 = pod("web-0", labels={"statefulset.kubernetes.io/pod-name": "web-0"})
    web1 = pod("web-1", labels={"statefulset.kubernetes.io/pod-name": "web-1"})
    only_web0 = netpol(
        "deny-web-0",
        podSelector={"matchLabels": {"statefulset.kubernetes.io/pod-name": "web-0"}},
        policyTypes=["Ingress"],
    )
    client = pod("client")
    assert admitted([only_web0], client, web1, 80)
    assert not admitted([only_web0], client, web1, 80, pods=[web0])
    assert admitted([only_web0], client, pod("api-0"), 80, pods=[web0])


def test_more_than_24_port_combinations_in_one_entry_are_refused():
    def ports(start: int) -> list[dict]:
        return [{"port": p} for p in range(start, start + 13)]

    first = netpol("first", podSelector={}, ingress=[{"ports": ports(1000)}])
    second = netpol("second", podSelector={}, ingress=[{"ports": ports(2000)}])
    assert admitted([first], pod("client"), pod("db"), 1000)
    with pytest.raises(ValueError, match="the entry for 0.0.0.0/0 has 26 port/protocol combinations"):
        admitted([first, second], External("internet", "203.0.113.9"), pod("db"), 1000)
    with pytest.raises(ValueError, match="26 port/protocol combinations; the agent keeps an arbitrary 24"):
        admitted([first, second], pod("client"), pod("db"), 1000)


# --- explain and the model's own checks ----------------------------------------------------------


def test_explain_names_the_rule_or_the_reason():
    frontend = pod("frontend", labels={"role": "frontend"}, ip="10.244.9.1")
    yes = explain([DOCS_EXAMPLE], frontend, DB, 6379)
    assert yes.admitted
    assert str(yes) == (
        "admitted: default/frontend (10.244.9.1) -> default/db:6379/TCP: default/test-network-policy ingress[0] "
        "admits TCP 6379 (entry 10.244.9.1/32)"
    )
    no = explain([DOCS_EXAMPLE], frontend, DB, 80)
    assert str(no) == (
        "refused: default/frontend (10.244.9.1) -> default/db:80/TCP: isolated by default/test-network-policy; "
        "the entry 10.244.9.1/32 for 10.244.9.1 admits only TCP 6379"
    )
    nobody = explain([DOCS_EXAMPLE], External("internet", "203.0.113.9"), DB, 6379)
    assert str(nobody).endswith("isolated by default/test-network-policy; no rule admits 203.0.113.9")
    assert str(explain([], frontend, DB, 1)).endswith("no ingress policy selects default/db, it is not isolated")


def test_admitted_refuses_a_policy_with_problems():
    broken = netpol("broken", podSelector={}, ingress=[{"ports": [{"port": 80, "endPort": 70}]}])
    with pytest.raises(ValueError, match=r"NetworkPolicy default/broken: spec.ingress\[0\].ports\[0\].endPort"):
        admitted([broken], pod("client"), pod("db"), 80)


@pytest.mark.parametrize(
    "make, message",
    [
        (lambda: pod("x", host_network=True), "pod default/x is hostNetwork: give node_ip, its address"),
        (lambda: pod("x", ip="10.0.0.1", host_network=True, node_ip="10.0.0.2"), "its ip is its node's, 10.0.0.2"),
        (lambda: pod("x", ip="10.0.0.300"), "pod default/x ip: '10.0.0.300' is not an IPv4 address"),
        (
            lambda: pod("x", namespace_labels={"kubernetes.io/metadata.name": "other"}),
            "the API server sets kubernetes.io/metadata.name=default",
        ),
        (lambda: pod("x", ports={"http": (8080, "ICMP")}), "bad named port 'http'"),
    ],
    ids=["host-network-without-node-ip", "host-network-ip", "bad-ip", "namespace-name-label", "bad-port"],
)
def test_pod_refuses_what_kubernetes_cannot_have(make, message):
    with pytest.raises(ValueError, match=re.escape(message)):
        make()


def test_an_inconsistent_cluster_is_refused():
    a, b = pod("a", ip="10.0.0.1"), pod("b", ip="10.0.0.1")
    with pytest.raises(ValueError, match="default/a and default/b have the same IP 10.0.0.1"):
        admitted([], a, pod("db"), 80, pods=[b])
    with pytest.raises(ValueError, match="node node-a has two addresses"):
        admitted([], External("kubelet", "10.0.0.99", node="node-a"), pod("db", node_ip="10.0.0.11"), 80)
    with pytest.raises(ValueError, match="disagree on its labels"):
        admitted([], pod("a", "ns", namespace_labels={"x": "1"}), pod("db", "ns"), 80)
    with pytest.raises(ValueError, match="protocol 'ICMP'"):
        admitted([], pod("a"), pod("db"), 80, "ICMP")


# --- policy_problems -----------------------------------------------------------------------------


def test_a_sound_policy_has_no_problems():
    assert policy_problems(DOCS_EXAMPLE) == []
    assert policy_problems(AND_PEER) == []
    assert policy_problems(netpol("bare")) == []


@pytest.mark.parametrize(
    "spec, problem",
    [
        ({"podSelector": {}, "ingres": []}, 'unknown field "spec.ingres"'),
        ({"ingress": [{"form": []}]}, 'unknown field "spec.ingress[0].form"'),
        (
            {"ingress": [{"from": [{"ipBlock": {"cidr": "10.0.0.0/8", "expect": []}}]}]},
            'unknown field "spec.ingress[0].from[0].ipBlock.expect"',
        ),
        (
            {"ingress": [{"ports": [{"endPort": 90}]}]},
            "spec.ingress[0].ports[0].endPort: Invalid value: 90: may not be specified when `port` is not specified",
        ),
        (
            {"ingress": [{"ports": [{"port": "http", "endPort": 90}]}]},
            "spec.ingress[0].ports[0].endPort: Invalid value: 90: may not be specified when `port` is non-numeric",
        ),
        (
            {"ingress": [{"ports": [{"port": 100, "endPort": 90}]}]},
            "spec.ingress[0].ports[0].endPort: Invalid value: 90: must be greater than or equal to `port`",
        ),
        (
            {"ingress": [{"ports": [{"port": 70000}]}]},
            "spec.ingress[0].ports[0].port: Invalid value: 70000: must be between 1 and 65535, inclusive",
        ),
        (
            {"ingress": [{"ports": [{"port": "8080"}]}]},
            "spec.ingress[0].ports[0].port: Invalid value: \"8080\": not a port name (at most 15 of a-z, 0-9 and '-', "
            "with a letter, no '--', not starting or ending with '-')",
        ),
        (
            {"ingress": [{"ports": [{"protocol": "ICMP", "port": 1}]}]},
            'spec.ingress[0].ports[0].protocol: Unsupported value: "ICMP": supported values: "TCP", "UDP", "SCTP"',
        ),
        (
            {"ingress": [{"from": [{"ipBlock": {"cidr": "10.0.0.0/33"}}]}]},
            'spec.ingress[0].from[0].ipBlock.cidr: Invalid value: "10.0.0.0/33": must be a valid CIDR value, '
            "(e.g. 10.9.8.0/24 or 2001:db8::/64)",
        ),
        (
            {"ingress": [{"from": [{"ipBlock": {"cidr": "10.0.0.1"}}]}]},
            'spec.ingress[0].from[0].ipBlock.cidr: Invalid value: "10.0.0.1": must be a valid CIDR value, '
            "(e.g. 10.9.8.0/24 or 2001:db8::/64)",
        ),
        (
            {"ingress": [{"from": [{"ipBlock": {"cidr": "10.0.0.1/16"}}]}]},
            'spec.ingress[0].from[0].ipBlock.cidr: Invalid value: "10.0.0.1/16": host bits set, it means 10.0.0.0/16: '
            "write that",
        ),
        (
            {"ingress": [{"from": [{"ipBlock": {"cidr": "10.0.0.0/16", "except": ["10.1.0.0/24"]}}]}]},
            'spec.ingress[0].from[0].ipBlock.except[0]: Invalid value: "10.1.0.0/24": must be a strict subset of `cidr`',
        ),
        (
            {"ingress": [{"from": [{"ipBlock": {"cidr": "10.0.0.0/16", "except": ["10.0.0.0/16"]}}]}]},
            'spec.ingress[0].from[0].ipBlock.except[0]: Invalid value: "10.0.0.0/16": must be a strict subset of `cidr`',
        ),
        ({"ingress": [{"from": [{"ipBlock": {}}]}]}, "spec.ingress[0].from[0].ipBlock.cidr: Required value"),
        ({"ingress": [{"from": [{}]}]}, "spec.ingress[0].from[0]: Required value: must specify a peer"),
        (
            {"ingress": [{"from": [{"ipBlock": {"cidr": "10.0.0.0/8"}, "podSelector": {}}]}]},
            "spec.ingress[0].from[0]: Forbidden: may not specify both ipBlock and another peer",
        ),
        (
            {"policyTypes": ["Egress"], "ingress": [{}]},
            'spec.ingress: ignored: policyTypes ["Egress"] does not include Ingress',
        ),
        (
            {"policyTypes": ["Ingress", "ingress"]},
            'spec.policyTypes[1]: Unsupported value: "ingress": supported values: "Ingress", "Egress"',
        ),
        (
            {"ingress": [{"ports": [{"port": p} for p in range(1, 26)]}]},
            "spec.ingress[0].ports: 25 port/protocol combinations: the VPC CNI holds at most 24 per CIDR and drops the rest",
        ),
        (
            {"podSelector": {"matchExpressions": [{"key": "app", "operator": "Equals", "values": ["x"]}]}},
            'spec.podSelector.matchExpressions[0].operator: Unsupported value: "Equals": supported values: "In", "NotIn", '
            '"Exists", "DoesNotExist"',
        ),
        (
            {"podSelector": {"matchExpressions": [{"key": "app", "operator": "In"}]}},
            "spec.podSelector.matchExpressions[0].values: Required value: must be specified when `operator` is 'In' or 'NotIn'",
        ),
        (
            {"podSelector": {"matchExpressions": [{"key": "app", "operator": "Exists", "values": ["x"]}]}},
            "spec.podSelector.matchExpressions[0].values: Forbidden: may not be specified when `operator` is 'Exists' or "
            "'DoesNotExist'",
        ),
        (
            {"podSelector": {"matchLabels": {"app": True}}},
            "spec.podSelector.matchLabels: Invalid value: true: not a label value (63 characters at most: alphanumerics, "
            "'-', '_' and '.', starting and ending with an alphanumeric)",
        ),
    ],
    ids=lambda value: None if isinstance(value, dict) else value.split(":")[0][:60],
)
def test_policy_problems(spec, problem):
    assert policy_problems(netpol("p", **spec)) == [problem]


def test_policy_problems_of_the_object_itself():
    policy = {"apiVersion": "networking.k8s.io/v1beta1", "kind": "NetworkPolicy", "metadata": {}, "status": {}}
    assert policy_problems(policy) == [
        'unknown field "status"',
        'apiVersion: Unsupported value: "networking.k8s.io/v1beta1": supported values: "networking.k8s.io/v1"',
        "metadata.name: Required value: name is required",
    ]


def test_a_named_port_with_an_ip_block_is_resolved_on_the_destination():
    """Named ports failed with ipBlock peers in early controllers (controller #81, fixed in 2024)."""
    policy = netpol(
        "serve",
        podSelector={},
        ingress=[{"from": [{"ipBlock": {"cidr": "10.0.0.0/16"}}], "ports": [{"port": "serve"}]}],
    )
    head = pod("head", ports={"serve": (8000, "TCP")})
    assert admitted([policy], External("nlb", "10.0.1.5"), head, 8000)
    assert not admitted([policy], External("nlb", "10.0.1.5"), head, 8001)


# --- the cross-check against network-config-analyzer --------------------------------------------

NAMESPACE_LABELS = {
    "llm": {"team": "ml"},
    "kuberay-system": {"team": "platform"},
    "monitoring": {"team": "platform", "purpose": "metrics"},
    "clients": {"team": "apps"},
}
RAY = {"ray.io/is-ray-node": "yes"}


def _sample_pod(name: str, namespace: str, ip: str, node: str, labels: dict, ports: dict) -> Pod:
    return Pod(name, namespace, labels, NAMESPACE_LABELS[namespace], ip, node, ports)


SAMPLE_PODS = [
    _sample_pod(
        "ray-head-7xk2p",
        "llm",
        "10.0.1.10",
        "n1",
        {**RAY, "ray.io/node-type": "head", "ray.io/group": "headgroup"},
        {
            "gcs": (6379, "TCP"),
            "dashboard": (8265, "TCP"),
            "serve": (8000, "TCP"),
            "metrics": (8080, "TCP"),
            "client": (10001, "TCP"),
        },
    ),
    _sample_pod(
        "ray-prefill-worker-9ab3c",
        "llm",
        "10.0.2.10",
        "n2",
        {**RAY, "ray.io/node-type": "worker", "ray.io/group": "prefill"},
        {"metrics": (8080, "TCP"), "http": (9100, "TCP")},
    ),
    _sample_pod(
        "ray-decode-worker-4de5f",
        "llm",
        "10.0.3.10",
        "n2",
        {**RAY, "ray.io/node-type": "worker", "ray.io/group": "decode"},
        {"metrics": (8080, "TCP"), "http": (9200, "TCP")},
    ),
    _sample_pod(
        "kuberay-operator-5d8f9c-q7w2e",
        "kuberay-system",
        "10.0.4.10",
        "n1",
        {"app.kubernetes.io/name": "kuberay-operator"},
        {"http": (8080, "TCP")},
    ),
    _sample_pod("prometheus-server-0", "monitoring", "10.0.5.10", "n1", {"app": "prometheus"}, {"web": (9090, "TCP")}),
    _sample_pod(
        "web-6f7d8b-k2m4n", "clients", "10.0.6.10", "n2", {"app": "web", "tier": "frontend"}, {"http": (8080, "TCP")}
    ),
    # Inside serve-from-vpc's except.
    _sample_pod("batch-job-x9z8y", "clients", "10.0.99.20", "n2", {"app": "batch", "tier": "backend"}, {}),
]
HEAD, PREFILL, DECODE, OPERATOR, PROMETHEUS, WEB, BATCH = (p.ref for p in SAMPLE_PODS)
HEAD_ONLY = {"matchLabels": {"ray.io/node-type": "head"}}
SAMPLE_POLICIES = [
    netpol("default-deny-ingress", "llm", podSelector={}, policyTypes=["Ingress"]),
    netpol(
        "ray-internal",
        "llm",
        podSelector={"matchLabels": RAY},
        ingress=[
            {
                "from": [{"podSelector": {"matchLabels": RAY}}],
                "ports": [{"port": 6379}, {"port": 10000, "endPort": 19999}],
            }
        ],
    ),
    netpol(
        "operator-to-dashboard",
        "llm",
        podSelector=HEAD_ONLY,
        ingress=[
            {
                "from": [
                    {
                        "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "kuberay-system"}},
                        "podSelector": {"matchLabels": {"app.kubernetes.io/name": "kuberay-operator"}},
                    }
                ],
                "ports": [{"port": "dashboard"}],
            }
        ],
    ),
    netpol(
        "metrics-scrape",
        "llm",
        podSelector={"matchExpressions": [{"key": "ray.io/is-ray-node", "operator": "Exists"}]},
        ingress=[
            {"from": [{"namespaceSelector": {"matchLabels": {"purpose": "metrics"}}}], "ports": [{"port": "metrics"}]}
        ],
    ),
    netpol(
        "serve-from-vpc",
        "llm",
        podSelector=HEAD_ONLY,
        ingress=[
            {"from": [{"ipBlock": {"cidr": "10.0.0.0/16", "except": ["10.0.99.0/24"]}}], "ports": [{"port": "serve"}]}
        ],
    ),
    netpol(
        "worker-http",
        "llm",
        podSelector={"matchLabels": {"ray.io/node-type": "worker"}},
        ingress=[
            {
                "from": [
                    {
                        "namespaceSelector": {
                            "matchExpressions": [{"key": "team", "operator": "In", "values": ["apps"]}]
                        }
                    },
                    {"podSelector": HEAD_ONLY},
                ],
                "ports": [{"port": "http"}],
            }
        ],
    ),
    netpol("agent-from-anywhere", "llm", podSelector=HEAD_ONLY, ingress=[{"ports": [{"port": 52365}]}]),
    netpol(
        "batch-from-prometheus",
        "clients",
        podSelector={"matchLabels": {"app": "batch"}},
        ingress=[
            {
                "from": [{"namespaceSelector": {}, "podSelector": {"matchLabels": {"app": "prometheus"}}}],
                "ports": [{"protocol": "TCP", "port": 9090}],
            }
        ],
    ),
    netpol(
        "web-from-clients",
        "clients",
        podSelector={"matchExpressions": [{"key": "tier", "operator": "NotIn", "values": ["backend"]}]},
        ingress=[{"from": [{"podSelector": {}}]}],
    ),
    # Egress only, and every egress allowed, so NCA (which models egress) sees what this model does.
    netpol("egress-only", "monitoring", podSelector={}, policyTypes=["Egress"], egress=[{}]),
]
PROBES = [(p, "TCP") for p in (6379, 8000, 8080, 8265, 9090, 9100, 9200, 10001, 15000, 52365)] + [(6379, "UDP")]
EXTERNAL_PROBES = [
    External("in-vpc", "10.0.7.7"),
    External("in-except", "10.0.99.7"),
    External("outside", "192.168.1.1"),
]
Connection = tuple[str, str, int, str]


def test_the_sample_policies_are_sound():
    assert {_ref(p): policy_problems(p) for p in SAMPLE_POLICIES} == {_ref(p): [] for p in SAMPLE_POLICIES}


def _ref(policy: dict) -> str:
    return f"{policy['metadata']['namespace']}/{policy['metadata']['name']}"


def _nca_input(tmp: Path) -> list[str]:
    pods = [
        {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": p.name, "namespace": p.namespace, "labels": dict(p.labels)},
            "spec": {
                "containers": [
                    {
                        "name": "main",
                        "ports": [
                            {"name": name, "containerPort": number, "protocol": protocol}
                            for name, (number, protocol) in p.ports.items()
                        ],
                    }
                ]
            },
        }
        for p in SAMPLE_PODS
    ]
    namespaces = [
        {
            "apiVersion": "v1",
            "kind": "Namespace",
            "metadata": {"name": name, "labels": {**labels, "kubernetes.io/metadata.name": name}},
        }
        for name, labels in NAMESPACE_LABELS.items()
    ]
    files = {
        "policies.yaml": yaml.safe_dump_all(SAMPLE_POLICIES),
        "pods.yaml": yaml.safe_dump({"apiVersion": "v1", "kind": "PodList", "items": pods}),
        "namespaces.yaml": yaml.safe_dump({"apiVersion": "v1", "kind": "NamespaceList", "items": namespaces}),
    }
    for name, text in files.items():
        (tmp / name).write_text(text)
    return [
        "--connectivity",
        str(tmp / "policies.yaml"),
        "--pod_list",
        str(tmp / "pods.yaml"),
        "--ns_list",
        str(tmp / "namespaces.yaml"),
    ]


_LINE = re.compile(r"^(?P<src>\S+) => (?P<dst>\S+) : (?P<conn>.+)$")
_CONN = re.compile(r"\{protocols:(?P<protocols>[A-Z, ]+?)(?:,dst_ports:(?P<ports>[0-9,-]+))?\}")


@pytest.fixture(scope="module")
def nca_connectivity(tmp_path_factory) -> list[tuple[str, str, str]]:
    """NCA's connectivity map of the sample: (source, destination, connections) lines, run once."""
    if not NCA.exists():
        pytest.fail(
            f"network-config-analyzer is not installed ({NCA.relative_to(ROOT)}): run make test (it installs it)",
            pytrace=False,
        )
    run = subprocess.run(
        [str(NCA), *_nca_input(tmp_path_factory.mktemp("nca")), "-o", "txt_no_fw_rules"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert run.returncode == 0, run.stdout + run.stderr
    lines = [m.group("src", "dst", "conn") for m in map(_LINE.match, run.stdout.splitlines()) if m]
    assert lines, run.stdout
    return lines


def _nca_admits(
    lines: list[tuple[str, str, str]], source: str | External, destination: str, port: int, protocol: str
) -> bool:
    for src, dst, conn in lines:
        if dst != f"{destination}[Pod]" or not _nca_source_is(src, source):
            continue
        if conn == "All connections":
            return True
        for m in _CONN.finditer(conn):
            protocols = {p.strip() for p in m.group("protocols").split(",")}
            if protocol in protocols and (m.group("ports") is None or _in_ranges(port, m.group("ports"))):
                return True
    return False


def _nca_source_is(src: str, source: str | External) -> bool:
    if isinstance(source, str):
        return src == f"{source}[Pod]"
    if src.endswith("[Pod]"):
        return False
    first, _, last = src.partition("-")
    address = ipaddress.IPv4Address(source.ip)
    return ipaddress.IPv4Address(first) <= address <= ipaddress.IPv4Address(last or first)


def _in_ranges(port: int, ranges: str) -> bool:
    for part in ranges.split(","):
        low, _, high = part.partition("-")
        if int(low) <= port <= int(high or low):
            return True
    return False


def _table(policies: list[dict], pods: list[Pod], *, with_pods: bool) -> set[Connection]:
    return {
        (src.ref, dst.ref, port, protocol)
        for src in pods
        for dst in pods
        if src is not dst
        for port, protocol in PROBES
        if admitted(policies, src, dst, port, protocol, pods=pods if with_pods else ())
    }


def _nca_table(lines: list[tuple[str, str, str]], sources: Iterable[str | External]) -> set[Connection]:
    return {
        (src if isinstance(src, str) else src.ip, dst.ref, port, protocol)
        for src in sources
        for dst in SAMPLE_PODS
        if src != dst.ref
        for port, protocol in PROBES
        if _nca_admits(lines, src, dst.ref, port, protocol)
    }


def test_nca_sees_the_sample_as_intended(nca_connectivity):
    """A few of NCA's verdicts, so the parsing of its output is checked too."""
    assert _nca_admits(nca_connectivity, OPERATOR, HEAD, 8265, "TCP")
    assert not _nca_admits(nca_connectivity, PROMETHEUS, HEAD, 8265, "TCP")
    assert _nca_admits(nca_connectivity, PREFILL, HEAD, 15000, "TCP")
    assert not _nca_admits(nca_connectivity, PREFILL, HEAD, 6379, "UDP")
    assert _nca_admits(nca_connectivity, WEB, OPERATOR, 1, "UDP")
    assert _nca_admits(nca_connectivity, EXTERNAL_PROBES[0], HEAD, 8000, "TCP")
    assert not _nca_admits(nca_connectivity, EXTERNAL_PROBES[1], HEAD, 8000, "TCP")


def test_upstream_semantics_agree_with_nca(nca_connectivity):
    """With pod IPs outside every ipBlock and only the two ends known (named ports resolved on the
    destination), the VPC CNI's semantics are upstream's: every pod-to-pod verdict agrees with NCA."""
    unblocked = [dataclasses.replace(p, ip=f"100.64.0.{i + 1}") for i, p in enumerate(SAMPLE_PODS)]
    ours = _table(SAMPLE_POLICIES, unblocked, with_pods=False)
    theirs = _nca_table(nca_connectivity, [p.ref for p in SAMPLE_PODS])
    assert len(theirs) > 100, "the sample admits a fair share of its connections"
    assert ours - theirs == set(), "admitted here, refused by NCA"
    assert theirs - ours == set(), "refused here, admitted by NCA"


def test_vpc_cni_semantics_differ_from_nca_exactly_where_expected(nca_connectivity):
    """The whole cluster, real IPs: NCA's upstream verdicts and the VPC CNI's differ in exactly the
    three ways the module's docstring names, worked out by hand for this sample."""
    ours = _table(SAMPLE_POLICIES, SAMPLE_PODS, with_pods=True)
    theirs = _nca_table(nca_connectivity, [p.ref for p in SAMPLE_PODS])
    # 1: serve-from-vpc's ipBlock 10.0.0.0/16 holds every pod IP but batch's (in the except).
    ip_block = {(src, HEAD, 8000, "TCP") for src in (PREFILL, DECODE, OPERATOR, PROMETHEUS, WEB)}
    # 4: worker-http's "http" is 9100 on prefill and 9200 on decode, so both admit both.
    named_union = {
        (src, dst, port, "TCP") for src in (HEAD, WEB, BATCH) for dst, port in ((PREFILL, 9200), (DECODE, 9100))
    }
    # 5: batch (10.0.99.20) falls in the except's deny-all entry, which shadows agent-from-anywhere.
    except_shadow = {(BATCH, HEAD, 52365, "TCP")}
    assert ours - theirs == ip_block | named_union
    assert theirs - ours == except_shadow


def test_external_sources_agree_with_nca_but_for_the_except_shadow(nca_connectivity):
    ours = {
        (src.ip, dst.ref, port, protocol)
        for src in EXTERNAL_PROBES
        for dst in SAMPLE_PODS
        for port, protocol in PROBES
        if admitted(SAMPLE_POLICIES, src, dst, port, protocol, pods=SAMPLE_PODS)
    }
    theirs = _nca_table(nca_connectivity, EXTERNAL_PROBES)
    assert ("10.0.7.7", HEAD, 8000, "TCP") in ours & theirs
    assert ours - theirs == set()
    assert theirs - ours == {("10.0.99.7", HEAD, 52365, "TCP")}
