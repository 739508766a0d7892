"""`make verify` decides the KV path from what the GPU worker containers print (verify/efa.py): recorded
outputs of the node probe and of the EFA device's hw_counters after one P/D request, healthy and broken
the ways the path breaks."""

from __future__ import annotations

import shutil

import pytest

from tests.conftest import ROOT
from tests.verify.test_checks import DECODE_POD, HEALTHY, PREFILL_POD, verify_cli
from verify import efa
from verify.kube import slug

RECORDED = ROOT / "tests" / "fixtures" / "verify" / "efa"
PODS = {PREFILL_POD: "prefill", DECODE_POD: "decode"}
# The prefill worker's address in the healthy recording's pod list.
POD_IP = "10.40.12.5"
# The prompt of the healthy recording's request, as decode's external_kv_transfer counted it.
RECEIVED = 46.0


def outputs(variant: str, kind: str) -> dict[str, str]:
    return {pod: (RECORDED / variant / f"{phase}.{kind}.txt").read_text() for pod, phase in PODS.items()}


def decide(variant: str, received: float = RECEIVED) -> tuple[efa.Finding, efa.Finding]:
    nodes = outputs(variant, "node")
    return efa.efa_in_workers(nodes), efa.kv_path(nodes, outputs(variant, "after"), PODS, received)


def test_healthy_kv_crosses_by_device_rdma_read():
    nodes, path = decide("healthy")
    assert nodes.passed and "device RDMA read and write (efa-direct offers FI_RMA)" in nodes.evidence
    assert f"{DECODE_POD}: uverbs0, memlock unlimited, efa provider" in nodes.evidence
    assert path.passed
    assert path.evidence.startswith(
        "KV crossed by device RDMA read: 2752512 bytes (decode rdma_read_bytes; prefill served 2752512)"
    )


def test_a_peer_that_never_answers_over_srd_names_the_security_group_and_the_fallback():
    nodes, path = decide("unreachable-peer")
    assert nodes.passed
    assert not path.passed
    assert path.evidence.startswith(
        f"did not cross by EFA: unresponsive_remote_events {DECODE_POD} +3: the peer does not answer over SRD (the "
        "EFA security group must admit itself inbound and outbound"
    )
    assert path.evidence.endswith(efa.UCX_FALLBACK)


def test_no_uverbs_in_the_container_names_the_device_plugin():
    nodes, _ = decide("no-uverbs", received=0)
    assert not nodes.passed
    assert f"{PREFILL_POD}: no /dev/infiniband/uverbs* in the container: the EFA device plugin" in nodes.evidence
    assert f"{DECODE_POD}: fi_info lists no efa provider" in nodes.evidence
    assert nodes.evidence.endswith(efa.UCX_FALLBACK)


def test_a_limited_locked_memory_names_the_limit_and_its_fix():
    nodes, path = decide("memlock-limited")
    assert not nodes.passed
    assert f"{DECODE_POD}: locked memory limited to 8192 KiB" in nodes.evidence
    assert "LimitMEMLOCK=infinity" in nodes.evidence
    assert path.passed  # the counters alone say the read crossed


def test_without_device_rma_the_read_is_emulated_over_srd_sends():
    nodes, path = decide("emulated-read")
    assert nodes.passed and "libfabric emulates reads over SRD sends" in nodes.evidence
    assert path.passed
    assert path.evidence.startswith("KV crossed by emulated read: no device RDMA read counted, ")


def test_a_pingpong_that_answers_shows_srd_reachability():
    found = efa.srd_reachable(DECODE_POD, PREFILL_POD, (RECORDED / "healthy" / "pingpong.txt").read_text())
    assert found.passed
    assert found.evidence == f"{DECODE_POD} reached {PREFILL_POD} over SRD: 4k 10 80k 0.00s 85.33 48.00 0.02"


def test_a_pingpong_that_times_out_names_the_security_group():
    found = efa.srd_reachable(DECODE_POD, PREFILL_POD, (RECORDED / "unreachable-peer" / "pingpong.txt").read_text())
    assert not found.passed
    assert found.evidence.startswith(
        f"{DECODE_POD} could not reach {PREFILL_POD} over SRD (no answer over SRD within 30 s): the EFA security "
        "group must admit itself inbound and outbound"
    )


def test_the_network_policies_admit_the_pingpongs_address_exchange():
    """fi_pingpong's client exchanges addresses with its server over TCP on fabtests' default port."""
    import yaml

    from config.loader import parse_config
    from manifests.network_policies import network_policies
    from tests.conftest import CONFIG_DIR
    from tests.manifests.test_network_policies import DESTINATIONS, SOURCES, Pod, explain

    policies = network_policies(parse_config(yaml.safe_load((CONFIG_DIR / "dev.yaml").read_text())))
    pods = [p for p in SOURCES.values() if isinstance(p, Pod)]
    verdict = explain(policies, SOURCES["decode"], DESTINATIONS["prefill"], efa.PINGPONG_PORT, pods=pods)
    assert verdict.admitted, verdict.reason


def test_counters_that_cannot_be_read_leave_the_path_unknown():
    nodes = outputs("healthy", "node")
    path = efa.kv_path(nodes, {pod: "(not probed: kubectl exec failed)" for pod in PODS}, PODS, RECEIVED)
    assert not path.passed and "hw_counters could not be read" in path.evidence


def test_the_healthy_recording_holds_the_healthy_probe():
    """`make verify --recorded healthy` reads these outputs under the names kubectl exec gets."""
    for pod, phase in PODS.items():
        base = ["exec", pod, "-n", "llm", "-c", "ray-worker", "--", "sh", "-c"]
        for kind, script in (("node", efa.NODE_SCRIPT), ("after", efa.COUNTERS_SCRIPT)):
            recorded = (HEALTHY / f"{slug([*base, script])}.txt").read_text()
            assert recorded == (RECORDED / "healthy" / f"{phase}.{kind}.txt").read_text()


@pytest.mark.parametrize(
    ("variant", "line"),
    [
        ("unreachable-peer", "FAIL KV path: did not cross by EFA: unresponsive_remote_events"),
        ("unreachable-peer", "FAIL SRD between prefill and decode: "),
        ("no-uverbs", "FAIL EFA inside the GPU workers: "),
    ],
)
def test_make_verify_reports_the_broken_path(tmp_path, variant, line):
    broken = tmp_path / variant
    shutil.copytree(HEALTHY, broken)
    for pod, phase in PODS.items():
        base = ["exec", pod, "-n", "llm", "-c", "ray-worker", "--", "sh", "-c"]
        for kind, script in (("node", efa.NODE_SCRIPT), ("after", efa.COUNTERS_SCRIPT)):
            shutil.copy(RECORDED / variant / f"{phase}.{kind}.txt", broken / f"{slug([*base, script])}.txt")
    pingpong = RECORDED / variant / "pingpong.txt"
    if pingpong.is_file():
        client = ["exec", DECODE_POD, "-n", "llm", "-c", "ray-worker", "--", "sh", "-c"]
        shutil.copy(pingpong, broken / f"{slug([*client, efa.pingpong_client(POD_IP)])}.txt")
    done = verify_cli("--recorded", str(broken))
    assert done.returncode == 1
    assert line in done.stdout, done.stdout


def test_with_the_ucx_backend_no_efa_check_runs(tmp_path):
    import yaml

    from tests.conftest import CONFIG_DIR

    data = yaml.safe_load((CONFIG_DIR / "dev.yaml").read_text())
    data["serving"].setdefault("kv_transfer", {})["backend"] = "UCX"
    config = tmp_path / "dev.yaml"
    config.write_text(yaml.safe_dump(data))
    done = verify_cli("--config", str(config), "--recorded", str(HEALTHY))
    names = [line.split(":")[0] for line in done.stdout.splitlines()[:-1]]
    assert done.returncode == 0, done.stdout + done.stderr
    assert "PASS EFA allocated to workers" in names
    assert not [
        n for n in names if n.endswith(("NIXL uses EFA", "EFA inside the GPU workers", "SRD between", "KV path"))
    ]


def test_the_node_script_runs_in_a_real_shell_and_a_machine_without_efa_records_no_efa_device(tmp_path):
    """What bench/gpu/run.sh does first, on this machine (no EFA): the probe runs to its end in sh and
    the verdict is the evidence a GPU machine without EFA gives."""
    import subprocess
    import sys
    from pathlib import Path

    if Path("/dev/infiniband").exists():
        pytest.skip("this machine has an RDMA device: the no-EFA verdict is not its evidence")
    script = subprocess.run(
        [sys.executable, "-m", "verify.efa", "--script"], cwd=ROOT, capture_output=True, text=True, check=True
    )
    probed = subprocess.run(["sh", "-c", script.stdout], capture_output=True, text=True, timeout=60)
    (tmp_path / "efa-node.txt").write_text(probed.stdout + probed.stderr)
    assert {"devices", "memlock", "efa", "efa-direct rma", "hw_counters"} <= efa.parse_probe(probed.stdout).sections
    judged = subprocess.run(
        [sys.executable, "-m", "verify.efa", "--judge", str(tmp_path / "efa-node.txt")],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert judged.returncode == 1
    assert "this machine: no EFA device (no uverbs device, no efa provider, no hw_counters)" in judged.stdout
