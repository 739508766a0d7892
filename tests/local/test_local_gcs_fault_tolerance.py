"""The head's GCS dies under load and the phases keep their replicas: the cluster's shape on this CPU.

The server runs with ``--gcs-fault-tolerance`` (local/cluster.py): a Redis server on loopback, a Ray
head with no resources, one worker node per phase, the clients on the worker nodes' Serve proxies.
The test SIGKILLs the head's ``gcs_server`` during a stream of requests. As on Kubernetes, the
head's ``ray start --block`` then stops the rest of the head and exits, and the head is started
again (the kubelet's restart; the run does it here); the new GCS reads the cluster back from Redis.

Asserted: the prefill and decode engine processes (the replicas' workers and their vLLM
EngineCore processes) keep their pids; requests succeed again within RECOVERY_BOUND_S (generous:
the measured number goes to results/local-tests/, not into an assertion); no request outlives
Serve's request timeout; decode takes the prompt's KV over NIXL again. Should the engines not keep
their pids, the test names the controller's reason (see the end of the first test). The same kill
without fault tolerance (``--ray-cluster``) costs the engines at once: the worker nodes leave the
new cluster and take them with them.
"""

from __future__ import annotations

import os
import signal
import threading
import time

import pytest

from local import lifecycle
from local.harness import session_processes
from local.metrics import PROMPT_TOKENS_BY_SOURCE, counter_delta
from tests.local.conftest import openai_client, report_measurement, unique_prompt, wait_for_counters
from tests.local.test_local_disaggregated import REQUEST_TIMEOUT_S, server_spec, summary

pytestmark = pytest.mark.live
MODEL = "tiny-llama"
# Requests succeed again within this long of the kill (measured: see the report); generous.
RECOVERY_BOUND_S = 120
# How long the load may run after the kill before the test gives up waiting for recovery.
OBSERVE_S = 240
LOAD_CLIENTS = 2
# Load that goes on after the recovered controller has decided about the replicas.
SETTLE_S = 20


def engine_processes(session: int) -> dict[int, tuple[str | None, str]]:
    """pid -> (start time, command) of the phases' replica workers and their vLLM processes."""
    from local.ray_internals import replica_process_title

    app = server_spec().app_name
    titles = tuple(replica_process_title(app, phase) for phase in ("Prefill", "Decode"))
    members = session_processes(session)
    parents = {}
    for pid in members:
        try:
            parents[pid] = int(open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            continue
    replicas = {pid for pid in members if any(title in lifecycle.command_of(pid) for title in titles)}
    engines = replicas | {pid for pid, parent in parents.items() if parent in replicas}
    return {pid: (lifecycle.start_time(pid), lifecycle.command_of(pid)) for pid in sorted(engines)}


def still_running(before: dict[int, tuple[str | None, str]]) -> dict[int, bool]:
    return {pid: lifecycle.alive(pid) and lifecycle.start_time(pid) == started for pid, (started, _) in before.items()}


def gcs_servers(session: int) -> list[int]:
    return [pid for pid in session_processes(session) if "/gcs/gcs_server " in lifecycle.command_of(pid) + " "]


def load(server, records: list[dict], stop: threading.Event, index: int) -> None:
    """One closed-loop client, appending a record per request to ``records`` as it goes."""
    import openai

    client = openai.OpenAI(
        base_url=server.base_url, api_key=server.api_key or "unused", timeout=REQUEST_TIMEOUT_S, max_retries=0
    )
    n = 0
    while not stop.is_set():
        started = time.monotonic()
        record: dict = {"client": index, "started": started, "outcome": None}  # None: in flight
        records.append(record)
        try:
            client.completions.create(model=MODEL, prompt=unique_prompt(f"gcs{index}-{n}", 64), max_tokens=8)
            outcome = "ok"
        except openai.APIStatusError as exc:
            outcome = f"http {exc.status_code}"
        except openai.APITimeoutError:
            outcome = "timeout"
        except openai.APIConnectionError:
            outcome = "connection"
        record.update(seconds=time.monotonic() - started, outcome=outcome)
        n += 1
        time.sleep(0.2)


def recovered(records: list[dict], killed_at: float, clean_s: float = 10.0) -> float | None:
    """When the first request that ended after every failure since the kill succeeded, once
    ``clean_s`` seconds of successes followed it; None until then (or while an older request is
    still in flight: it may yet fail)."""
    now = time.monotonic()
    if any(r["outcome"] is None and now - r["started"] > 1 for r in list(records)):
        return None
    done = [r for r in list(records) if r["outcome"] is not None]
    after = sorted((r for r in done if r["started"] + r["seconds"] > killed_at), key=lambda r: r["started"])
    last_failure_end = max((r["started"] + r["seconds"] for r in after if r["outcome"] != "ok"), default=killed_at)
    oks = [r["started"] + r["seconds"] for r in after if r["outcome"] == "ok" and r["started"] >= last_failure_end]
    if oks and now - last_failure_end > clean_s and len(oks) >= 3:
        return min(oks)
    return None


def kill_gcs_under_load(server) -> dict:
    """Kills the head's GCS during a stream of requests; returns what the clients saw."""
    session = server.process.pid
    engines = engine_processes(session)
    phases = {phase for _, command in engines.values() for phase in ("Prefill", "Decode") if f":{phase}:" in command}
    assert phases == {"Prefill", "Decode"} and any("EngineCore" in c for _, c in engines.values()), engines
    victims = gcs_servers(session)
    assert len(victims) == 1, victims

    stop = threading.Event()
    records: list[dict] = []
    clients = [threading.Thread(target=load, args=(server, records, stop, i), daemon=True) for i in range(LOAD_CLIENTS)]
    for client in clients:
        client.start()
    time.sleep(8)
    killed_at = time.monotonic()
    os.kill(victims[0], signal.SIGKILL)
    # Until the head was started again and its Serve controller recovered the app (the moment it
    # keeps or replaces the replicas), then SETTLE_S more of load, then until requests succeed.
    deadline = killed_at + OBSERVE_S
    while time.monotonic() < deadline and not controller_recovered(server):
        time.sleep(2)
    controller_back = time.monotonic()
    next_ok = None
    while time.monotonic() < deadline and next_ok is None:
        time.sleep(2)
        if time.monotonic() - controller_back > SETTLE_S:
            next_ok = recovered(records, killed_at)
    stop.set()
    for client in clients:
        client.join(REQUEST_TIMEOUT_S + 10)
    records = [r for r in records if r["outcome"] is not None]
    failed = [r for r in records if r["outcome"] != "ok" and r["started"] + r["seconds"] > killed_at]
    return {
        "session": session,
        "engines": engines,
        "records": records,
        "failed": failed,
        "killed_at": killed_at,
        "recovered_after_s": round(next_ok - killed_at, 1) if next_ok else None,
        "controller_recovered_after_s": round(controller_back - killed_at, 1),
        "failing_from_s": round(min(r["started"] for r in failed) - killed_at, 1) if failed else None,
        "failing_until_s": round(max(r["started"] + r["seconds"] for r in failed) - killed_at, 1) if failed else None,
    }


def controller_recovered(server) -> bool:
    """Whether the head was started again and its new Serve controller finished recovering."""
    from local.ray_internals import serve_controller_logs

    cluster = server.read_status().get("cluster", {})
    if not any(r["node"] == "head" for r in cluster.get("restarts", [])):
        return False
    logs = serve_controller_logs(cluster["temp_dirs"]["head"])
    return any("Finished recovering deployments" in path.read_text(errors="replace") for path in logs)


def controller_replaced_engines(status: dict) -> str | None:
    """The line of the recovered Serve controller's log saying why it stopped an engine replica,
    if it was Ray Serve's recovery failing on the replica's closed log handler (see the test)."""
    from local.ray_internals import serve_controller_logs

    head = status["cluster"]["temp_dirs"]["head"]
    for path in serve_controller_logs(head):
        text = path.read_text(errors="replace")
        if "is_allocated" in text and "no attribute 'baseFilename'" in text:
            return next(line for line in text.splitlines() if "Exception in Replica" in line)[:300]
    return None


def test_gcs_killed_under_load_keeps_the_engines_and_recovers(shared_servers):
    server = shared_servers.get("gcs-fault-tolerant")
    cluster = server.status["cluster"]
    assert cluster["gcs_fault_tolerance"] is True and cluster["redis"].startswith("127.0.0.1:")
    assert server.status["base_url"] == f"http://127.0.0.1:{server.port}/v1"
    assert cluster["head_proxy_port"] != server.port  # clients reach the worker nodes' proxies only

    seen = kill_gcs_under_load(server)
    kept = still_running(seen["engines"])
    status = server.read_status()
    restarts = status.get("cluster", {}).get("restarts", [])
    bound = server_spec().request_timeout_s + 10
    report_measurement(
        "gcs-killed-under-load",
        {
            **summary(seen["records"], OBSERVE_S),
            "recovered_after_s": seen["recovered_after_s"],
            "controller_recovered_after_s": seen["controller_recovered_after_s"],
            "failing_from_s_after_kill": seen["failing_from_s"],
            "failing_until_s_after_kill": seen["failing_until_s"],
            "errors": sorted({r["outcome"] for r in seen["failed"]}),
            "engine_pids_before": {str(pid): command for pid, (_, command) in seen["engines"].items()},
            "engine_pids_kept": {str(pid): alive for pid, alive in kept.items()},
            "engine_pids_after": {str(pid): command for pid, (_, command) in engine_processes(seen["session"]).items()},
            "node_restarts": [r["node"] for r in restarts],
        },
    )
    assert server.process.poll() is None, server.log_tail()
    # The head, and only the head, restarted (more than once when a start timed out on the way).
    assert {r["node"] for r in restarts} == {"head"}, restarts
    assert seen["recovered_after_s"] is not None, "no successful request after the outage"
    assert seen["recovered_after_s"] < RECOVERY_BOUND_S, seen["recovered_after_s"]
    # No request hung past Serve's request timeout (plus scheduling slack); the failures were answers.
    assert all(r["seconds"] < bound for r in seen["records"]), [r for r in seen["records"] if r["seconds"] >= bound][:3]
    assert all(r["outcome"] in ("http 408", "http 500", "http 502", "http 503") for r in seen["failed"]), seen[
        "failed"
    ][:3]

    # Decode still takes the prompt's KV from the same prefill engine over NIXL.
    client = openai_client(server)
    before = server.counters()
    response = client.completions.create(model=MODEL, prompt=unique_prompt("after-gcs", 90), max_tokens=4)
    after = wait_for_counters(
        server, before, "Decode", PROMPT_TOKENS_BY_SOURCE, "external_kv_transfer", response.usage.prompt_tokens
    )
    assert (
        counter_delta(before, after, "Decode", PROMPT_TOKENS_BY_SOURCE, "external_kv_transfer")
        == response.usage.prompt_tokens
    )

    # No engine restarted: the same processes (pid and start time), no model reload. NIXL's and
    # vLLM's logging set-up would close Serve's log handler in the replica, and the recovered
    # controller would then replace the engine replicas; serve_app's engine callback keeps it open
    # (serve_app/callbacks.py). A regression says so by the controller's own log line.
    if not all(kept.values()):
        reason = controller_replaced_engines(status)
        assert reason is None, f"Serve's recovery replaced the engine replicas on a closed log handler: {reason}"
    assert all(kept.values()), (kept, engine_processes(seen["session"]))


def test_without_fault_tolerance_the_same_kill_costs_the_engines(shared_servers):
    """The control: the same shape and the same kill, no Redis. The new GCS is a new cluster; the
    worker nodes' raylets leave it and take the engines with them (on a cluster: a model reload)."""
    server = shared_servers.get("ray-cluster")
    assert server.status["cluster"]["gcs_fault_tolerance"] is False
    session = server.process.pid
    engines = engine_processes(session)
    assert engines
    victims = gcs_servers(session)
    assert len(victims) == 1, victims
    killed_at = time.monotonic()
    os.kill(victims[0], signal.SIGKILL)
    deadline = killed_at + 120
    while any(still_running(engines).values()) and time.monotonic() < deadline:
        time.sleep(1)
    kept = still_running(engines)
    report_measurement(
        "gcs-killed-without-fault-tolerance",
        {
            "engines_gone_after_s": round(time.monotonic() - killed_at, 1),
            "engine_pids_kept": {str(pid): alive for pid, alive in kept.items()},
            "server_exit_code": server.process.poll(),
        },
    )
    assert not any(kept.values()), kept
    # The driver may die with the old cluster (Ray ends a driver whose GCS is gone); whatever the
    # run left, nothing outlives the test.
    server.stop()
    left = lifecycle.stop_processes(session_processes(session))
    assert left == []
