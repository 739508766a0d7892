"""The CPU each process of a local server, and the benchmark's client, spent during one benchmark level.

On the local servers the engines, Ray Serve's processes and `vllm bench serve` itself share this
machine's few cores; the advisor models that sharing (planner/simulate.py, ``SharedHost``) from what
is recorded here: per process role, the CPU seconds of the level (``/proc/PID/stat``: user and system
time), beside the level's wall time. A role is the process's title as Ray and vLLM set it, less what
changes while it runs (the method a Ray actor is in): ``ServeReplica:llm:PDProxyServer``,
``ProxyActor``, vLLM's ``EngineCore`` and its ``Worker`` (with the role above them: ``EngineCore of
ServeReplica:llm:Decode:…``), ``raylet``; the benchmark's own process is ``client``.
"""

from __future__ import annotations

import os
import re
import time
from collections import defaultdict
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from local.lifecycle import session_members

PROC = Path("/proc")
CLIENT = "client"
_TICKS_PER_S = os.sysconf("SC_CLK_TCK")
# What a title carries that is not the process's role: Ray's and vLLM's prefixes, the method a Serve
# replica runs.
_RAY, _VLLM = "ray::", "VLLM::"
_METHOD = re.compile(r"\.[A-Za-z_][\w]*$")


def cpu_seconds(pid: int) -> float | None:
    """User and system CPU of ``pid`` so far (its own threads', not its children's)."""
    try:
        fields = (PROC / str(pid) / "stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return (int(fields[11]) + int(fields[12])) / _TICKS_PER_S


def title(pid: int) -> str | None:
    try:
        argv = (PROC / str(pid) / "cmdline").read_bytes().split(b"\0")
    except OSError:
        return None
    first = argv[0].decode(errors="replace").strip()
    if not first:
        return None
    words = first.split()
    name = words[0] if words[0].startswith(_RAY) else Path(words[0]).name
    if name.startswith("python") and len(argv) > 1:
        # A plain Python process: its script or module is what it is.
        rest = [a.decode(errors="replace") for a in argv[1:] if a and not a.startswith(b"-")]
        name = Path(rest[0]).name if rest else name
    return name


def parent(pid: int) -> int | None:
    try:
        return int((PROC / str(pid) / "stat").read_text().rsplit(")", 1)[1].split()[1])
    except (OSError, ValueError, IndexError):
        return None


def role(pid: int) -> str | None:
    """The process's role (see the module's docstring); None if it is gone."""
    name = title(pid)
    if name is None:
        return None
    if name.startswith(_VLLM):
        # vLLM's engine processes (EngineCore, its Worker) are told apart by the replica above them.
        above = parent(pid)
        owner = role(above) if above else None
        name = name.removeprefix(_VLLM)
        return f"{name} of {owner}" if owner else name
    if name.startswith(_RAY):
        name = name.removeprefix(_RAY)
        name = _METHOD.sub("", name) if name.startswith("ServeReplica") else name
    return name


def snapshot(pids: list[int]) -> dict[int, tuple[str, float]]:
    out = {}
    for pid in pids:
        seconds, name = cpu_seconds(pid), role(pid)
        if seconds is not None and name is not None:
            out[pid] = (name, seconds)
    return out


@contextmanager
def accounted(session: int) -> Iterator[dict[str, float]]:
    """Fills the dict it yields, when the block ends, with the CPU seconds each role of the server
    whose processes are in ``session`` spent during the block (``client``: this process), and
    ``wall_s``. A process that started or ended inside the block is left out: its share is unknown."""
    before = snapshot([*session_members(session), os.getpid()])
    start = time.monotonic()
    spent: dict[str, float] = {}
    yield spent
    wall = time.monotonic() - start
    after = snapshot(list(before))
    totals: dict[str, float] = defaultdict(float)
    for pid, (name, seconds) in after.items():
        if pid in before and before[pid][0] == name or pid == os.getpid():
            totals[CLIENT if pid == os.getpid() else name] += seconds - before[pid][1]
    spent.update({name: round(seconds, 3) for name, seconds in sorted(totals.items())})
    spent["wall_s"] = round(wall, 3)
