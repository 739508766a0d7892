"""How a local run reads /proc and watches its parent, on small processes of the test's own: no Ray,
no server, a few seconds in all. Every wait is bounded; every process started here is killed."""

from __future__ import annotations

import multiprocessing
import os
import signal
import socket
import subprocess
import sys
import time
from contextlib import contextmanager
from multiprocessing import shared_memory

import pytest

from local import leftovers, lifecycle, ports, segments
from local.cluster import free_port
from local.errors import StartupFailure
from tests.conftest import ROOT

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="/proc and prctl are Linux's")

# A process whose first thread ends (pthread_exit) while another runs on: /proc shows it as a zombie,
# with no command line and no open files, yet it holds its listening port. So does a multi-threaded
# process killed mid-way whose first thread has finished exiting before the others.
HALF_EXITED = """
import ctypes, socket, sys, threading, time
s = socket.socket()
s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind(("127.0.0.1", int(sys.argv[1])))
s.listen()
threading.Thread(target=time.sleep, args=(120,)).start()
print("listening", flush=True)
ctypes.CDLL(None).pthread_exit(None)
"""

# A stand-in for a server that a kill -9 stopped: it leads a session, starts HALF_EXITED in it, and
# is then killed, leaving the session without its leader, as the real leftovers are. Its first
# line of input goes on to the child (a SEGMENT_HOLDER waits for it).
STAND_IN_SERVER = """
import subprocess, sys
child = subprocess.Popen([sys.executable, "-c", sys.argv[1], sys.argv[2]], stdin=subprocess.PIPE, stdout=subprocess.PIPE)
child.stdin.write(sys.stdin.buffer.readline())
child.stdin.flush()
child.stdout.readline()
print(child.pid, flush=True)
sys.stdin.read()
"""

# A stand-in for an engine: once told to go (a line on stdin, naming the segments someone else
# created that it should map too), it maps a shared-memory segment it created (its name written to
# argv[1]) and those. Python's resource tracker would remove its own segment when it dies: in a
# stopped run the tracker is killed with the rest, so here it is told to forget them all.
SEGMENT_HOLDER = """
import sys, time
from multiprocessing import resource_tracker, shared_memory
others = sys.stdin.readline().split()
created = shared_memory.SharedMemory(create=True, size=4096)
attached = [shared_memory.SharedMemory(name=name) for name in others]
for segment in [created, *attached]:
    resource_tracker.unregister(segment._name, "shared_memory")
open(sys.argv[1], "w").write(created.name)
print("mapped", flush=True)
time.sleep(120)
"""

# A stand-in for vLLM's worker: it holds a named semaphore (a multiprocessing lock outside a fork
# context, as tqdm makes one there) and writes its file's name to argv[1]. Its resource tracker is
# told to forget it, as the tracker a stopped run's SIGKILL takes along would.
SEMAPHORE_HOLDER = """
import multiprocessing, sys, time
from multiprocessing import resource_tracker
sys.stdin.readline()
lock = multiprocessing.get_context("spawn").Lock()
resource_tracker.unregister(lock._semlock.name, "semaphore")
open(sys.argv[1], "w").write("sem." + lock._semlock.name.lstrip("/"))
print("holding", flush=True)
time.sleep(120)
"""


def wait_for(condition, timeout: float, what: str):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():
            return
        time.sleep(0.05)
    raise AssertionError(f"{what} did not happen within {timeout:.0f} s")


def state(pid: int) -> str | None:
    fields = lifecycle._stat_fields(pid)
    return fields[0] if fields else None


def kill(pid: int) -> None:
    try:
        os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


@contextmanager
def half_exited(port: int):
    process = subprocess.Popen([sys.executable, "-c", HALF_EXITED, str(port)], stdout=subprocess.PIPE)
    try:
        assert process.stdout.readline().strip() == b"listening"
        wait_for(lambda: state(process.pid) == "Z", 10, "the first thread's exit")
        yield process
    finally:
        kill(process.pid)
        process.wait(10)


@contextmanager
def recording(process: subprocess.Popen, record, go: str = ""):
    """The run that ``process`` leads, its segments recorded to ``record`` by the server's own
    recorder (local/segments.py) from before ``process`` is told to ``go`` on. Yields the recorder."""
    mark = lifecycle.run_mark(process.pid)
    recorder = segments.SegmentRecorder(mark, lambda: lifecycle.run_processes(mark), record).start()
    try:
        process.stdin.write(f"{go}\n".encode())
        process.stdin.flush()
        yield recorder
    finally:
        recorder.stop()


def recorded(recorder: segments.SegmentRecorder, segment) -> None:
    """Waits until ``recorder`` has recorded ``segment``: the run is stopped only after that, as a
    real one is, long after its engines made their queues."""
    wait_for(lambda: segment in set(recorder), 10, f"the record of {segment.name}")


@contextmanager
def killed_run(tmp_path, monkeypatch, script: str, argument: str, before_the_kill=None):
    """A run whose server a kill -9 stopped: STAND_IN_SERVER starts ``script`` in its session and
    is killed; the run record and the segment record the next start reads name it. Yields the
    leftover's pid."""
    stand_in = subprocess.Popen(
        [sys.executable, "-c", STAND_IN_SERVER, script, argument],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        start_new_session=True,
    )
    segment_record = tmp_path / "shared-memory.json"
    with recording(stand_in, segment_record) as recorder:
        left = int(stand_in.stdout.readline())
        if script is SEGMENT_HOLDER:
            wait_for(lambda: recorder.recorded, 10, "the record of the leftover's segment")
    try:
        mark = lifecycle.run_mark(stand_in.pid)
        if before_the_kill is not None:
            before_the_kill(left)
        kill(stand_in.pid)
        stand_in.wait(10)
        record = tmp_path / "run.json"
        record.write_text(f'{{"mark": "{mark}"}}')
        monkeypatch.setattr(leftovers, "RUN_RECORD", record)
        monkeypatch.setattr(leftovers, "SEGMENTS_RECORD", segment_record, raising=False)
        yield left
    finally:
        kill(left)
        kill(stand_in.pid)
        stand_in.wait(10)


def test_a_process_whose_first_thread_exited_lives_and_holds_its_port_until_its_last_thread_exits():
    port = free_port()
    with half_exited(port) as process:
        assert lifecycle.alive(process.pid)
        assert not ports.port_free(port)
        holder = ports.port_holder(port)
        assert holder is not None and holder.pid == process.pid
        kill(process.pid)
        wait_for(lambda: not lifecycle.alive(process.pid), 10, "the whole process's exit")
        assert ports.port_free(port)


def test_the_next_start_stops_a_half_exited_leftover_and_waits_for_its_port(tmp_path, monkeypatch):
    """The race after a kill -9: the next start stopped what it found, then refused a port of what
    it had just stopped as held by "a process this user cannot see"."""
    port = free_port()

    def half_exited_yet(left: int) -> None:
        wait_for(lambda: state(left) == "Z", 10, "the leftover's first thread's exit")

    with killed_run(tmp_path, monkeypatch, HALF_EXITED, str(port), before_the_kill=half_exited_yet) as left:
        said = []
        stopped = leftovers.sweep(say=said.append)
        assert left in stopped and len(said) == 1 and "left by an earlier local run" in said[0]
        assert not lifecycle.alive(left)
        ports.check_ports([(port, "a test port", "--test-port N")], stopped=stopped)  # it does not refuse
        assert ports.port_free(port)


def test_a_stopped_run_removes_the_shared_memory_it_created_and_keeps_what_others_still_map(tmp_path):
    bystander = shared_memory.SharedMemory(create=True, size=4096)  # this process keeps it mapped
    name_file = tmp_path / "segment"
    run = subprocess.Popen(
        [sys.executable, "-c", SEGMENT_HOLDER, str(name_file)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        start_new_session=True,
    )
    own = None
    try:
        with recording(run, tmp_path / "shared-memory.json", go=bystander.name) as recorder:
            assert run.stdout.readline().strip() == b"mapped"
            own = lifecycle.SHARED_MEMORY / name_file.read_text()
            recorded(recorder, own)
            assert lifecycle.shared_memory_of([run.pid]) == {own, lifecycle.SHARED_MEMORY / bystander.name}
            assert lifecycle.stop_run(lifecycle.run_mark(run.pid), grace=1, timeout=15, shared_memory=recorder) == []
        assert not own.exists(), "the run's own segment outlived the run"
        assert (lifecycle.SHARED_MEMORY / bystander.name).exists(), "a segment still in use was removed"
    finally:
        kill(run.pid)
        run.wait(10)
        bystander.close()
        bystander.unlink()
        if own is not None:
            own.unlink(missing_ok=True)


@pytest.mark.parametrize("made", ["before", "during"], ids=["made-before-the-run", "made-outside-the-run-while-it-ran"])
def test_a_segment_the_run_did_not_create_outlives_its_stop_though_only_the_run_mapped_it(made, tmp_path):
    """The stop removes what the run created: another program's segment that a process of the run
    mapped stays, though nothing maps it any more once the run is gone."""
    foreign = shared_memory.SharedMemory(create=True, size=4096) if made == "before" else None
    name_file = tmp_path / "segment"
    run = subprocess.Popen(
        [sys.executable, "-c", SEGMENT_HOLDER, str(name_file)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        start_new_session=True,
    )
    mark = lifecycle.run_mark(run.pid)
    recorder = segments.SegmentRecorder(mark, lambda: lifecycle.run_processes(mark), tmp_path / "shared-memory.json")
    own = None
    try:
        recorder.start()
        if foreign is None:
            foreign = shared_memory.SharedMemory(create=True, size=4096)  # this process, outside the run
        run.stdin.write(f"{foreign.name}\n".encode())
        run.stdin.flush()
        assert run.stdout.readline().strip() == b"mapped"
        own = lifecycle.SHARED_MEMORY / name_file.read_text()
        recorded(recorder, own)
        foreign.close()  # from here on only the run maps it
        assert lifecycle.SHARED_MEMORY / foreign.name in lifecycle.shared_memory_of([run.pid])
        assert lifecycle.stop_run(mark, grace=1, timeout=15, shared_memory=recorder) == []
        assert not own.exists(), "the run's own segment outlived the run"
        assert (lifecycle.SHARED_MEMORY / foreign.name).exists(), "the stop removed a segment the run did not create"
    finally:
        recorder.stop()
        kill(run.pid)
        run.wait(10)
        if foreign is not None:
            foreign.close()
            foreign.unlink()
        if own is not None:
            own.unlink(missing_ok=True)


def test_a_stopped_run_removes_the_named_semaphores_it_created_and_keeps_anothers(tmp_path):
    # This process's own lock: its creator maps it under glibc's temporary name, as the run's does.
    bystander = multiprocessing.get_context("spawn").Lock()
    theirs = lifecycle.SHARED_MEMORY / ("sem." + bystander._semlock.name.lstrip("/"))
    name_file = tmp_path / "semaphore"
    run = subprocess.Popen(
        [sys.executable, "-c", SEMAPHORE_HOLDER, str(name_file)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        start_new_session=True,
    )
    own = None
    try:
        with recording(run, tmp_path / "shared-memory.json") as recorder:
            assert run.stdout.readline().strip() == b"holding"
            own = lifecycle.SHARED_MEMORY / name_file.read_text()
            recorded(recorder, own)
            assert own.exists() and theirs.exists()
            assert lifecycle.shared_memory_of([run.pid]) == {own}
            assert theirs in lifecycle.shared_memory_of([os.getpid()])
            assert lifecycle.stop_run(lifecycle.run_mark(run.pid), grace=1, timeout=15, shared_memory=recorder) == []
        assert not own.exists(), "the run's semaphore outlived the run"
        assert theirs.exists(), "a semaphore still in use was removed"
    finally:
        kill(run.pid)
        run.wait(10)
        if own is not None:
            own.unlink(missing_ok=True)


def test_the_next_start_removes_the_shared_memory_a_killed_run_created(tmp_path, monkeypatch):
    name_file = tmp_path / "segment"
    with killed_run(tmp_path, monkeypatch, SEGMENT_HOLDER, str(name_file)) as left:
        own = lifecycle.SHARED_MEMORY / name_file.read_text()
        try:
            said = []
            assert left in leftovers.sweep(say=said.append)
            assert said[0].endswith("; removed 1 shared-memory file(s) it created")
            assert not own.exists()
        finally:
            own.unlink(missing_ok=True)


def test_the_next_start_removes_what_a_killed_run_created_though_none_of_its_processes_is_left(tmp_path, monkeypatch):
    """Every process that mapped the segment died before anyone looked (SIGKILL to them all): only
    the record, made as it was created, says whose it is."""
    name_file = tmp_path / "segment"
    with killed_run(tmp_path, monkeypatch, SEGMENT_HOLDER, str(name_file)) as left:
        own = lifecycle.SHARED_MEMORY / name_file.read_text()
        try:
            # The leftover and its resource tracker (which would unlink a segment it had not forgotten).
            run = [pid for pid in lifecycle.session_members(os.getsid(left))]
            assert left in run
            for pid in run:
                kill(pid)
            wait_for(lambda: not any(lifecycle.alive(pid) for pid in run), 10, "the leftovers' exit")
            assert own.exists()
            said = []
            assert leftovers.sweep(say=said.append) == set()
            assert said == ["removed 1 shared-memory file(s) an earlier local run created and left"]
            assert not own.exists()
        finally:
            own.unlink(missing_ok=True)


def test_a_port_that_none_of_the_stopped_processes_holds_is_refused_at_once_naming_its_holder():
    port = free_port()
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", port))
        holder.listen()
        started = time.monotonic()
        with pytest.raises(StartupFailure) as refused:
            ports.check_ports([(port, "a test port", "--test-port N")], stopped={2**22 + 1})
    assert f"port {port} (a test port) is in use by pid {os.getpid()} (" in str(refused.value)
    assert "--test-port N" in str(refused.value)
    assert time.monotonic() - started < ports.SETTLE_SECONDS  # it did not wait for what is not leaving


# --- never outliving the starter -----------------------------------------------------------------

WATCHER = """
import os, sys, time
from local import lifecycle
parent = int(sys.argv[1]) if len(sys.argv) > 1 else lifecycle.STARTED_BY
lifecycle.watch_parent(parent, lambda: os._exit(9))
print("watching", flush=True)
time.sleep(60)
"""

# Starts WATCHER from a thread that then ends, as a supervisor's worker thread might: the kernel
# sends the parent-death signal when that thread ends, though the parent lives on.
THREADED_PARENT = """
import subprocess, sys, threading, time
children = []
spawner = threading.Thread(target=lambda: children.append(
    subprocess.Popen([sys.executable, "-c", sys.argv[1]], stdout=subprocess.PIPE)))
spawner.start()
spawner.join()
assert children[0].stdout.readline().strip() == b"watching"
print(children[0].pid, flush=True)
time.sleep(3)
print("alive" if children[0].poll() is None else f"exited {children[0].returncode}", flush=True)
time.sleep(60)
"""


def test_a_parent_that_died_before_it_was_watched_is_seen_at_once():
    # The watched parent is not this process's parent: as if it had died before watch_parent ran.
    done = subprocess.run([sys.executable, "-c", WATCHER, str(2**22 + 1)], cwd=ROOT, capture_output=True, timeout=30)
    assert done.returncode == 9, done.stderr.decode()[-2000:]


def test_the_watcher_outlives_its_parents_thread_but_not_its_parent():
    parent = subprocess.Popen(
        [sys.executable, "-c", THREADED_PARENT, WATCHER],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        start_new_session=True,
    )
    try:
        child = int(parent.stdout.readline())
        assert parent.stdout.readline().strip() == b"alive"  # the spawning thread's end did not stop it
        kill(parent.pid)
        parent.wait(10)
        wait_for(lambda: not lifecycle.alive(child), 10, "the watcher's exit after its parent's")
    finally:
        kill(parent.pid)
        parent.wait(10)
        if "child" in locals():
            kill(child)


# A server whose main thread is held in C code when Ctrl-C comes (as Ray's start-up can hold it):
# Python would run the signal handler only once that code returns, here after minutes, and the
# unwinding it starts never reaches the shutdown.
STUCK_IN_C = """
import hashlib, sys
from pathlib import Path
from local import shutdown
shutdown.DEADLINE_SECONDS = float(sys.argv[1])
shutdown.STATUS_FILE = Path(sys.argv[2]) / "status.json"
shutdown.RUN_RECORD = Path(sys.argv[2]) / "run.json"
shutdown.install_signal_handlers()
told = False
while True:
    try:
        if not told:
            told = True
            print("stuck", flush=True)
        hashlib.pbkdf2_hmac("sha256", b"held", b"in C", 2**31 - 1)
    except KeyboardInterrupt:
        continue  # a signal that came before the C call began: back into C, as a held thread would be
"""


def test_ctrl_c_stops_the_run_by_its_deadline_even_while_the_main_thread_is_held_in_c(tmp_path):
    process = subprocess.Popen(
        [sys.executable, "-c", STUCK_IN_C, "2", str(tmp_path)],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    try:
        assert process.stdout.readline().strip() == "stuck"
        sent = time.monotonic()
        process.send_signal(signal.SIGINT)
        code = process.wait(30)
        stopped_after = time.monotonic() - sent
        output = process.stdout.read()
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait(10)
    assert code == 130, output
    assert "did not finish within 2" in output
    assert 2 <= stopped_after < 30


# --- a stop that its own process does not live to finish --------------------------------------

# A stand-in for Ray's raylet: told to stop (SIGTERM), it still starts the two workers it had been
# asked for, closes its driver's connection, and exits a moment later, as a raylet mid-start does.
RAYLET = """
import os, signal, sys, time
connection = int(sys.argv[1])
def shut_down(*_):
    for _ in range(2):
        if os.fork() == 0:
            signal.signal(signal.SIGTERM, signal.SIG_DFL)
            os.close(connection)
            time.sleep(120)
            os._exit(0)
    os.close(connection)
    time.sleep(0.5)
    os._exit(0)
signal.signal(signal.SIGTERM, shut_down)
print("up", flush=True)
time.sleep(120)
"""

# A stand-in for the server as Ray's driver: it marks its run, starts RAYLET, watches its parent as
# the server does, and exits at once when the raylet's connection fails, as Ray's core worker does
# (QuickExit) in a driver whose parent is gone (ShutdownIfLocalRayletDisconnected takes getppid() == 1
# for a dead raylet). So the stop its parent's death starts ends it with its first SIGTERM.
DRIVER = """
import os, subprocess, sys, threading
from pathlib import Path
from local import lifecycle, shutdown
shutdown.STATUS_FILE = Path(sys.argv[2]) / "status.json"
shutdown.RUN_RECORD = Path(sys.argv[2]) / "run.json"
os.environ[lifecycle.RUN_MARKER] = lifecycle.run_mark()
connection, raylet_end = os.pipe()
raylet = subprocess.Popen([sys.executable, "-c", sys.argv[1], str(raylet_end)], pass_fds=[raylet_end],
                          stdout=subprocess.PIPE)
os.close(raylet_end)
assert raylet.stdout.readline().strip() == b"up"

def core_worker():
    os.read(connection, 1)
    os._exit(1)

threading.Thread(target=core_worker, daemon=True).start()
lifecycle.watch_parent(lifecycle.STARTED_BY, shutdown.parent_gone)
print(lifecycle.run_mark(), flush=True)
threading.Event().wait()
"""

STARTER = """
import subprocess, sys, time
driver = subprocess.Popen(sys.argv[1:], start_new_session=True, stdout=subprocess.PIPE)
print(driver.stdout.readline().decode().strip(), flush=True)
time.sleep(120)
"""


def stoppers(mark: str) -> list[int]:
    return [
        int(entry.name)
        for entry in lifecycle.PROC.iterdir()
        if entry.name.isdigit() and f"local.lifecycle stop {mark} " in lifecycle.command_of(int(entry.name))
    ]


def test_the_run_is_stopped_even_when_the_server_dies_before_its_stop_is_done(tmp_path):
    """Ray's driver exits with its raylet, and the raylet dies of the very stop the server started
    when its parent died: whatever the raylet started meanwhile is stopped all the same."""
    starter = subprocess.Popen(
        [sys.executable, "-c", STARTER, sys.executable, "-c", DRIVER, RAYLET, str(tmp_path)],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        start_new_session=True,
    )
    mark = starter.stdout.readline().decode().strip()
    server = int(mark.partition("-")[0])
    try:
        assert lifecycle.server_alive(mark) and len(lifecycle.run_processes(mark)) == 2  # the server, its raylet
        kill(starter.pid)
        starter.wait(10)
        wait_for(lambda: not lifecycle.alive(server), 10, "the server's exit")
        # The raylet's workers get their parent's death as nothing: only the stop ends them.
        deadline = time.monotonic() + 15
        while (left := lifecycle.run_processes(mark)) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert left == [], [lifecycle.command_of(pid) for pid in left]
        wait_for(lambda: not stoppers(mark), 10, "the stopping process's exit")
    finally:
        kill(starter.pid)
        starter.wait(10)
        lifecycle.stop_run(mark, grace=0, timeout=10)
