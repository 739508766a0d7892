"""Before a run starts: stopping what earlier runs left behind (their server was killed), and
removing the shared memory those processes held."""

from __future__ import annotations

import time
from pathlib import Path

from local import lifecycle
from local.paths import RUN_RECORD, read_json

SWEEP_SECONDS = 30.0


def sweep(say=print, timeout: float = SWEEP_SECONDS) -> set[int]:
    """Stops every process of earlier runs whose server is gone, and returns once they are all gone
    (every thread, so that their ports are released), at most ``timeout`` seconds; processes they
    start meanwhile are stopped too. Says so in one line; returns the pids it stopped."""
    recorded = read_json(RUN_RECORD).get("mark")
    deadline = time.monotonic() + timeout
    found: dict[int, lifecycle.ProcessInfo] = {}
    shared_memory: set[Path] = set()
    left = []
    while time.monotonic() < deadline:
        left = lifecycle.leftovers(recorded)
        if not left:
            break
        found.update((p.pid, p) for p in left if p.pid not in found)
        shared_memory |= lifecycle.shared_memory_of(p.pid for p in left)
        lifecycle.stop_processes([p.pid for p in left], deadline=deadline)
    removed = lifecycle.remove_unmapped(shared_memory) if not left else []
    if found:
        stopped = list(found.values())
        names = ", ".join(p.describe() for p in stopped[:4]) + (
            f" and {len(stopped) - 4} more" if len(stopped) > 4 else ""
        )
        segments = f"; removed {len(removed)} shared-memory file(s) they held" if removed else ""
        say(
            f"stopped {len(stopped)} process(es) left by an earlier local run that did not shut down: {names}"
            + segments
        )
    return set(found)
