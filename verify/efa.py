"""The KV path on the nodes it runs on: what each GPU worker container sees of its EFA device, and by
which path a P/D request's KV crossed, from the EFA device's own counters.

NIXL's LIBFABRIC backend stages KV in host memory and reads it from the peer over EFA. What decides
whether that works, read from libfabric 2.4 (the DLC's EFA installer 1.47.0) and the EFA driver:

- The container needs the device (``/dev/infiniband/uverbs*``, which the EFA device plugin hands the
  pod with ``vpc.amazonaws.com/efa``) and an unlimited locked-memory limit (libfabric pins the buffers
  it registers).
- ``fi_info -p efa`` must list the provider. Its ``efa`` fabric always advertises RMA (it emulates a
  read over SRD sends where the device cannot read); the ``efa-direct`` fabric advertises ``FI_RMA``
  only when the device has RDMA read and write (prov/efa/src/efa_prov_info.c), so it is the capability
  probe. ``ibv_devinfo``'s ``max_qp_rd_atom`` is 0 on every EFA device and says nothing.
- NIXL's own counters do not show device RDMA on libfabric; the device's ``hw_counters`` do:
  ``rdma_read_bytes`` grows on the reader (decode), ``rdma_read_resp_bytes`` on the target (prefill),
  ``unresponsive_remote_events`` when the peer never answers over SRD (libfabric: "most often
  incorrect inbound/outbound security group rules and/or instances placed in different subnets"),
  ``rdma_read_wr_err`` on failed reads.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field

EFA_BIN = "/opt/amazon/efa/bin"
COUNTERS = (
    "rdma_read_bytes",
    "rdma_read_resp_bytes",
    "rdma_read_wr_err",
    "unresponsive_remote_events",
    "tx_bytes",
    "rx_bytes",
)
_COUNTER_FILES = " ".join(f"/sys/class/infiniband/*/ports/1/hw_counters/{name}" for name in COUNTERS)
# Sections the node probe prints, each under a "== name" line (POSIX sh: the worker image's /bin/sh).
COUNTERS_SCRIPT = f"echo '== hw_counters'; grep -H . {_COUNTER_FILES} 2>&1"
NODE_SCRIPT = (
    "echo '== devices'; ls /dev/infiniband/ 2>&1; "
    "echo '== memlock'; ulimit -l; "
    f"echo '== efa'; {EFA_BIN}/fi_info -p efa -t FI_EP_RDM 2>&1 | head -n 40; "
    f"echo '== efa-direct rma'; {EFA_BIN}/fi_info -p efa -f efa-direct -t FI_EP_RDM -c FI_RMA 2>&1 | head -n 20; "
    f"{COUNTERS_SCRIPT}"
)
# fabtests' fi_pingpong between a prefill and a decode worker: SRD reachability, which is what fails when the
# EFA security group does not admit itself both ways. The server runs in the background in the prefill
# container for at most a minute; the client exchanges addresses with it over TCP on fabtests' default
# out-of-band port (the Ray-to-Ray network policy admits it), then pings over SRD.
PINGPONG_PORT = 47592
PINGPONG = f"{EFA_BIN}/fi_pingpong -p efa -e rdm -I 10 -S 4096"
PINGPONG_SERVER = f"(timeout 60 {PINGPONG} > /tmp/pd-efa-pingpong.log 2>&1 &); echo started"


def pingpong_client(address: str) -> str:
    return f"timeout 30 {PINGPONG} {address} 2>&1; echo exit=$?"


UCX_FALLBACK = "serving.kv_transfer.backend: UCX moves KV over TCP meanwhile (slower, docs/troubleshooting.md)"
EFA_NODES = "EFA inside the GPU workers"
SRD = "SRD between prefill and decode"
KV_PATH = "KV path"
_COUNTER_LINE = re.compile(r"^/sys/class/infiniband/([^/]+)/ports/1/hw_counters/(\w+):(\d+)$")


@dataclass
class NodeProbe:
    """What one worker container printed for :data:`NODE_SCRIPT` (or :data:`COUNTERS_SCRIPT`)."""

    uverbs: list[str] = field(default_factory=list)
    memlock: str = ""
    efa_provider: bool = False
    device_rma: bool = False
    counters: dict[str, int] = field(default_factory=dict)  # summed over the container's EFA devices
    sections: set[str] = field(default_factory=set)


def parse_probe(text: str) -> NodeProbe:
    probe = NodeProbe()
    section = ""
    for raw in text.splitlines():
        line = raw.strip()
        if line.startswith("== "):
            section = line[3:]
            probe.sections.add(section)
            continue
        if section == "devices":
            probe.uverbs += [name for name in line.split() if re.fullmatch(r"uverbs\d+", name)]
        elif section == "memlock" and line:
            probe.memlock = line
        elif section == "efa" and re.match(r"^provider:\s*efa\b", line):
            probe.efa_provider = True
        elif section == "efa-direct rma" and re.match(r"^provider:\s*efa\b", line):
            probe.device_rma = True
        elif section == "hw_counters" and (match := _COUNTER_LINE.match(line)):
            _, name, value = match.groups()
            probe.counters[name] = probe.counters.get(name, 0) + int(value)
    return probe


@dataclass
class Finding:
    passed: bool
    evidence: str


def efa_in_workers(probes: Mapping[str, str]) -> Finding:
    """Each running GPU worker container (pod -> its :data:`NODE_SCRIPT` output) has the EFA device, an
    unlimited locked-memory limit and libfabric's efa provider; says whether the device reads and
    writes itself (efa-direct RMA) or libfabric emulates reads."""
    problems, facts = [], []
    if not probes:
        problems.append("no running GPU worker to probe")
    for pod, text in sorted(probes.items()):
        probe = parse_probe(text)
        if "devices" not in probe.sections:
            problems.append(f"{pod}: not probed ({text.strip()[:120]})")
            continue
        mine = []
        if not (probe.uverbs or probe.efa_provider or probe.counters):
            problems.append(f"{pod}: no EFA device (no uverbs device, no efa provider, no hw_counters)")
            continue
        if not probe.uverbs:
            mine.append(
                "no /dev/infiniband/uverbs* in the container: the EFA device plugin gave the pod no device "
                "(is aws-efa-k8s-device-plugin running on the node, and does the pod request vpc.amazonaws.com/efa?)"
            )
        if probe.memlock != "unlimited":
            mine.append(
                f"locked memory limited to {probe.memlock or '?'} KiB: libfabric cannot pin NIXL's host KV "
                "buffers; give the container runtime on the node LimitMEMLOCK=infinity"
            )
        if not probe.efa_provider:
            mine.append("fi_info lists no efa provider: libfabric finds no EFA device in the container")
        if mine:
            problems += [f"{pod}: {problem}" for problem in mine]
            continue
        reads = (
            "device RDMA read and write (efa-direct offers FI_RMA)"
            if probe.device_rma
            else "no device RDMA (efa-direct offers no FI_RMA): libfabric emulates reads over SRD sends"
        )
        facts.append(f"{pod}: {', '.join(probe.uverbs)}, memlock unlimited, efa provider, {reads}")
    if problems:
        problems.append(UCX_FALLBACK)
    return Finding(not problems, "; ".join(problems or facts))


def srd_reachable(client: str, server: str, output: str) -> Finding:
    """What :func:`pingpong_client` printed in ``client`` against ``server``."""
    status = re.search(r"^exit=(\d+)$", output, re.MULTILINE)
    rows = [line.strip() for line in output.splitlines() if re.match(r"^\s*\d+[kmg]?\s+\d+", line)]
    if status and status.group(1) == "0" and rows:
        return Finding(True, f"{client} reached {server} over SRD: {' '.join(rows[-1].split())}")
    if status and status.group(1) == "124":
        cause = "no answer over SRD within 30 s"
    else:
        lines = [line.strip() for line in output.splitlines() if line.strip() and not line.startswith("exit=")]
        cause = lines[-1][:160] if lines else "no output"
    return Finding(
        False,
        f"{client} could not reach {server} over SRD ({cause}): the EFA security group must admit itself inbound "
        f"and outbound, both nodes in the GPU subnet; {UCX_FALLBACK}",
    )


def _delta(before: NodeProbe, after: NodeProbe, name: str) -> int:
    return after.counters.get(name, 0) - before.counters.get(name, 0)


def kv_path(
    before: Mapping[str, str], after: Mapping[str, str], phases: Mapping[str, str], kv_tokens_received: float
) -> Finding:
    """How one P/D request's KV crossed: the EFA counters of each worker (pod -> probe output before and
    after the request; ``phases`` pod -> prefill or decode) beside the prompt tokens decode received over
    NIXL (its ``external_kv_transfer`` counter)."""
    deltas: dict[str, dict[str, int]] = {}
    for pod in sorted(phases):
        first, last = parse_probe(before.get(pod, "")), parse_probe(after.get(pod, ""))
        if "hw_counters" not in first.sections or "hw_counters" not in last.sections or not last.counters:
            return Finding(False, f"{pod}: the EFA device's hw_counters could not be read; the path is unknown")
        deltas[pod] = {name: _delta(first, last, name) for name in COUNTERS}
    decode = [pod for pod in deltas if phases[pod] == "decode"]
    prefill = [pod for pod in deltas if phases[pod] == "prefill"]
    unanswered = {pod: d["unresponsive_remote_events"] for pod, d in deltas.items() if d["unresponsive_remote_events"]}
    errors = {pod: d["rdma_read_wr_err"] for pod, d in deltas.items() if d["rdma_read_wr_err"]}
    read = sum(deltas[pod]["rdma_read_bytes"] for pod in decode)
    served = sum(deltas[pod]["rdma_read_resp_bytes"] for pod in prefill)
    nixl = f"decode received {kv_tokens_received:g} prompt tokens over NIXL"
    if unanswered:
        where = ", ".join(f"{pod} +{n}" for pod, n in unanswered.items())
        return Finding(
            False,
            f"did not cross by EFA: unresponsive_remote_events {where}: the peer does not answer over SRD (the EFA "
            "security group must admit itself inbound and outbound, and both nodes sit in the GPU subnet); "
            f"{nixl}; {UCX_FALLBACK}",
        )
    if errors:
        where = ", ".join(f"{pod} +{n}" for pod, n in errors.items())
        return Finding(False, f"did not cross by EFA: rdma_read_wr_err {where}; {nixl}; {UCX_FALLBACK}")
    if read > 0 and kv_tokens_received > 0:
        return Finding(
            True,
            f"KV crossed by device RDMA read: {read} bytes (decode rdma_read_bytes; prefill served {served}); {nixl}",
        )
    moved = sum(d["tx_bytes"] + d["rx_bytes"] for d in deltas.values())
    if kv_tokens_received > 0 and moved > 0:
        return Finding(
            True, f"KV crossed by emulated read: no device RDMA read counted, {moved} bytes of SRD sends; {nixl}"
        )
    if kv_tokens_received > 0:
        return Finding(False, f"not by EFA: no EFA counter moved while {nixl} (another transport?)")
    if read or moved:
        return Finding(False, f"did not cross: EFA moved {read + moved} bytes but {nixl}")
    return Finding(False, f"did not cross: no EFA counter moved and {nixl}; {UCX_FALLBACK}")


def main(argv: list[str] | None = None) -> int:
    """The node checks outside Kubernetes (bench/gpu/run.sh): print the probe script, or judge its output."""
    from pathlib import Path

    from cmdline import ArgumentParser

    parser = ArgumentParser(prog="python -m verify.efa", description=main.__doc__)
    action = parser.add_mutually_exclusive_group(required=True)
    action.add_argument("--script", action="store_true", help="print the shell script that probes this machine")
    action.add_argument("--judge", metavar="FILE", type=Path, help="judge what the script printed (saved in FILE)")
    args = parser.parse_args(argv)
    if args.script:
        print(NODE_SCRIPT)
        return 0
    finding = efa_in_workers({"this machine": args.judge.read_text()})
    print(f"{'PASS' if finding.passed else 'FAIL'} {EFA_NODES}: {finding.evidence}")
    return 0 if finding.passed else 1


if __name__ == "__main__":
    raise SystemExit(main())
