"""The local server's life cycle on the real server: what is in the way, Ctrl-C during start-up,
and a kill -9 followed by a new start. Every wait is bounded; nothing is left behind.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from contextlib import contextmanager

import pytest

from local import lifecycle
from local.harness import LocalServer, session_processes
from local.server import RUN_RECORD
from tests.conftest import ROOT, openai_client, report_measurement

pytest.importorskip("ray", reason="the serving stack (requirements-serve.txt) is not installed")

# Ports of their own, so that these servers never meet the other modules' (8000/8001, 20000/22000).
PORT, METRICS_PORT, NIXL_BASE = 8010, 8095, 30000


@contextmanager
def unrelated_listener(port: int):
    """A process that is not part of any local run, listening on ``port``."""
    holder = subprocess.Popen(
        [sys.executable, "-c",
         f"import socket, time; s = socket.socket(); s.bind(('127.0.0.1', {port})); s.listen(); time.sleep(120)"],
    )
    try:
        deadline = time.monotonic() + 10
        while lifecycle.port_free(port) and time.monotonic() < deadline:
            time.sleep(0.1)
        yield holder
    finally:
        holder.kill()
        holder.wait(10)


RUN_DIR = ROOT / ".local" / "run"


@contextmanager
def server_process(*extra: str, log_name: str, **env: str):
    """`make local`'s server as its own session, logging to RUN_DIR/log_name; killed on the way out if
    the test left it running."""
    with open(RUN_DIR / log_name, "w") as log:
        process = subprocess.Popen(
            [sys.executable, "-m", "local.server", "--port", str(PORT), "--metrics-port", str(METRICS_PORT),
             "--nixl-port-base", str(NIXL_BASE), *extra],
            cwd=ROOT, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
            env={**os.environ, "PYTHONUNBUFFERED": "1", **env},
        )
        try:
            yield process
        finally:
            if process.poll() is None:
                os.killpg(process.pid, signal.SIGKILL)
                process.wait(10)


def wait_for(condition, timeout: float, what: str):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = condition()
        if value:
            return value
        time.sleep(0.5)
    raise AssertionError(f"{what} did not happen within {timeout:.0f} s")


def run_mark() -> str | None:
    try:
        return json.loads(RUN_RECORD.read_text())["mark"]
    except (FileNotFoundError, json.JSONDecodeError, KeyError):
        return None


def sweep(mark: str) -> None:
    lifecycle.stop_processes(lifecycle.run_processes(mark), grace=1)


@pytest.mark.parametrize(
    ("busy", "named"),
    [
        (PORT, f"port {PORT} (Serve's HTTP endpoint) is in use by pid"),
        (NIXL_BASE + 2000, f"port {NIXL_BASE + 2000} (the decode engine's NIXL side channel) is in use by pid"),
    ],
    ids=["http", "nixl-decode"],
)
def test_a_port_in_the_way_is_named_with_its_holder_at_once(busy, named):
    with unrelated_listener(busy) as holder:
        started = time.monotonic()
        with server_process(log_name="port-taken.log") as process:
            code = process.wait(60)
        elapsed = time.monotonic() - started
        output = (RUN_DIR / "port-taken.log").read_text()
    assert code != 0
    assert named in output and f"pid {holder.pid} (" in output and "-c import socket" in output
    assert ("--port" if busy == PORT else "--nixl-port-base") in output
    assert "Traceback" not in output
    assert session_processes(process.pid) == []
    report_measurement(f"port-taken-{busy}", {"refused_after_s": round(elapsed, 1)})


def test_ctrl_c_during_start_up_stops_the_run_within_30_seconds():
    with server_process(log_name="sigint-startup.log") as process:
        mark = wait_for(run_mark, 60, "the run record")
        # Ray is up but the engines are not: the moment the old server ignored Ctrl-C.
        wait_for(lambda: any("raylet" in lifecycle.command_of(p) for p in lifecycle.run_processes(mark)),
                 90, "Ray's raylet")
        sent = time.monotonic()
        os.killpg(process.pid, signal.SIGINT)
        code = process.wait(30)
        stopped_after = time.monotonic() - sent
    remaining = lifecycle.run_processes(mark)
    sweep(mark)
    assert code == 130
    assert remaining == [], [lifecycle.command_of(p) for p in remaining]
    assert session_processes(process.pid) == []
    report_measurement("sigint-during-startup", {"stopped_after_s": round(stopped_after, 1)})


def test_after_a_kill_9_the_next_start_cleans_up_and_serves():
    with server_process(log_name="killed.log") as process:
        mark = wait_for(run_mark, 60, "the run record")
        # Kill the server once the engines hold their NIXL ports: what they leave in the way.
        wait_for(lambda: not lifecycle.port_free(NIXL_BASE + 2000), 300, "the decode engine's NIXL port")
        os.kill(process.pid, signal.SIGKILL)
        process.wait(10)
    orphans = lifecycle.run_processes(mark)
    assert orphans, "a killed run left nothing behind, so this test proves nothing"
    server = LocalServer(port=PORT, metrics_port=METRICS_PORT, spec=None)
    server_args_log = RUN_DIR / "after-kill.log"
    server.log_path = server_args_log
    server.extra_args = ["--nixl-port-base", str(NIXL_BASE)]
    try:
        server.start(timeout=600)
        output = server_args_log.read_text()
        assert "process(es) left by an earlier local run that did not shut down" in output
        answer = openai_client(server).chat.completions.create(
            model="tiny-llama", messages=[{"role": "user", "content": "after the kill"}], max_tokens=4
        )
        assert answer.choices[0].message.content is not None
    finally:
        session = server.process.pid if server.process else None
        server.stop()
        sweep(mark)
    assert lifecycle.run_processes(mark) == []
    if session:
        assert session_processes(session) == []
    report_measurement("restart-after-kill-9", {"leftovers_stopped": len(orphans), "ready_seconds": server.status["ready_seconds"]})


def test_start_up_that_cannot_finish_in_time_exits_naming_what_is_not_ready():
    with server_process("--ready-timeout", "15", log_name="ready-timeout.log") as process:
        code = process.wait(120)
    output = (RUN_DIR / "ready-timeout.log").read_text()
    assert code == 1
    assert "local server: the Serve app is not ready within the ready timeout:" in output
    assert "Decode:tiny-llama" in output or "Prefill:tiny-llama" in output or "application llm" in output
    assert session_processes(process.pid) == []


def test_a_replica_that_dies_during_start_up_fails_the_start_with_its_error(tmp_path):
    import yaml

    from local.server import DEFAULT_SPEC

    spec = yaml.safe_load(DEFAULT_SPEC.read_text())
    spec["model"]["source"] = str((ROOT / spec["model"]["source"]).resolve())
    # vLLM refuses a block size that is not a power of two: the decode engine dies in its constructor.
    spec["decode"]["engine_kwargs"]["block_size"] = 7
    broken = tmp_path / "broken.yaml"
    broken.write_text(yaml.safe_dump(spec))
    # Serve gives up on a deployment after 3 failed starts per replica; one is enough here.
    with server_process(
        "--spec", str(broken), log_name="replica-dies.log", RAY_SERVE_MAX_PER_REPLICA_RETRY_COUNT="1"
    ) as process:
        code = process.wait(480)
    output = (RUN_DIR / "replica-dies.log").read_text()
    assert code == 1
    (failure,) = [line for line in output.splitlines() if line.startswith("local server: the Serve app failed during start-up")]
    named = output[output.index(failure):]
    assert "Decode:tiny-llama" in named
    assert "first error in its replica log:" in named
    assert session_processes(process.pid) == []
