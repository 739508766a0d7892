"""Before a run starts: stopping what earlier runs left behind (their server was killed), and
removing the shared memory such a run created (local/segments.py recorded it)."""

from __future__ import annotations

import time
from pathlib import Path

from local import lifecycle, segments
from local.paths import RUN_RECORD, read_json
from local.segments import SEGMENTS_RECORD

SWEEP_SECONDS = 30.0


def sweep(say=print, timeout: float = SWEEP_SECONDS) -> set[int]:
    """Stops every process of earlier runs whose server is gone, and returns once they are all gone
    (every thread, so that their ports are released), at most ``timeout`` seconds; processes they
    start meanwhile are stopped too. Then the shared memory the last such run recorded as its own
    goes. Says so in one line; returns the pids it stopped."""
    recorded = read_json(RUN_RECORD).get("mark")
    deadline = time.monotonic() + timeout
    found: dict[int, lifecycle.ProcessInfo] = {}
    left = []
    while time.monotonic() < deadline:
        left = lifecycle.leftovers(recorded)
        if not left:
            break
        found.update((p.pid, p) for p in left if p.pid not in found)
        lifecycle.stop_processes([p.pid for p in left], deadline=deadline)
    removed: list[Path] = []
    earlier_run, shared_memory = segments.left_by_earlier_run(SEGMENTS_RECORD)
    if earlier_run and not left:
        removed = lifecycle.remove_unmapped(shared_memory)
        segments.forget(SEGMENTS_RECORD, earlier_run)
    if found:
        stopped = list(found.values())
        names = ", ".join(p.describe() for p in stopped[:4]) + (
            f" and {len(stopped) - 4} more" if len(stopped) > 4 else ""
        )
        files = f"; removed {len(removed)} shared-memory file(s) it created" if removed else ""
        say(f"stopped {len(stopped)} process(es) left by an earlier local run that did not shut down: {names}" + files)
    elif removed:
        say(f"removed {len(removed)} shared-memory file(s) an earlier local run created and left")
    return set(found)
