"""The ports a local run binds: which they are, whether they are free, and who holds one that is not."""

from __future__ import annotations

import os
import socket
import time
from collections.abc import Collection

from local import lifecycle
from local.errors import StartupFailure
from local.lifecycle import PROC, ProcessInfo, command_of
from serve_app.spec import PHASES

# How long a port held by a process just stopped (the leftovers of a killed run) may take to come
# free: the kernel frees it when the last thread of that process has exited.
SETTLE_SECONDS = 15.0


def port_free(port: int, host: str = "127.0.0.1") -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        # As the servers themselves do: a socket of a stopped run in TIME_WAIT is not in the way.
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind((host, port))
        except OSError:
            return False
    return True


# The kernel's TCP states, as /proc/net/tcp writes them (include/net/tcp_states.h).
TCP_STATES = {
    "01": "ESTABLISHED",
    "02": "SYN_SENT",
    "03": "SYN_RECV",
    "04": "FIN_WAIT1",
    "05": "FIN_WAIT2",
    "06": "TIME_WAIT",
    "07": "CLOSE",
    "08": "CLOSE_WAIT",
    "09": "LAST_ACK",
    "0A": "LISTEN",
    "0B": "CLOSING",
}


def sockets_on(port: int) -> list[tuple[str, str]]:
    """(state, inode) of every TCP socket whose local port is ``port`` (/proc/net/tcp and tcp6)."""
    found = []
    for table in ("tcp", "tcp6"):
        try:
            lines = (PROC / "net" / table).read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            fields = line.split()
            if int(fields[1].rsplit(":", 1)[1], 16) == port:
                found.append((TCP_STATES.get(fields[3], fields[3]), fields[9]))
    return found


def _listening_inodes(port: int) -> set[str]:
    return {inode for state, inode in sockets_on(port) if state == "LISTEN"}


def _fd_dirs(entry):
    yield entry / "fd"
    # A process whose first thread has exited lists no files of its own, though its other threads
    # still hold them (lifecycle.alive): look through theirs.
    if lifecycle._stat_fields(entry.name)[:1] == ["Z"]:
        try:
            yield from (task / "fd" for task in (entry / "task").iterdir() if task.name != entry.name)
        except OSError:
            return


def port_holder(port: int) -> ProcessInfo | None:
    """The process listening on ``port``, where /proc tells (a process of this user)."""
    inodes = {f"socket:[{inode}]" for inode in _listening_inodes(port)}
    if not inodes:
        return None
    for entry in PROC.iterdir():
        if not entry.name.isdigit():
            continue
        for fds in _fd_dirs(entry):
            try:
                for fd in fds.iterdir():
                    if os.readlink(fd) in inodes:
                        return ProcessInfo(int(entry.name), command_of(int(entry.name)))
            except OSError:
                continue
    return None


def ports_to_bind(spec, args) -> list[tuple[int, str, str]]:
    """(port, what binds it, the setting that moves it) for every fixed port of the run."""
    ports = [
        (args.port, "Serve's HTTP endpoint", "--port N (make local LOCAL_ARGS='--port N')"),
        (args.metrics_port, "Ray's metrics export", "--metrics-port N (make local LOCAL_ARGS='--metrics-port N')"),
    ]
    if spec.mode == "disaggregated":
        move = (
            "--nixl-port-base N (make local LOCAL_ARGS='--nixl-port-base N'; decode uses N+2000) or the spec's "
            "kv_transfer.side_channel_port_base"
        )
        for phase in PHASES:
            ports.append((spec.side_channel_port(phase), f"the {phase} engine's NIXL side channel", move))
    return ports


def check_ports(
    ports: list[tuple[int, str, str]], stopped: Collection[int] = (), settle: float = SETTLE_SECONDS
) -> None:
    """Refuses the start if a port is in use, naming its holder and how to move the port.

    ``stopped``: processes stopped just before (what a killed run left). A port that one of them
    holds, or that no visible process holds while one of them is still exiting, is theirs: it
    gets ``settle`` seconds to come free. Only a port held by none of them, once they are gone,
    is someone else's, named as such.
    """
    deadline = time.monotonic() + settle
    for port, what, move in ports:
        while not port_free(port):
            holder = port_holder(port)
            exiting = [pid for pid in stopped if lifecycle.alive(pid)]
            theirs = holder.pid in stopped if holder else bool(exiting)
            if not theirs:
                who = holder.describe() if holder else "a process this user cannot see"
                raise StartupFailure(f"port {port} ({what}) is in use by {who}; stop it, or move the port with {move}")
            if time.monotonic() > deadline:
                who = holder.describe() if holder else f"one of pid(s) {', '.join(map(str, exiting))}"
                raise StartupFailure(
                    f"port {port} ({what}) is still held by {who}, left by an earlier local run: it was "
                    f"stopped but has not exited within {settle:.0f} s; wait, or move the port with {move}"
                )
            time.sleep(0.2)
