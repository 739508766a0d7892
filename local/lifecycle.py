"""What a local run starts, what a dead one left behind, and that the run never outlives what
started it: read from /proc.

The server leads a process session of its own, and every process it starts stays in it (Ray's
daemons and agents, its workers, the vLLM engine processes), whatever its parent becomes once
the server is gone. Its processes also carry ``PD_SERVING_LOCAL_RUN=<server pid>-<server start
time>`` in their environment, which Ray's workers and the engines inherit (Ray starts its agents
with an environment of their own, so the session is what finds those). A session whose leader,
the server, no longer exists holds the leftovers of an unclean stop (kill -9).

Leading its own session, the server is out of reach of whatever stops its starter's process
group, so it watches its parent itself (:func:`watch_parent`): once the process that started it
is gone, for any reason, it stops the run. Linux only (``/proc``, ``prctl``).
"""

from __future__ import annotations

import ctypes
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

RUN_MARKER = "PD_SERVING_LOCAL_RUN"
# The checkout, where ``python -m local.lifecycle`` finds this module.
_ROOT = Path(__file__).resolve().parent.parent
# What the process that stops a run (stop_run_apart) may take to start, beyond its timeout.
STOPPER_START_SECONDS = 10.0
PROC = Path("/proc")
# POSIX shared memory (shm_open) lives here as files, and outlives every process that mapped it
# until someone unlinks it. vLLM's message queues between an engine and its workers are such
# segments (psm_*): the engine unlinks them when it exits cleanly, and one that is killed (and
# Python's resource tracker with it) leaves them until the machine restarts. So do named
# semaphores (sem.mp-*; tqdm's lock in vLLM's worker is one): the resource tracker that would
# remove them ignores SIGTERM and dies by SIGKILL with the rest of the run. A stopped run
# removes those its processes created (local/segments.py records them as they appear).
SHARED_MEMORY = Path("/dev/shm")
# The process that started this one, read as this module is imported (the server imports it
# before anything slow). Had that process died before, this would be its reaper: the one window
# nothing here can see.
STARTED_BY = os.getppid()
# What the kernel sends when the parent dies (prctl PR_SET_PDEATHSIG). A session leader without a
# terminal gets no SIGHUP otherwise; the process in front of one (become_session_leader) takes a
# terminal's hang-up for the same news.
PARENT_DEATH_SIGNAL = signal.SIGHUP
_PR_SET_PDEATHSIG = 1


@dataclass(frozen=True)
class ProcessInfo:
    pid: int
    command: str

    def describe(self) -> str:
        return f"pid {self.pid} ({self.command})"


def _stat_fields(pid: int | str) -> list[str]:
    """/proc/pid/stat after the command name (field 3, the state, first); empty if the pid is gone.
    ``pid`` may be ``"<pid>/task/<tid>"`` for one thread."""
    try:
        return (PROC / str(pid) / "stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return []


def start_time(pid: int) -> str | None:
    """The kernel's start time of ``pid`` (field 22 of /proc/pid/stat): with the pid, a unique name."""
    fields = _stat_fields(pid)
    return fields[19] if len(fields) > 19 else None


def run_mark(pid: int | None = None) -> str:
    pid = pid or os.getpid()
    return f"{pid}-{start_time(pid)}"


def command_of(pid: int) -> str:
    """The command line of ``pid``; ``[comm]`` when it has none (it is exiting: its memory, where
    the command line lives, is gone already)."""
    try:
        raw = (PROC / str(pid) / "cmdline").read_bytes()
    except OSError:
        return "?"
    command = raw.replace(b"\0", b" ").decode(errors="replace").strip()
    if command:
        return command[:120]
    try:
        return f"[{(PROC / str(pid) / 'comm').read_text().strip()}]"
    except OSError:
        return "?"


def _environ_mark(pid: int) -> str | None:
    try:
        for entry in (PROC / str(pid) / "environ").read_bytes().split(b"\0"):
            if entry.startswith(RUN_MARKER.encode() + b"="):
                return entry.split(b"=", 1)[1].decode()
    except OSError:
        return None
    return None


def alive(pid: int) -> bool:
    """Whether any thread of ``pid`` has not exited yet.

    A zombie whose threads have all exited is gone (only its parent's wait is missing). But when
    the first thread of a process exits before the others, /proc shows the process as a zombie
    (and with no command line and no open files) while its other threads still run, or still
    exit, holding its memory, its files and its ports: that process is not gone yet.
    """
    fields = _stat_fields(pid)
    if not fields:
        return False
    if fields[0] not in ("Z", "X"):
        return True
    try:
        threads = os.listdir(PROC / str(pid) / "task")
    except OSError:
        return False
    return any(
        (state := _stat_fields(f"{pid}/task/{tid}")[:1]) and state[0] not in ("Z", "X")
        for tid in threads
        if tid != str(pid)
    )


def marked_processes(mark: str | None = None) -> dict[str, list[int]]:
    """Living processes that carry a run mark, by mark (only ``mark`` when given)."""
    found: dict[str, list[int]] = {}
    me = os.getpid()
    for entry in PROC.iterdir():
        if not entry.name.isdigit() or int(entry.name) == me:
            continue
        pid = int(entry.name)
        value = _environ_mark(pid)
        if value and (mark is None or value == mark) and alive(pid):
            found.setdefault(value, []).append(pid)
    return found


def server_alive(mark: str) -> bool:
    """Whether the server that set ``mark`` still runs (same pid and the same start time)."""
    pid, _, started = mark.partition("-")
    return pid.isdigit() and start_time(int(pid)) == started and alive(int(pid))


def session_members(session: int) -> list[int]:
    """Living processes of a session, except this one."""
    members = []
    me = os.getpid()
    for entry in PROC.iterdir():
        if not entry.name.isdigit() or int(entry.name) == me:
            continue
        try:
            if os.getsid(int(entry.name)) == session and alive(int(entry.name)):
                members.append(int(entry.name))
        except (ProcessLookupError, PermissionError):
            continue
    return members


def run_processes(mark: str, marked: dict[str, list[int]] | None = None) -> list[int]:
    """Every living process of the run that set ``mark``: its session and whoever carries the mark
    (``marked``: a scan by marked_processes() already made)."""
    server = int(mark.partition("-")[0])
    carriers = (marked_processes(mark) if marked is None else marked).get(mark, [])
    return sorted(set(session_members(server)) | set(carriers))


def leftovers(recorded_mark: str | None = None) -> list[ProcessInfo]:
    """Processes of earlier runs whose server is gone (``recorded_mark``: the last run's record)."""
    marked = marked_processes()
    marks = set(marked) | ({recorded_mark} if recorded_mark else set())
    return [
        ProcessInfo(pid, command_of(pid))
        for mark in sorted(marks)
        if not server_alive(mark)
        for pid in run_processes(mark, marked)
    ]


def stop_processes(
    pids: list[int], grace: float = 5.0, kill_wait: float = 10.0, deadline: float | None = None
) -> list[int]:
    """SIGTERM, then SIGKILL what is still alive after ``grace`` seconds; returns once all are gone
    (every thread: see :func:`alive`), or ``kill_wait`` seconds after the SIGKILL, or at
    ``deadline`` (a time.monotonic()), with those still alive."""
    deadline = deadline if deadline is not None else time.monotonic() + grace + kill_wait
    for sig, wait in ((signal.SIGTERM, grace), (signal.SIGKILL, kill_wait)):
        living = [pid for pid in pids if alive(pid)]
        for pid in living:
            try:
                os.kill(pid, sig)
            except ProcessLookupError:
                pass
        until = min(time.monotonic() + wait, deadline)
        while time.monotonic() < until and any(alive(pid) for pid in living):
            time.sleep(0.1)
    return [pid for pid in pids if alive(pid)]


def stop_run(
    mark: str,
    grace: float = 3.0,
    timeout: float = 15.0,
    shared_memory: Iterable[Path] = (),
    spare: Iterable[int] = (),
) -> list[int]:
    """Stops every process of the run ``mark`` but ``spare`` and returns once none is left, those
    that appear while it stops (a worker a dying raylet or replica started) included; at ``timeout``,
    kills those found last and returns those still there. Once none is left, ``shared_memory`` (the
    segments the run created, read then: local/segments.py) is removed, but for any a process
    outside the run still maps."""
    deadline = time.monotonic() + timeout
    spared = set(spare)
    while True:
        pids = [pid for pid in run_processes(mark) if pid not in spared]
        if not pids:
            remove_unmapped(shared_memory)
            return pids
        if time.monotonic() >= deadline:
            # Found after the last round (started meanwhile): not left without a signal.
            return stop_processes(pids, grace=0, kill_wait=1.0)
        stop_processes(pids, grace=grace, deadline=deadline)


def stop_run_apart(
    mark: str, grace: float = 3.0, timeout: float = 15.0, shared_memory: Iterable[Path] = ()
) -> list[int]:
    """:func:`stop_run`, done by a process of its own that is no part of the run (a session of its
    own, no run mark) and outlives this one if need be; waits for it and returns what it left.

    The server cannot count on finishing a stop itself: it is Ray's driver, and Ray's core worker
    ends its process at once (QuickExit) when a call to the raylet fails and the raylet is dead, or,
    where the driver does not know the raylet's pid, when the driver's parent is (getppid() == 1:
    ShutdownIfLocalRayletDisconnected in src/ray/raylet_ipc_client/raylet_ipc_client.cc). Once the
    process that started the server has died, the stop's own SIGTERM to the raylet is enough; the
    raylet, shutting down, still starts the workers it had been asked for, and a server that died
    before its next round left them running, in its session and carrying its mark, with nobody
    left to stop them. The server is spared by that process: it exits by itself once the stop is done.
    """
    held = sorted(str(path) for path in shared_memory)
    environment = {name: value for name, value in os.environ.items() if name != RUN_MARKER}
    command = [sys.executable, "-m", "local.lifecycle", "stop"]
    command += [mark, str(os.getpid()), str(grace), str(timeout), *held]
    try:
        stopper = subprocess.Popen(
            command,
            cwd=_ROOT,
            env=environment,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            start_new_session=True,
        )
    except OSError:
        return stop_run(mark, grace=grace, timeout=timeout, shared_memory=shared_memory)
    try:
        reported, _ = stopper.communicate(timeout=timeout + STOPPER_START_SECONDS)
        return [int(pid) for pid in reported.split()]
    except (subprocess.TimeoutExpired, ValueError):
        return run_processes(mark)


def shared_memory_of(pids: Iterable[int]) -> set[Path]:
    """The files under SHARED_MEMORY the processes map (shared-memory segments and named semaphores).

    Read by inode, not by the path /proc shows: glibc's sem_open creates a semaphore under a
    temporary name, maps it, links it as its real name and unlinks the temporary one, so its
    creator's mapping reads "/dev/shm/sem.XXXXXX (deleted)" for as long as the semaphore lives."""
    inodes = mapped_inodes(pids)
    if not inodes:
        return set()
    found: set[Path] = set()
    try:
        entries = list(os.scandir(SHARED_MEMORY))
    except OSError:
        return found
    for entry in entries:
        try:
            if entry.inode() in inodes and entry.is_file(follow_symlinks=False):
                found.add(Path(entry.path))
        except OSError:  # removed meanwhile
            continue
    return found


def mapped_inodes(pids: Iterable[int], directory: Path = SHARED_MEMORY) -> set[int]:
    """The inodes of the files under ``directory`` that the processes map."""
    inodes: set[int] = set()
    prefix = f"{directory}/"
    for pid in pids:
        try:
            maps = (PROC / str(pid) / "maps").read_text()
        except OSError:  # gone, or another user's
            continue
        for line in maps.splitlines():
            fields = line.split(maxsplit=5)
            if len(fields) == 6 and fields[5].startswith(prefix):
                inodes.add(int(fields[4]))
    return inodes


def remove_unmapped(segments: Iterable[Path]) -> list[Path]:
    """Removes those of ``segments`` that are this user's and that no living process maps any more;
    returns them."""
    candidates = []
    for segment in set(segments):
        try:
            if segment.parent == SHARED_MEMORY and segment.stat().st_uid == os.getuid():
                candidates.append(segment)
        except OSError:  # already removed
            continue
    if not candidates:
        return []
    in_use = shared_memory_of(int(entry.name) for entry in PROC.iterdir() if entry.name.isdigit())
    removed = []
    for segment in sorted(set(candidates) - in_use):
        try:
            segment.unlink()
            removed.append(segment)
        except OSError:
            continue
    return removed


def wait_gone(pids: list[int], timeout: float) -> list[int]:
    """Waits until every one of ``pids`` is gone, at most ``timeout`` seconds; returns those left."""
    deadline = time.monotonic() + timeout
    while (living := [pid for pid in pids if alive(pid)]) and time.monotonic() < deadline:
        time.sleep(0.1)
    return living


# --- never outliving the starter ------------------------------------------------------------------


def become_session_leader() -> int:
    """Makes the run lead a session of its own, so that everything it starts can be found; returns
    the pid of the process that the run must not outlive (see :func:`watch_parent`).

    Started in a session of its own (``start_new_session``, as the harness and the tests start it),
    this process leads it already. Otherwise it forks: the child carries on in a new session, and
    this process stays in front, in its starter's process group, where a terminal's Ctrl-C, make's
    SIGTERM or a kill of the whole group reach it. It passes SIGINT and SIGTERM on to the child and
    exits with the child's status. A hang-up (the terminal closed) or the death of its own starter
    ends it at once, and the child, finding its parent gone, stops the run.
    """
    if os.getsid(0) == os.getpid():
        return STARTED_BY
    front = os.getpid()
    child = os.fork()
    if child == 0:
        os.setsid()
        return front
    _stay_in_front(child)


def _stay_in_front(child: int):
    def forward(signum, _frame):
        try:
            os.kill(child, signum)
        except ProcessLookupError:
            pass

    for signum in (signal.SIGINT, signal.SIGTERM):
        signal.signal(signum, forward)
    watch_parent(STARTED_BY, lambda: os._exit(128 + PARENT_DEATH_SIGNAL), hangup_means_gone=True)
    while True:
        try:
            _, status = os.waitpid(child, 0)
            break
        except InterruptedError:
            continue
    code = os.waitstatus_to_exitcode(status)
    os._exit(code if code >= 0 else 128 - code)


def _set_parent_death_signal(signum: int) -> bool:
    """Asks the kernel for ``signum`` when the parent dies. Note that Linux sends it when the parent
    *thread* that forked this process exits, even if the parent process lives on: the receiver
    checks getppid()."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return libc.prctl(_PR_SET_PDEATHSIG, int(signum), 0, 0, 0) == 0
    except (OSError, AttributeError):
        return False


def watch_parent(
    parent: int, on_gone: Callable[[], None], *, hangup_means_gone: bool = False, poll: float = 1.0
) -> None:
    """Calls ``on_gone()`` once, from a thread of its own, as soon as ``parent`` is no longer this
    process's parent (it died; this process was handed to a reaper), however it died.

    The kernel signals the parent's death (PARENT_DEATH_SIGNAL, prctl PR_SET_PDEATHSIG); a watcher
    thread also compares getppid() with ``parent`` every ``poll`` seconds, which catches a parent
    that died before the kernel was asked, and a main thread busy in C code that would run the
    signal's Python handler late. The signal alone is no proof, for the kernel also sends it when
    the parent's *thread* that started this process ends: only getppid() decides, unless
    ``hangup_means_gone`` (a terminal's hang-up, the same signal, then counts as the end too).
    The handler only wakes the watcher: ``on_gone`` never runs inside a signal handler.
    """
    wake = threading.Event()
    hung_up = threading.Event()

    def on_signal(_signum, _frame):
        if hangup_means_gone:
            hung_up.set()
        wake.set()

    def watch():
        while os.getppid() == parent and not hung_up.is_set():
            wake.wait(poll)
            wake.clear()
        on_gone()

    signal.signal(PARENT_DEATH_SIGNAL, on_signal)
    _set_parent_death_signal(PARENT_DEATH_SIGNAL)
    # Started after the signal was asked for: a parent that died before is seen by its first check.
    threading.Thread(target=watch, name="parent-watch", daemon=True).start()


def _stop_from_outside(argv: list[str]) -> int:
    """``python -m local.lifecycle stop MARK SPARED_PID GRACE TIMEOUT [SHARED_MEMORY...]``: what
    :func:`stop_run_apart` runs. Writes the pids it could not stop to stdout, if anyone still reads."""
    _, mark, spared, grace, timeout, *held = argv
    left = stop_run(mark, float(grace), float(timeout), [Path(path) for path in held], spare=[int(spared)])
    try:
        print(" ".join(map(str, left)), flush=True)
    except OSError:  # the server is gone (the run is stopped all the same): no complaint at exit
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
    return 1 if left else 0


if __name__ == "__main__":
    sys.exit(_stop_from_outside(sys.argv[1:]))
