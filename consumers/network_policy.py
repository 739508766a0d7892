"""Kubernetes NetworkPolicy ingress (networking.k8s.io/v1) as the Amazon VPC CNI enforces it: which
connections reach a pod.

The project renders its NetworkPolicies as plain dicts (the Kubernetes objects) and asserts a
connectivity table over stand-ins for its pods (``Pod``) and for what is outside the pod network
(``External``): ``admitted()`` says whether one connection gets through, ``explain()`` says why, and
``policy_problems()`` lists what the API server would refuse or the agent ignore.

Ingress only: the project restricts no egress. Egress rules are checked by ``policy_problems()``
but never evaluated, and a policy whose policyTypes is only Egress neither isolates nor admits.

The semantics are upstream NetworkPolicy's (https://kubernetes.io/docs/concepts/services-networking/network-policies/,
https://kubernetes.io/docs/reference/kubernetes-api/policy-resources/network-policy-v1/), computed as
the VPC CNI computes them: its controller (aws/amazon-network-policy-controller-k8s,
pkg/resolvers/endpoints.go) turns each policy into CIDRs with ports, and its node agent
(aws/aws-network-policy-agent, pkg/fwruleprocessor/fw_rule_processor.go, pkg/ebpf/c/tc.v4ingress.bpf.c)
merges every policy that applies to a pod into one longest-prefix-match table keyed by the source
address. Where that differs from upstream, the agent's behaviour is the one modelled:

1. Peers are addresses, not identities. A podSelector/namespaceSelector peer admits the IPs of the
   pods it selects, and pod IPs are VPC addresses, so an ipBlock also admits a pod whose IP is in it;
   a selector that selects a hostNetwork pod admits its address, the node's, and so everything on
   that node (the controller keeps hostNetwork pods as peers:
   TestEndpointsResolver_IncludesHostNetworkPodsInIngressEgressRules).
2. The destination's own node is always admitted ("Traffic from the local node should always be
   allowed", fw_rule_processor.go; the docs: "traffic to and from the node where a Pod is running is
   always allowed"), so kubelet probes need no rule. The agent writes that allow-all entry first and
   lets an entry for exactly the node's /32 (an ipBlock of it, or a selected hostNetwork pod on that
   node) overwrite it. And, as the docs say, "a pod cannot block access to itself".
3. hostNetwork pods are never isolated: the controller leaves them out of a policy's pods and the
   agent skips PodIP == HostIP (policyendpoints_controller.go deriveTargetPods).
4. A named port in an ingress rule is resolved against every pod the policy selects, and the union
   applies to each of them (endpoints.go getIngressRulesPorts): "http" that is 8080 on one selected
   pod and 9090 on another admits both on both. A name no selected pod has (with that protocol)
   matches nothing, and a rule none of whose ports resolve is dropped.
5. An except CIDR becomes a deny-all entry of its own unless some rule names that exact CIDR, so it
   also refuses what a broader rule of another policy admits (an every-source rule included); a
   narrower CIDR inherits the ports of each broader one whose except does not hold its network
   address (ComputeMapEntriesFromEndpointRules, steps 4-5; compare aws/aws-network-policy-agent#180).
6. Pods that share the agent's pod identifier (the name without its last "-" part, and the
   namespace: the replicas of one ReplicaSet or StatefulSet) share one set of maps, so a policy that
   selects one of them applies to all (utils.GetPodIdentifier, deriveIngressAndEgressFirewallRules).
7. A table entry holds at most 24 port/protocol combinations (MAX_PORT_PROTOCOL); the agent keeps an
   arbitrary 24 of more, so ``explain()`` refuses such a table rather than guess.

Points 1, 4 and 6 depend on pods other than the two ends: pass them as ``pods=``. Without them the
cluster is the source and the destination alone, and named ports resolve on the destination only.

Not modelled: the seconds after a pod starts before its policies are programmed (standard mode
admits, strict mode refuses); pods not yet running; IPv6; interfaces other than eth0 (EFA traffic);
Services (a connection here is to a pod's own IP and port, after any DNAT).
"""

from __future__ import annotations

import ipaddress
import json
import re
from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

PROTOCOLS = ("TCP", "UDP", "SCTP")
# The VPC CNI's per-entry limit (MAX_PORT_PROTOCOL in tc.v4ingress.bpf.c; the EKS user guide's
# "24 unique combinations of ports and protocols").
MAX_PORT_PROTOCOL = 24
NAMESPACE_NAME_LABEL = "kubernetes.io/metadata.name"
_EVERYWHERE = ipaddress.IPv4Network("0.0.0.0/0")

_PORT_NAME = re.compile(r"^[a-z0-9]([a-z0-9-]*[a-z0-9])?$")
_LABEL_NAME = re.compile(r"^([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]$")
_DNS_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
_CIDR = re.compile(r"^[0-9A-Fa-f:.]+/[0-9]{1,3}$")
_OPERATORS = ("In", "NotIn", "Exists", "DoesNotExist")


def _frozen(mapping: Mapping[str, Any]) -> Mapping[str, Any]:
    return MappingProxyType(dict(mapping))


def _ipv4(value: str, what: str) -> ipaddress.IPv4Address:
    try:
        return ipaddress.IPv4Address(value)
    except ValueError:
        raise ValueError(f"{what}: {value!r} is not an IPv4 address") from None


@dataclass(frozen=True)
class Pod:
    """A running pod as the policies see it: labels, its namespace's labels, addresses and named ports.

    ``namespace_labels`` gains ``kubernetes.io/metadata.name=<namespace>`` when absent: the API
    server sets that label on every namespace. A hostNetwork pod's address is its node's (its podIP
    is the hostIP), so it needs ``node_ip`` and an ``ip`` equal to it.
    """

    name: str
    namespace: str
    labels: Mapping[str, str]
    namespace_labels: Mapping[str, str]
    ip: str
    node: str
    ports: Mapping[str, tuple[int, str]] = field(default_factory=dict)
    host_network: bool = False
    node_ip: str | None = None

    def __post_init__(self) -> None:
        _ipv4(self.ip, f"pod {self.ref} ip")
        if self.node_ip is not None:
            _ipv4(self.node_ip, f"pod {self.ref} node_ip")
        if self.host_network and self.node_ip is None:
            raise ValueError(f"pod {self.ref} is hostNetwork: give node_ip, its address")
        if self.host_network and self.ip != self.node_ip:
            raise ValueError(f"pod {self.ref} is hostNetwork: its ip is its node's, {self.node_ip}, not {self.ip}")
        namespace_labels = dict(self.namespace_labels)
        if namespace_labels.setdefault(NAMESPACE_NAME_LABEL, self.namespace) != self.namespace:
            raise ValueError(f"pod {self.ref}: the API server sets {NAMESPACE_NAME_LABEL}={self.namespace}")
        for name, (number, protocol) in self.ports.items():
            if not _valid_port_name(name) or not 1 <= number <= 65535 or protocol not in PROTOCOLS:
                raise ValueError(f"pod {self.ref}: bad named port {name!r}: {(number, protocol)}")
        object.__setattr__(self, "labels", _frozen(self.labels))
        object.__setattr__(self, "namespace_labels", _frozen(namespace_labels))
        object.__setattr__(self, "ports", _frozen(self.ports))

    def __hash__(self) -> int:
        return hash((self.namespace, self.name, self.ip))

    @property
    def ref(self) -> str:
        return f"{self.namespace}/{self.name}"

    @property
    def address(self) -> str:
        """The source address of its connections: a hostNetwork pod sends from its node's."""
        return self.node_ip if self.host_network and self.node_ip else self.ip


@dataclass(frozen=True)
class External:
    """A source outside the pod network: a load balancer address, a node, a client.

    ``node`` names the node when the address is a node's own (the kubelet, hostNetwork processes):
    the agent admits a pod's own node whatever the policies say.
    """

    name: str
    ip: str
    node: str | None = None

    def __post_init__(self) -> None:
        _ipv4(self.ip, f"source {self.name} ip")

    @property
    def ref(self) -> str:
        return self.name

    @property
    def address(self) -> str:
        return self.ip


@dataclass(frozen=True)
class Verdict:
    """``admitted`` and, for assertion messages, why: the rule that admitted it, or what refused it."""

    admitted: bool
    reason: str

    def __str__(self) -> str:
        return f"{'admitted' if self.admitted else 'refused'}: {self.reason}"


def admitted(
    policies: Sequence[Mapping[str, Any]],
    source: Pod | External,
    destination: Pod,
    port: int,
    protocol: str = "TCP",
    *,
    pods: Collection[Pod] = (),
) -> bool:
    """Whether ``source`` reaches ``destination`` on ``port``/``protocol`` under ``policies``.

    ``pods``: the rest of the cluster (see the module docstring, points 1, 4 and 6).
    Raises ValueError for a policy with ``policy_problems()`` or an inconsistent cluster.
    """
    return explain(policies, source, destination, port, protocol, pods=pods).admitted


def explain(
    policies: Sequence[Mapping[str, Any]],
    source: Pod | External,
    destination: Pod,
    port: int,
    protocol: str = "TCP",
    *,
    pods: Collection[Pod] = (),
) -> Verdict:
    """``admitted()`` with its reason."""
    if protocol not in PROTOCOLS:
        raise ValueError(f"protocol {protocol!r}: one of {', '.join(PROTOCOLS)}")
    if not 1 <= port <= 65535:
        raise ValueError(f"port {port}: 1 to 65535")
    for policy in policies:
        if problems := policy_problems(policy):
            raise ValueError(f"NetworkPolicy {_ref(policy)}: " + "; ".join(problems))
    cluster = _Cluster(source, destination, pods)
    connection = f"{source.ref} ({source.address}) -> {destination.ref}:{port}/{protocol}"
    if isinstance(source, Pod) and source.ref == destination.ref:
        return Verdict(True, f"{connection}: a pod cannot block access to itself")
    if destination.host_network:
        return Verdict(True, f"{connection}: {destination.ref} is hostNetwork, network policies do not apply to it")
    applying = [p for p in policies if _applies(p, destination, cluster)]
    if not applying:
        return Verdict(True, f"{connection}: no ingress policy selects {destination.ref}, it is not isolated")
    entries = [entry for policy in applying for entry in _ingress_entries(policy, cluster)]
    table = _agent_table(entries, cluster.node_ip(destination.node))
    for cidr, items in table.items():
        if len(items) > MAX_PORT_PROTOCOL:
            raise ValueError(
                f"{destination.ref}: the entry for {cidr} has {len(items)} port/protocol combinations; "
                f"the agent keeps an arbitrary {MAX_PORT_PROTOCOL}"
            )
    isolated = f"isolated by {', '.join(_ref(p) for p in applying)}"
    address = ipaddress.IPv4Address(source.address)
    matching = [network for network in table if address in network]
    if not matching:
        return Verdict(False, f"{connection}: {isolated}; no rule admits {address}")
    network = max(matching, key=lambda n: n.prefixlen)
    l4 = table[network]
    for item in l4:
        if item.protocol == "DENY":
            return Verdict(False, f"{connection}: {isolated}; {address} falls in {item.origin}, which denies all")
    for item in l4:
        if item.admits(port, protocol):
            return Verdict(True, f"{connection}: {item.origin} admits {item} (entry {network})")
    offered = ", ".join(sorted({str(item) for item in l4}))
    return Verdict(False, f"{connection}: {isolated}; the entry {network} for {address} admits only {offered}")


# --- the cluster ---------------------------------------------------------------------------------


class _Cluster:
    """The pods a verdict is about, checked for the consistency a real cluster has."""

    def __init__(self, source: Pod | External, destination: Pod, pods: Iterable[Pod]) -> None:
        members: dict[tuple[str, str], Pod] = {}
        for pod in (*pods, destination, *([source] if isinstance(source, Pod) else [])):
            if members.setdefault((pod.namespace, pod.name), pod) != pod:
                raise ValueError(f"two different pods named {pod.ref}")
        self.pods = list(members.values())
        self.namespaces: dict[str, Mapping[str, str]] = {}
        owners: dict[str, Pod] = {}
        self._node_ips: dict[str, str] = {}
        for pod in self.pods:
            if self.namespaces.setdefault(pod.namespace, pod.namespace_labels) != pod.namespace_labels:
                raise ValueError(f"pods in namespace {pod.namespace} disagree on its labels")
            if not pod.host_network and owners.setdefault(pod.ip, pod) is not pod:
                raise ValueError(f"{pod.ref} and {owners[pod.ip].ref} have the same IP {pod.ip}")
            self._add_node_ip(pod.node, pod.node_ip)
        if isinstance(source, External):
            if source.ip in owners:
                raise ValueError(f"source {source.name} has the IP of pod {owners[source.ip].ref}")
            if source.node is not None:
                self._add_node_ip(source.node, source.ip)

    def _add_node_ip(self, node: str, ip: str | None) -> None:
        if ip is not None and self._node_ips.setdefault(node, ip) != ip:
            raise ValueError(f"node {node} has two addresses: {self._node_ips[node]} and {ip}")

    def node_ip(self, node: str) -> str | None:
        return self._node_ips.get(node)


def _identifier(pod: Pod) -> tuple[str, str]:
    """The agent's pod identifier (utils.GetPodIdentifier): pods that share it share their maps."""
    return pod.name.replace(".", "_").rpartition("-")[0] or pod.name, pod.namespace


def _applies(policy: Mapping[str, Any], destination: Pod, cluster: _Cluster) -> bool:
    """Whether the policy isolates ``destination`` for ingress: it is in its namespace, has Ingress in
    its policyTypes, and selects it or a pod that shares its identifier (hostNetwork pods aside)."""
    spec = policy.get("spec") or {}
    if _namespace(policy) != destination.namespace or "Ingress" not in _policy_types(spec):
        return False
    sharing = [
        pod
        for pod in cluster.pods
        if pod.namespace == destination.namespace
        and not pod.host_network
        and _identifier(pod) == _identifier(destination)
    ]
    return any(_selects(spec.get("podSelector"), pod.labels) for pod in sharing)


def _metadata(policy: Any) -> Mapping[str, Any]:
    metadata = policy.get("metadata") if isinstance(policy, Mapping) else None
    return metadata if isinstance(metadata, Mapping) else {}


def _namespace(policy: Any) -> str:
    """A policy's namespace; one without lands where kubectl puts it with no -n, "default"."""
    return str(_metadata(policy).get("namespace") or "default")


def _ref(policy: Any) -> str:
    return f"{_namespace(policy)}/{_metadata(policy).get('name')}"


def _policy_types(spec: Mapping[str, Any]) -> list[str]:
    """policyTypes as the API server defaults it: Ingress always, Egress if there are egress rules."""
    if spec.get("policyTypes"):
        return list(spec["policyTypes"])
    return ["Ingress", "Egress"] if spec.get("egress") else ["Ingress"]


def _selects(selector: Mapping[str, Any] | None, labels: Mapping[str, str]) -> bool:
    """A label selector: matchLabels AND every matchExpression; empty or absent selects everything."""
    selector = selector or {}
    if any(labels.get(key) != value for key, value in (selector.get("matchLabels") or {}).items()):
        return False
    for expression in selector.get("matchExpressions") or []:
        key, operator, values = expression["key"], expression["operator"], expression.get("values") or []
        present = key in labels
        if operator == "In":
            ok = present and labels[key] in values
        elif operator == "NotIn":
            ok = not present or labels[key] not in values
        elif operator == "Exists":
            ok = present
        else:  # DoesNotExist; policy_problems() refuses any other operator
            ok = not present
        if not ok:
            return False
    return True


# --- the controller: a policy's ingress as CIDRs with ports (endpoints.go computeIngressEndpoints) -


@dataclass(frozen=True)
class _L4:
    """One port/protocol item of an entry, as the agent encodes it; ANY and DENY are its catch-all
    and deny-all items. ``origin`` names the rule it came from."""

    protocol: str
    port: int | None
    end_port: int | None
    origin: str = field(compare=False)

    def admits(self, port: int, protocol: str) -> bool:
        # tc.v4ingress.bpf.c: the protocol matches (or is ANY), and port 0 is any port, else the port
        # or (port, endPort].
        if self.protocol not in ("ANY", protocol):
            return False
        if self.port is None:
            return True
        return port == self.port or (self.end_port is not None and self.port < port <= self.end_port)

    def __str__(self) -> str:
        if self.protocol in ("ANY", "DENY"):
            return {"ANY": "every port", "DENY": "nothing"}[self.protocol]
        if self.port is None:
            return f"every {self.protocol} port"
        return f"{self.protocol} {self.port}" + (f"-{self.end_port}" if self.end_port is not None else "")


@dataclass(frozen=True)
class _Entry:
    cidr: ipaddress.IPv4Network
    excepted: tuple[ipaddress.IPv4Network, ...]
    l4: tuple[_L4, ...]  # empty: every port
    origin: str


def _ingress_entries(policy: Mapping[str, Any], cluster: _Cluster) -> list[_Entry]:
    spec = policy.get("spec") or {}
    namespace = _namespace(policy)
    entries: list[_Entry] = []
    for i, rule in enumerate(spec.get("ingress") or []):
        rule_ref = f"{_ref(policy)} ingress[{i}]"
        l4 = _rule_ports(policy, rule.get("ports") or [], rule_ref, cluster)
        if l4 is None:
            continue  # ports given and none resolved: the controller drops the rule
        peers = rule.get("from") or []
        if not peers:
            entries.append(_Entry(_EVERYWHERE, (), l4, f"{rule_ref} (every source)"))
        for j, peer in enumerate(peers):
            peer_ref = f"{rule_ref} from[{j}]"
            if peer.get("ipBlock") is not None:
                block = peer["ipBlock"]
                cidr = ipaddress.ip_network(block["cidr"], strict=False)
                if isinstance(cidr, ipaddress.IPv4Network):  # the agent skips IPv6 rules in an IPv4 cluster
                    excepted = tuple(
                        ipaddress.IPv4Network(x, strict=False) for x in block.get("except") or [] if ":" not in x
                    )
                    entries.append(_Entry(cidr, excepted, l4, f"{peer_ref} ipBlock {block['cidr']}"))
                continue
            if peer.get("namespaceSelector") is None:
                namespaces = {namespace}
            else:
                namespaces = {
                    n for n, labels in cluster.namespaces.items() if _selects(peer["namespaceSelector"], labels)
                }
            for pod in cluster.pods:
                if pod.namespace in namespaces and _selects(peer.get("podSelector"), pod.labels):
                    cidr = ipaddress.IPv4Network(pod.address)
                    entries.append(_Entry(cidr, (), l4, f"{peer_ref} (selects {pod.ref})"))
    return entries


def _rule_ports(
    policy: Mapping[str, Any], ports: Sequence[Mapping[str, Any]], rule_ref: str, cluster: _Cluster
) -> tuple[_L4, ...] | None:
    """A rule's ports as the controller resolves them: () for every port, None for none."""
    if not ports:
        return ()
    resolved: dict[tuple[str, int | None, int | None], _L4] = {}

    def add(protocol: str, number: int | None, end_port: int | None, origin: str) -> None:
        resolved.setdefault((protocol, number, end_port), _L4(protocol, number, end_port, origin))

    if not any(isinstance(p.get("port"), str) for p in ports):
        for p in ports:
            add(p.get("protocol") or "TCP", p.get("port"), p.get("endPort"), rule_ref)
    else:
        # Named ports resolve against every pod the policy selects (hostNetwork ones included).
        spec = policy.get("spec") or {}
        selected = [
            pod
            for pod in cluster.pods
            if pod.namespace == _namespace(policy) and _selects(spec.get("podSelector"), pod.labels)
        ]
        for pod in selected:
            for p in ports:
                protocol, number = p.get("protocol") or "TCP", p.get("port")
                if not isinstance(number, str):
                    add(protocol, number, p.get("endPort"), rule_ref)
                elif number in pod.ports and pod.ports[number][1] == protocol:
                    add(
                        protocol,
                        pod.ports[number][0],
                        None,
                        f"{rule_ref} (port {number} = {pod.ports[number][0]} on {pod.ref})",
                    )
    return tuple(resolved.values()) or None


# --- the agent: one longest-prefix-match table per pod (fw_rule_processor.go) -----------------


def _agent_table(entries: Sequence[_Entry], node_ip: str | None) -> dict[ipaddress.IPv4Network, list[_L4]]:
    """ComputeMapEntriesFromEndpointRules: the entries sorted by prefix length, merged per CIDR, each
    new CIDR inheriting the ports of the broader ones that do not except it, each except CIDR not
    otherwise present a deny-all entry, and the node's own /32 an allow-all one unless a rule names it."""
    cidrs: dict[ipaddress.IPv4Network, tuple[list[_L4], list[ipaddress.IPv4Network]]] = {}
    broader: dict[ipaddress.IPv4Network, tuple[list[_L4], list[ipaddress.IPv4Network]]] = {}
    excepts: dict[ipaddress.IPv4Network, str] = {}
    for entry in sorted(entries, key=lambda e: e.cidr.prefixlen):  # stable, as sort.SliceStable
        for x in entry.excepted:
            excepts.setdefault(x, f"except {x} of {entry.origin}")
        l4 = list(entry.l4) or [_L4("ANY", None, None, entry.origin)]
        excepted = list(entry.excepted)
        if entry.cidr in cidrs:
            l4 += cidrs[entry.cidr][0]
            excepted += cidrs[entry.cidr][1]
        else:
            address = entry.cidr.network_address
            for parent, (parent_l4, parent_excepted) in broader.items():
                if address in parent and not any(address in x for x in parent_excepted):
                    l4 += parent_l4
        cidrs[entry.cidr] = (l4, excepted)
        if entry.cidr.prefixlen < 32:
            broader[entry.cidr] = (l4, excepted)
    for x, origin in excepts.items():
        cidrs.setdefault(x, ([_L4("DENY", None, None, origin)], []))
    table: dict[ipaddress.IPv4Network, list[_L4]] = {}
    if node_ip is not None:
        table[ipaddress.IPv4Network(node_ip)] = [_L4("ANY", None, None, "the destination's own node (always admitted)")]
    for cidr, (l4, _) in cidrs.items():
        unique: dict[_L4, _L4] = {}
        for item in l4:
            unique.setdefault(item, item)  # mergeDuplicateL4Info: one per protocol, port and endPort
        table[cidr] = list(unique.values())
    return table


# --- policy_problems -----------------------------------------------------------------------------


def policy_problems(policy: Mapping[str, Any]) -> list[str]:
    """What the API server would refuse in a NetworkPolicy, or the VPC CNI ignore or cap, in the API
    server's field-path style (``spec.ingress[0].ports[1].endPort: ...``). Empty when it is sound."""
    problems: list[str] = []
    if not isinstance(policy, Mapping):
        return [f"not a mapping: {policy!r}"]
    _unknown(policy, ("apiVersion", "kind", "metadata", "spec"), "", problems)
    if policy.get("apiVersion") != "networking.k8s.io/v1":
        problems.append(
            f'apiVersion: Unsupported value: {_v(policy.get("apiVersion"))}: supported values: "networking.k8s.io/v1"'
        )
    if policy.get("kind") != "NetworkPolicy":
        problems.append(f'kind: Unsupported value: {_v(policy.get("kind"))}: supported values: "NetworkPolicy"')
    metadata = policy.get("metadata")
    if not isinstance(metadata, Mapping) or not metadata.get("name"):
        problems.append("metadata.name: Required value: name is required")
    else:
        for key in ("name", "namespace"):
            value = metadata.get(key)
            if value is not None and (not isinstance(value, str) or not _DNS_SUBDOMAIN.match(value)):
                problems.append(f"metadata.{key}: Invalid value: {_v(value)}: not a lowercase DNS name")
    spec = policy.get("spec")
    if spec is None:
        return problems
    if not isinstance(spec, Mapping):
        return [*problems, f"spec: Invalid value: {_v(spec)}: must be an object"]
    _unknown(spec, ("podSelector", "policyTypes", "ingress", "egress"), "spec", problems)
    _selector_problems(spec.get("podSelector"), "spec.podSelector", problems)
    types = spec.get("policyTypes")
    if types is not None:
        if not isinstance(types, list):
            problems.append(f"spec.policyTypes: Invalid value: {_v(types)}: must be a list")
        elif len(types) > 2:
            problems.append("spec.policyTypes: Invalid value: may not specify more than two policyTypes")
        else:
            for i, kind in enumerate(types):
                if kind not in ("Ingress", "Egress"):
                    problems.append(
                        f'spec.policyTypes[{i}]: Unsupported value: {_v(kind)}: supported values: "Ingress", "Egress"'
                    )
    for direction, peers_key in (("ingress", "from"), ("egress", "to")):
        rules = spec.get(direction)
        if rules is None:
            continue
        if not isinstance(rules, list):
            problems.append(f"spec.{direction}: Invalid value: {_v(rules)}: must be a list")
            continue
        for i, rule in enumerate(rules):
            _rule_problems(rule, f"spec.{direction}[{i}]", peers_key, problems)
    if spec.get("ingress") and isinstance(types, list) and types and "Ingress" not in types:
        problems.append(f"spec.ingress: ignored: policyTypes {_v(types)} does not include Ingress")
    if spec.get("egress") and isinstance(types, list) and types and "Egress" not in types:
        problems.append(f"spec.egress: ignored: policyTypes {_v(types)} does not include Egress")
    return problems


def _v(value: Any) -> str:
    """A value as the API server's messages print it: strings quoted, numbers bare."""
    return json.dumps(value)


def _unknown(obj: Mapping[str, Any], known: Sequence[str], path: str, problems: list[str]) -> None:
    for key in obj:
        if key not in known:
            problems.append(f'unknown field "{path + "." if path else ""}{key}"')


def _rule_problems(rule: Any, path: str, peers_key: str, problems: list[str]) -> None:
    if not isinstance(rule, Mapping):
        problems.append(f"{path}: Invalid value: {_v(rule)}: must be an object")
        return
    _unknown(rule, (peers_key, "ports"), path, problems)
    ports = rule.get("ports")
    if ports is not None and not isinstance(ports, list):
        problems.append(f"{path}.ports: Invalid value: {_v(ports)}: must be a list")
    elif ports:
        combinations = set()
        for i, port in enumerate(ports):
            if _port_problems(port, f"{path}.ports[{i}]", problems):
                combinations.add((port.get("protocol") or "TCP", port.get("port"), port.get("endPort")))
        if len(combinations) > MAX_PORT_PROTOCOL:
            problems.append(
                f"{path}.ports: {len(combinations)} port/protocol combinations: "
                f"the VPC CNI holds at most {MAX_PORT_PROTOCOL} per CIDR and drops the rest"
            )
    peers = rule.get(peers_key)
    if peers is not None and not isinstance(peers, list):
        problems.append(f"{path}.{peers_key}: Invalid value: {_v(peers)}: must be a list")
    elif peers:
        for i, peer in enumerate(peers):
            _peer_problems(peer, f"{path}.{peers_key}[{i}]", problems)


def _port_problems(port: Any, path: str, problems: list[str]) -> bool:
    """Appends a port's problems (validation.go ValidateNetworkPolicyPort); True if it has none."""
    before = len(problems)
    if not isinstance(port, Mapping):
        problems.append(f"{path}: Invalid value: {_v(port)}: must be an object")
        return False
    _unknown(port, ("protocol", "port", "endPort"), path, problems)
    protocol, number, end_port = port.get("protocol"), port.get("port"), port.get("endPort")
    if protocol is not None and protocol not in PROTOCOLS:
        problems.append(f'{path}.protocol: Unsupported value: {_v(protocol)}: supported values: "TCP", "UDP", "SCTP"')
    if end_port is not None and (not isinstance(end_port, int) or isinstance(end_port, bool)):
        problems.append(f"{path}.endPort: Invalid value: {_v(end_port)}: must be an integer")
        end_port = None
    if isinstance(number, bool) or (number is not None and not isinstance(number, int | str)):
        problems.append(f"{path}.port: Invalid value: {_v(number)}: must be an integer or a port name")
    elif isinstance(number, int):
        if not 1 <= number <= 65535:
            problems.append(f"{path}.port: Invalid value: {number}: must be between 1 and 65535, inclusive")
        if end_port is not None:
            if end_port < number:
                problems.append(f"{path}.endPort: Invalid value: {end_port}: must be greater than or equal to `port`")
            if not 1 <= end_port <= 65535:
                problems.append(f"{path}.endPort: Invalid value: {end_port}: must be between 1 and 65535, inclusive")
    elif isinstance(number, str):
        if end_port is not None:
            problems.append(
                f"{path}.endPort: Invalid value: {end_port}: may not be specified when `port` is non-numeric"
            )
        if not _valid_port_name(number):
            problems.append(
                f"{path}.port: Invalid value: {_v(number)}: not a port name (at most 15 of a-z, 0-9 and '-', "
                "with a letter, no '--', not starting or ending with '-')"
            )
    elif end_port is not None:
        problems.append(f"{path}.endPort: Invalid value: {end_port}: may not be specified when `port` is not specified")
    return len(problems) == before


def _valid_port_name(name: str) -> bool:
    """IANA_SVC_NAME, as Kubernetes' IsValidPortName checks it."""
    return len(name) <= 15 and bool(_PORT_NAME.match(name)) and "--" not in name and bool(re.search("[a-z]", name))


def _peer_problems(peer: Any, path: str, problems: list[str]) -> None:
    if not isinstance(peer, Mapping):
        problems.append(f"{path}: Invalid value: {_v(peer)}: must be an object")
        return
    _unknown(peer, ("podSelector", "namespaceSelector", "ipBlock"), path, problems)
    selectors = [key for key in ("podSelector", "namespaceSelector") if peer.get(key) is not None]
    if peer.get("ipBlock") is None and not selectors:
        problems.append(f"{path}: Required value: must specify a peer")
    elif peer.get("ipBlock") is not None and selectors:
        problems.append(f"{path}: Forbidden: may not specify both ipBlock and another peer")
    for key in selectors:
        _selector_problems(peer[key], f"{path}.{key}", problems)
    if peer.get("ipBlock") is not None:
        _ip_block_problems(peer["ipBlock"], f"{path}.ipBlock", problems)


def _ip_block_problems(block: Any, path: str, problems: list[str]) -> None:
    if not isinstance(block, Mapping):
        problems.append(f"{path}: Invalid value: {_v(block)}: must be an object")
        return
    _unknown(block, ("cidr", "except"), path, problems)
    if not block.get("cidr"):
        problems.append(f"{path}.cidr: Required value")
        return
    cidr = _cidr(block["cidr"], f"{path}.cidr", problems)
    excepted = block.get("except") or []
    if not isinstance(excepted, list):
        problems.append(f"{path}.except: Invalid value: {_v(excepted)}: must be a list")
        return
    for i, text in enumerate(excepted):
        x = _cidr(text, f"{path}.except[{i}]", problems)
        # validation.go ValidateIPBlock: cidr contains the except's address, with a longer prefix.
        if (
            cidr is not None
            and x is not None
            and (x.version != cidr.version or x.network_address not in cidr or x.prefixlen <= cidr.prefixlen)
        ):
            problems.append(f"{path}.except[{i}]: Invalid value: {_v(text)}: must be a strict subset of `cidr`")


def _cidr(text: Any, path: str, problems: list[str]) -> ipaddress.IPv4Network | ipaddress.IPv6Network | None:
    if not isinstance(text, str) or not _CIDR.match(text):
        problems.append(
            f"{path}: Invalid value: {_v(text)}: must be a valid CIDR value, (e.g. 10.9.8.0/24 or 2001:db8::/64)"
        )
        return None
    try:
        network = ipaddress.ip_network(text, strict=False)
    except ValueError:
        problems.append(
            f"{path}: Invalid value: {_v(text)}: must be a valid CIDR value, (e.g. 10.9.8.0/24 or 2001:db8::/64)"
        )
        return None
    if str(network) != text:
        problems.append(f"{path}: Invalid value: {_v(text)}: host bits set, it means {network}: write that")
    return network


def _selector_problems(selector: Any, path: str, problems: list[str]) -> None:
    """apimachinery's ValidateLabelSelector: matchLabels, and matchExpressions with the four operators."""
    if selector is None:
        return
    if not isinstance(selector, Mapping):
        problems.append(f"{path}: Invalid value: {_v(selector)}: must be an object")
        return
    _unknown(selector, ("matchLabels", "matchExpressions"), path, problems)
    labels = selector.get("matchLabels") or {}
    if not isinstance(labels, Mapping):
        problems.append(f"{path}.matchLabels: Invalid value: {_v(labels)}: must be an object")
        labels = {}
    for key, value in labels.items():
        _label_key_problems(key, f"{path}.matchLabels", problems)
        _label_value_problems(value, f"{path}.matchLabels", problems)
    expressions = selector.get("matchExpressions") or []
    if not isinstance(expressions, list):
        problems.append(f"{path}.matchExpressions: Invalid value: {_v(expressions)}: must be a list")
        return
    for i, expression in enumerate(expressions):
        at = f"{path}.matchExpressions[{i}]"
        if not isinstance(expression, Mapping):
            problems.append(f"{at}: Invalid value: {_v(expression)}: must be an object")
            continue
        _unknown(expression, ("key", "operator", "values"), at, problems)
        _label_key_problems(expression.get("key"), f"{at}.key", problems)
        operator, values = expression.get("operator"), expression.get("values") or []
        if not isinstance(values, list):
            problems.append(f"{at}.values: Invalid value: {_v(values)}: must be a list")
            continue
        if operator in ("In", "NotIn") and not values:
            problems.append(f"{at}.values: Required value: must be specified when `operator` is 'In' or 'NotIn'")
        elif operator in ("Exists", "DoesNotExist") and values:
            problems.append(
                f"{at}.values: Forbidden: may not be specified when `operator` is 'Exists' or 'DoesNotExist'"
            )
        elif operator not in _OPERATORS:
            problems.append(
                f'{at}.operator: Unsupported value: {_v(operator)}: supported values: "In", "NotIn", "Exists", "DoesNotExist"'
            )
        for j, value in enumerate(values):
            _label_value_problems(value, f"{at}.values[{j}]", problems)


def _label_key_problems(key: Any, path: str, problems: list[str]) -> None:
    prefix, _, name = key.rpartition("/") if isinstance(key, str) else ("", "", "")
    if not (
        isinstance(key, str)
        and len(name) <= 63
        and _LABEL_NAME.match(name)
        and (not prefix or (len(prefix) <= 253 and _DNS_SUBDOMAIN.match(prefix)))
    ):
        problems.append(
            f"{path}: Invalid value: {_v(key)}: not a label key ([prefix/]name, the name 63 characters at most)"
        )


def _label_value_problems(value: Any, path: str, problems: list[str]) -> None:
    if not isinstance(value, str) or len(value) > 63 or (value and not _LABEL_NAME.match(value)):
        problems.append(
            f"{path}: Invalid value: {_v(value)}: not a label value (63 characters at most: alphanumerics, '-', '_' "
            "and '.', starting and ending with an alphanumeric)"
        )
