"""The CPU each process of a local server, and the benchmark's client, spent during one benchmark level.

On the local servers the engines, Ray Serve's processes and `vllm bench serve` itself share this
machine's few cores; the advisor models that sharing (planner/simulate.py, ``SharedHost``) from what
is recorded here: per process role, the CPU seconds of the level (``/proc/PID/stat``: user and system
time), beside the level's wall time. A role is the process's title as Ray and vLLM set it, less what
changes while it runs (the method a Ray actor is in): ``ServeReplica:llm:PDProxyServer``,
``ProxyActor``, vLLM's ``EngineCore`` and its ``Worker`` (with the role above them: ``EngineCore of
ServeReplica:llm:Decode:…``), ``raylet``; the benchmark's own process is ``client``.

The client is put ahead of the server for the CPU (``behind_the_client``), as it would be on a machine
of its own: a client left to wait for the cores measures its own waits as the server's latency.
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
AUTOGROUP_ENABLED = PROC / "sys" / "kernel" / "sched_autogroup_enabled"
# Linux's autogroup gives each session one share of the CPU, whatever its threads' own nice values:
# the local server (a session of its own, some 400 threads) and the client's session share the cores
# as equals, and under a saturating level the client's session waited up to 0.9 s for a core,
# several times a second (docs/benchmarks.md). Nice 10 weighs the server's session about a tenth of the
# client's, so the client runs when it has work; the server still has every cycle the client leaves.
SERVER_AUTOGROUP_NICE = 10
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


def autogroup_nice(pid: int) -> int | None:
    """The nice value of the autogroup ``pid`` is in; None where the kernel has none to show."""
    try:
        return int((PROC / str(pid) / "autogroup").read_text().split()[-1])
    except (OSError, ValueError, IndexError):
        return None


def behind_the_client(session: int, nice: int = SERVER_AUTOGROUP_NICE) -> str:
    """Puts the server whose processes are in ``session`` (a session leader's pid: ``start_new_session``)
    behind this process for the CPU; returns a line saying how, for the benchmark's report.

    With autogroup on, the session's autogroup gets ``nice`` (raising it needs no privilege). With it
    off the kernel weighs threads one by one: Ray already runs its workers, the engines among them, at
    nice 15 (its ``worker_niceness``), below the client's 0, and nothing is changed."""
    try:
        enabled = AUTOGROUP_ENABLED.read_text().strip() == "1"
    except OSError:
        enabled = False
    if not enabled:
        return "autogroup off: the client (nice 0) shares the cores with Ray's workers (nice 15) thread by thread"
    try:
        (PROC / str(session) / "autogroup").write_text(str(nice))
    except OSError as exc:
        # A kernel or sandbox that refuses it leaves a run still worth having, said to be one where
        # the client waited with the server.
        return f"the server's session left as it was ({exc.strerror}): the client shares the cores with it as an equal"
    return f"the server's session at autogroup nice {autogroup_nice(session)}, the client's at {autogroup_nice(os.getpid())}"
