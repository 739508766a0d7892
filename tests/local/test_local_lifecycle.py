"""The local server's life cycle on the real server: what is in the way, Ctrl-C during start-up,
the death of whatever started it, and a kill -9 followed by a new start. Every wait is bounded;
nothing is left behind. Each test starts a server of its own, so none of the shared ones runs.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from contextlib import contextmanager
from pathlib import Path

import pytest

from local import lifecycle
from local.harness import session_processes
from local.paths import RUN_DIR, RUN_RECORD, read_json
from local.ports import port_free, port_holder, sockets_on
from tests.conftest import ROOT
from tests.local.conftest import LIVE_SERVERS, openai_client, report_measurement

pytest.importorskip("ray", reason="the serving stack (requirements-serve.txt) is not installed")
pytestmark = pytest.mark.live

# Ports of their own, so that these servers never meet the shared ones (8000/8001, 20000/22000); but the
# kill -9 test's killed run takes the shared disaggregated server's, which is the start after it.
PORT, METRICS_PORT, NIXL_BASE = 8010, 8095, 30000


@contextmanager
def unrelated_listener(port: int):
    """A process that is not part of any local run, listening on ``port``."""
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            f"import socket, time; s = socket.socket(); s.bind(('127.0.0.1', {port})); s.listen(); time.sleep(120)",
        ],
    )
    try:
        deadline = time.monotonic() + 10
        while port_free(port) and time.monotonic() < deadline:
            time.sleep(0.1)
        yield holder
    finally:
        holder.kill()
        holder.wait(10)


@pytest.fixture(scope="module", autouse=True)
def no_shared_server(shared_servers):
    shared_servers.stop()
    RUN_DIR.mkdir(parents=True, exist_ok=True)


def server_command(
    *extra: str, port: int = PORT, metrics_port: int = METRICS_PORT, nixl_base: int | None = NIXL_BASE
) -> list[str]:
    return [
        sys.executable,
        "-m",
        "local.server",
        "--port",
        str(port),
        "--metrics-port",
        str(metrics_port),
        *(["--nixl-port-base", str(nixl_base)] if nixl_base else []),
        *extra,
    ]


@contextmanager
def server_process(
    *extra: str,
    log_name: str,
    port: int = PORT,
    metrics_port: int = METRICS_PORT,
    nixl_base: int | None = NIXL_BASE,
    **env: str,
):
    """`make local`'s server as its own session, logging to RUN_DIR/log_name; killed on the way out if
    the test left it running."""
    with open(RUN_DIR / log_name, "w") as log:
        process = subprocess.Popen(
            server_command(*extra, port=port, metrics_port=metrics_port, nixl_base=nixl_base),
            cwd=ROOT,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            env={**os.environ, "PYTHONUNBUFFERED": "1", **env},
        )
        try:
            yield process
        finally:
            if process.poll() is None:
                os.killpg(process.pid, signal.SIGKILL)
                process.wait(10)


def wait_for(condition, timeout: float, what: str, left=None):
    """Waits for ``condition()``; on timeout, the failure names what ``left()`` says is still in the way."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = condition()
        if value:
            return value
        time.sleep(0.5)
    raise AssertionError(f"{what} did not happen within {timeout:.0f} s" + (f"; still there: {left()}" if left else ""))


def describe_port(port: int) -> str:
    """A port that is not free, with the state of every socket on it and its holder."""
    states = ", ".join(state for state, _ in sockets_on(port)) or "no socket seen"
    holder = port_holder(port)
    return f"port {port} ({states}; held by {holder.describe() if holder else 'no visible process'})"


def stuck_report(pid: int, log: Path) -> str:
    """What a server that did not stop was doing: each thread's state and kernel wait, the signals
    pending and blocked, and the Python stacks it writes on SIGUSR1 (faulthandler, local/server.py)."""
    threads = []
    for tid in sorted(os.listdir(f"/proc/{pid}/task")) if Path(f"/proc/{pid}").exists() else []:
        task = Path(f"/proc/{pid}/task/{tid}")
        try:
            status = dict(line.split(":\t", 1) for line in (task / "status").read_text().splitlines() if ":\t" in line)
            threads.append(
                f"{tid} {status.get('Name', '?')} {status.get('State', '?')} wchan={(task / 'wchan').read_text()} "
                f"pending={status.get('SigPnd')}/{status.get('ShdPnd')} blocked={status.get('SigBlk')}"
            )
        except OSError:
            continue
    if threads:
        os.kill(pid, signal.SIGUSR1)
        time.sleep(2)
    tail = log.read_text(errors="replace").splitlines()[-80:]
    return "\n".join(["threads:", *threads, f"last lines of {log.name}:", *tail])


def run_of(server_pid: int) -> str:
    """The run mark of the server ``server_pid``, once its run record is written."""
    return wait_for(lambda: (m := run_mark()) and m.startswith(f"{server_pid}-") and m, 60, "the run record")


def wait_for_raylet(mark: str) -> str:
    """Returns ``mark`` once the run has started Ray's raylet: Ray is up, the engines are not yet."""
    wait_for(
        lambda: any("raylet" in lifecycle.command_of(p) for p in lifecycle.run_processes(mark)), 90, "Ray's raylet"
    )
    return mark


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
        # Ray is up but the engines are not: the moment the old server ignored Ctrl-C.
        mark = wait_for_raylet(run_of(process.pid))
        sent = time.monotonic()
        os.killpg(process.pid, signal.SIGINT)
        try:
            code = process.wait(30)
        except subprocess.TimeoutExpired:
            stuck = stuck_report(process.pid, RUN_DIR / "sigint-startup.log")
            os.killpg(process.pid, signal.SIGKILL)
            process.wait(10)
            sweep(mark)
            pytest.fail(f"the server did not exit within 30 s of Ctrl-C\n{stuck}")
        stopped_after = time.monotonic() - sent
    remaining = lifecycle.run_processes(mark)
    sweep(mark)
    assert code == 130, (RUN_DIR / "sigint-startup.log").read_text(errors="replace")[-6000:]
    assert remaining == [], [lifecycle.command_of(p) for p in remaining]
    assert session_processes(process.pid) == []
    report_measurement("sigint-during-startup", {"stopped_after_s": round(stopped_after, 1)})


# What starts the server, in a session of its own, then waits: a process like the harness (the
# server then leads its session itself) or make (the server then forks: the process in front stays
# in make's process group, the run goes on in a session of its own).
WRAPPER = """
import subprocess, sys, time
subprocess.Popen(sys.argv[1:], start_new_session=True)
time.sleep(600)
"""


def starter(kind: str, tmp_path) -> list[str]:
    if kind == "python":
        return [sys.executable, "-c", WRAPPER, *server_command()]
    makefile = tmp_path / "Makefile"
    makefile.write_text(".PHONY: local\nlocal:\n\t" + " ".join(server_command()) + "\n")  # as `make local`
    return ["make", "-s", "-f", str(makefile), "local"]


def children(pid: int) -> list[int]:
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as stat_file:
                    stat = stat_file.read().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if int(stat[1]) == pid:
                found.append(int(entry))
    return found


@pytest.mark.parametrize("kind", ["python", "make"])
def test_the_run_stops_within_seconds_once_what_started_it_is_killed(kind, tmp_path):
    if kind == "make" and not shutil.which("make"):
        pytest.skip("no make on this machine")
    before = run_mark()
    with open(RUN_DIR / f"parent-killed-{kind}.log", "w") as log:
        wrapper = subprocess.Popen(
            starter(kind, tmp_path),
            cwd=ROOT,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            env={**os.environ, "PYTHONUNBUFFERED": "1"},
        )
    try:
        mark = wait_for(lambda: (m := run_mark()) != before and m, 60, "the run record")
        record = json.loads(RUN_RECORD.read_text())
        wait_for_raylet(mark)
        started_by_wrapper = children(wrapper.pid)  # the server, or (make) the process in front of it
        if kind == "python":
            assert started_by_wrapper == [record["pid"]]
        else:
            (front,) = started_by_wrapper
            assert children(front) == [record["pid"]]
        # Nothing reaches the server but the loss of its parent: the wrapper alone is killed, not its group.
        killed = time.monotonic()
        os.kill(wrapper.pid, signal.SIGKILL)
        wrapper.wait(10)

        def still_there() -> list[str]:
            return [
                f"pid {p} {lifecycle.command_of(p)}"
                for p in sorted(set(lifecycle.run_processes(mark)) | set(started_by_wrapper))
                if lifecycle.alive(p)
            ] + [describe_port(port) for port in record["ports"] if not port_free(port)]

        def report() -> str:
            server = record["pid"]
            stuck = stuck_report(server, RUN_DIR / f"parent-killed-{kind}.log") if lifecycle.alive(server) else ""
            return f"{still_there()}\n{stuck}"

        wait_for(lambda: not still_there(), 20, "every process of the run gone and its ports free", report)
        gone_after = time.monotonic() - killed
    finally:
        if wrapper.poll() is None:
            os.killpg(wrapper.pid, signal.SIGKILL)
            wrapper.wait(10)
        leftover = run_mark()
        if leftover and leftover != before:
            sweep(leftover)
    output = (RUN_DIR / f"parent-killed-{kind}.log").read_text()
    assert "the process that started the local server is gone; stopping the run" in output
    report_measurement(f"parent-killed-{kind}", {"run_gone_after_s": round(gone_after, 1)})


def test_after_a_kill_9_the_next_start_cleans_up_and_serves(shared_servers):
    """The next start is the shared disaggregated server (tests/local/conftest.py runs this test
    right before the tests that use it), so the killed run takes its ports."""
    from local.server import DEFAULT_SPEC, local_spec

    settings = LIVE_SERVERS["disaggregated"]
    decode_port = local_spec(DEFAULT_SPEC, "disaggregated").side_channel_port("decode")
    with server_process(
        log_name="killed.log", port=settings["port"], metrics_port=settings["metrics_port"], nixl_base=None
    ) as process:
        mark = run_of(process.pid)
        # Kill the server once the engines hold their NIXL ports: what they leave in the way.
        wait_for(lambda: not port_free(decode_port), 300, "the decode engine's NIXL port")
        os.kill(process.pid, signal.SIGKILL)
        process.wait(10)
    orphans = lifecycle.run_processes(mark)
    assert orphans, "a killed run left nothing behind, so this test proves nothing"
    segments = lifecycle.shared_memory_of(orphans)
    assert segments, "the killed run's processes map no shared memory, so this test proves nothing of it"
    try:
        server = shared_servers.get("disaggregated")
        output = server.log_path.read_text()
        assert "process(es) left by an earlier local run that did not shut down" in output
        # The ports of what it stopped were waited for, not taken for someone else's.
        assert "cannot see" not in output and "is still held by" not in output
        answer = openai_client(server).chat.completions.create(
            model="tiny-llama", messages=[{"role": "user", "content": "after the kill"}], max_tokens=4
        )
        assert answer.choices[0].message.content is not None
        # Nothing of the killed run is left; what the new server leaves is checked when it stops.
        assert lifecycle.run_processes(mark) == []
        # Stopped with SIGTERM first, vLLM's engines unlink their own queues' segments, more or fewer of
        # them as the stop's timing goes; the sweep removes the rest and says how many
        # (tests/local/test_local_processes.py checks that on a process of its own).
        assert not [segment for segment in segments if segment.exists()], "the killed run's shared memory is left"
        removed = re.search(r"removed (\d+) shared-memory file\(s\) it created", output)
        assert removed is None or 0 < int(removed.group(1)) <= len(segments), output
    finally:
        sweep(mark)
    report_measurement(
        "restart-after-kill-9", {"leftovers_stopped": len(orphans), "ready_seconds": server.status["ready_seconds"]}
    )


def test_start_up_that_cannot_finish_in_time_exits_naming_what_is_not_ready():
    with server_process("--ready-timeout", "15", log_name="ready-timeout.log") as process:
        wait_for_raylet(run_of(process.pid))
        # Mid-start, as when a stop does not happen: what a failing test reports (SIGUSR1's stacks).
        stuck = stuck_report(process.pid, RUN_DIR / "ready-timeout.log")
        code = process.wait(120)
    output = (RUN_DIR / "ready-timeout.log").read_text()
    assert "most recent call first" in stuck and 'local/server.py", line' in stuck, stuck
    assert "threads:\n" in stuck and " wchan=" in stuck
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
    (failure,) = [
        line for line in output.splitlines() if line.startswith("local server: the Serve app failed during start-up")
    ]
    named = output[output.index(failure) :]
    assert "Decode:tiny-llama" in named
    assert "first error in its replica log:" in named
    assert session_processes(process.pid) == []


def test_an_engine_killed_during_start_up_leaves_none_of_the_runs_shared_memory_once_the_run_stops():
    """A start of its own: a shared server is handed to its tests only once it is ready, and this
    kill comes while the engine is still starting. Everything that maps the engine's queues dies
    at once, as when a group's SIGKILL takes the engine, its worker and Python's resource tracker
    (which would unlink them) along: nothing that could be read at the stop maps them any more."""
    with server_process("--mode", "colocated", log_name="engine-killed.log") as process:
        mark = run_of(process.pid)

        def queues_mapped() -> tuple[list[int], set[Path]] | None:
            run = lifecycle.run_processes(mark)
            engines = [p for p in run if lifecycle.command_of(p).startswith("VLLM")]
            queues = {s for s in lifecycle.shared_memory_of(engines) if s.name.startswith("psm_")}
            if not queues:
                return None
            mapping = [p for p in run if lifecycle.shared_memory_of([p]) & queues]
            trackers = [p for p in run if "multiprocessing.resource_tracker" in lifecycle.command_of(p)]
            return sorted(set(engines) | set(mapping) | set(trackers)), queues

        killed, queues = wait_for(queues_mapped, 480, "an engine's queue in shared memory")
        # At once, but not before the run could have noted them (at most a second; the stop's
        # look used to come every 5 s): whatever it records, it must have by then.
        deadline = time.monotonic() + 1
        while time.monotonic() < deadline and not {q.name for q in queues} <= set(
            read_json(RUN_DIR / "shared-memory.json").get("segments", {})
        ):
            time.sleep(0.05)
        for pid in killed:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        assert lifecycle.wait_gone(killed, 10) == []
        assert all(queue.exists() for queue in queues), "the kill left nothing to clean up; this proves nothing"
        # The server may be failing the start already (a replica died on the way): the same stop.
        try:
            os.killpg(process.pid, signal.SIGINT)
        except ProcessLookupError:
            pass
        code = process.wait(60)
    remaining = lifecycle.run_processes(mark)
    sweep(mark)
    assert remaining == []
    assert code in (1, 130), (RUN_DIR / "engine-killed.log").read_text()[-3000:]
    left = sorted(queue.name for queue in queues if queue.exists())
    for queue in left:  # never left for the next test to find
        (lifecycle.SHARED_MEMORY / queue).unlink(missing_ok=True)
    assert not left, f"the engine's queues outlived the run: {left}"
    report_measurement("engine-killed-during-start-up", {"killed": len(killed), "queues": len(queues)})
