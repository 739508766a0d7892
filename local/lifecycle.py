"""What a local run starts, what a dead one left behind, and who holds a port: read from /proc.

The server leads a process session of its own, and every process it starts stays in it (Ray's
daemons and agents, its workers, the vLLM engine processes), whatever its parent becomes once
the server is gone. Its processes also carry ``PD_SERVING_LOCAL_RUN=<server pid>-<server start
time>`` in their environment, which Ray's workers and the engines inherit (Ray starts its agents
with an environment of their own, so the session is what finds those). A session whose leader,
the server, no longer exists holds the leftovers of an unclean stop (kill -9). Linux only (``/proc``).
"""

from __future__ import annotations

import os
import signal
import socket
import time
from dataclasses import dataclass
from pathlib import Path

RUN_MARKER = "PD_SERVING_LOCAL_RUN"
PROC = Path("/proc")


@dataclass(frozen=True)
class ProcessInfo:
    pid: int
    command: str

    def describe(self) -> str:
        return f"pid {self.pid} ({self.command})"


def _stat_fields(pid: int) -> list[str]:
    """/proc/pid/stat after the command name (field 3, the state, first); empty if the pid is gone."""
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
    try:
        raw = (PROC / str(pid) / "cmdline").read_bytes()
    except OSError:
        return "?"
    command = raw.replace(b"\0", b" ").decode(errors="replace").strip()
    return command[:120] or f"[{(PROC / str(pid) / 'comm').read_text().strip()}]"


def _environ_mark(pid: int) -> str | None:
    try:
        for entry in (PROC / str(pid) / "environ").read_bytes().split(b"\0"):
            if entry.startswith(RUN_MARKER.encode() + b"="):
                return entry.split(b"=", 1)[1].decode()
    except OSError:
        return None
    return None


def _alive(pid: int) -> bool:
    """Whether ``pid`` exists and is not a zombie (a zombie has exited; only its parent's wait is missing)."""
    fields = _stat_fields(pid)
    return bool(fields) and fields[0] != "Z"


def marked_processes(mark: str | None = None) -> dict[str, list[int]]:
    """Living processes that carry a run mark, by mark (only ``mark`` when given)."""
    found: dict[str, list[int]] = {}
    me = os.getpid()
    for entry in PROC.iterdir():
        if not entry.name.isdigit() or int(entry.name) == me:
            continue
        pid = int(entry.name)
        value = _environ_mark(pid)
        if value and (mark is None or value == mark) and _alive(pid):
            found.setdefault(value, []).append(pid)
    return found


def server_alive(mark: str) -> bool:
    """Whether the server that set ``mark`` still runs (same pid and the same start time)."""
    pid, _, started = mark.partition("-")
    return pid.isdigit() and start_time(int(pid)) == started and _alive(int(pid))


def session_members(session: int) -> list[int]:
    """Living processes of a session, except this one."""
    members = []
    me = os.getpid()
    for entry in PROC.iterdir():
        if not entry.name.isdigit() or int(entry.name) == me:
            continue
        try:
            if os.getsid(int(entry.name)) == session and _alive(int(entry.name)):
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


def become_session_leader() -> None:
    """Makes this process lead a session of its own, so that everything it starts can be found.

    A process that already leads a process group (started from a shell, not through make) cannot
    call setsid(); it then forks, the child carries on in a new session, and the parent stays in
    front, passing on Ctrl-C and SIGTERM and exiting with the child's status.
    """
    if os.getsid(0) == os.getpid():
        return
    try:
        os.setsid()
        return
    except PermissionError:
        pass
    child = os.fork()
    if child == 0:
        os.setsid()
        return
    for signum in (signal.SIGINT, signal.SIGTERM):
        signal.signal(signum, lambda number, _frame: os.kill(child, number))
    while True:
        try:
            _, status = os.waitpid(child, 0)
            break
        except InterruptedError:
            continue
    os._exit(os.waitstatus_to_exitcode(status))


def stop_processes(pids: list[int], grace: float = 5.0) -> None:
    """SIGTERM, then SIGKILL what is still alive after ``grace`` seconds; returns once all are gone."""
    for sig, wait in ((signal.SIGTERM, grace), (signal.SIGKILL, 10.0)):
        living = [pid for pid in pids if _alive(pid)]
        for pid in living:
            try:
                os.kill(pid, sig)
            except ProcessLookupError:
                pass
        deadline = time.monotonic() + wait
        while time.monotonic() < deadline and any(_alive(pid) for pid in living):
            time.sleep(0.1)


# --- ports ---------------------------------------------------------------------------------------


def port_free(port: int, host: str = "127.0.0.1") -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        # As the servers themselves do: a socket of a stopped run in TIME_WAIT is not in the way.
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind((host, port))
        except OSError:
            return False
    return True


def _listening_inodes(port: int) -> set[str]:
    inodes = set()
    for table in ("tcp", "tcp6"):
        try:
            lines = (PROC / "net" / table).read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            fields = line.split()
            local, state, inode = fields[1], fields[3], fields[9]
            if int(local.rsplit(":", 1)[1], 16) == port and state == "0A":  # 0A: LISTEN
                inodes.add(inode)
    return inodes


def port_holder(port: int) -> ProcessInfo | None:
    """The process listening on ``port``, where /proc tells (a process of this user)."""
    inodes = {f"socket:[{inode}]" for inode in _listening_inodes(port)}
    if not inodes:
        return None
    for entry in PROC.iterdir():
        if not entry.name.isdigit():
            continue
        try:
            for fd in (entry / "fd").iterdir():
                if os.readlink(fd) in inodes:
                    return ProcessInfo(int(entry.name), command_of(int(entry.name)))
        except OSError:
            continue
    return None
