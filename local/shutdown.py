"""Stopping a run, whatever stops it, with nothing of it left once the server has exited.

- The first SIGINT or SIGTERM unwinds the server (KeyboardInterrupt) into :func:`shutdown`: Serve
  and Ray shut down cleanly while that fits, then whatever of the run is still there is stopped;
  within SHUTDOWN_SECONDS in all (the promise is 30 s, start-up included).
- A second one stops every process of the run at once (:func:`stop_now`).
- Python runs a signal handler only when the main thread runs Python code, and Ray's start-up can
  hold it in C++ for longer than the promise (a loaded machine, a raylet slow to register). So the
  first signal also starts a deadline in a thread of its own, woken through ``signal.set_wakeup_fd``
  at once whatever the main thread is doing: DEADLINE_SECONDS later, the run is stopped at once.
- The process that started the server going away (a closed terminal, a killed make, a CI runner's
  SIGKILL) stops every process of the run at once as well (:func:`parent_gone`, called by
  ``lifecycle.watch_parent``): nobody is left to wait for a clean shutdown.

In every case the server exits only once no process of its run is left (``lifecycle.stop_run``,
which also stops what the dying processes start meanwhile): a server that exited before its
processes did would leave them for whoever looks next. The stop runs in a process of its own
(``lifecycle.stop_run_apart``), which finishes it even if Ray ends the server first.
"""

from __future__ import annotations

import os
import signal
import sys
import threading
import time
from collections.abc import Iterable
from pathlib import Path

from local import lifecycle, ray_internals, segments
from local.paths import RUN_RECORD, STATUS_FILE, read_json

SHUTDOWN_SECONDS = 25
# Of SHUTDOWN_SECONDS, what stopping the processes a clean shutdown left (or could not stop) gets.
STOP_SECONDS = 8
# Stopping at once: SIGKILL after this long (a second signal), or a little longer (parent gone).
PARENT_GONE_GRACE = 2.0
# From the first SIGINT/SIGTERM to stopping at once, if the orderly shutdown has not exited by then;
# with STOP_SECONDS to stop what is left, inside the 30 s promise.
DEADLINE_SECONDS = 20

_signals_seen = 0
_exiting = threading.Lock()
# The shared-memory segments the run's processes create, recorded as they appear (track_shared_memory).
_shared_memory: Iterable[Path] = ()


def say(line: str, *, error: bool = False) -> None:
    """Prints a line if there is still somewhere to print it (a closed terminal is not)."""
    try:
        print(line, file=sys.stderr if error else sys.stdout, flush=True)
    except (OSError, ValueError):
        pass


_deadline_started = False


def install_signal_handlers() -> None:
    global _deadline_started
    for signum in (signal.SIGINT, signal.SIGTERM):
        signal.signal(signum, _on_signal)
    if not _deadline_started:
        read_end, write_end = os.pipe()
        os.set_blocking(write_end, False)
        signal.set_wakeup_fd(write_end, warn_on_full_buffer=False)
        threading.Thread(target=_deadline_after_signal, args=(read_end,), name="shutdown-deadline", daemon=True).start()
        _deadline_started = True


def _deadline_after_signal(read_end: int) -> None:
    """Waits for the first SIGINT or SIGTERM (written to the wakeup fd by the C-level handler, even
    while the main thread is blocked), then gives the orderly shutdown DEADLINE_SECONDS."""
    while True:
        received = os.read(read_end, 64)
        if not received:
            return
        if any(signum in (signal.SIGINT, signal.SIGTERM) for signum in received):
            break
    time.sleep(DEADLINE_SECONDS)
    stop_now(reason=f"the shutdown did not finish within {DEADLINE_SECONDS} s; stopping the run's processes at once")


def _on_signal(signum, _frame):
    """First SIGINT/SIGTERM: unwind (KeyboardInterrupt) into the bounded shutdown. Second: stop now."""
    global _signals_seen
    _signals_seen += 1
    if _signals_seen == 1:
        raise KeyboardInterrupt
    stop_now()


def track_shared_memory() -> None:
    """Records each shared-memory segment a process of the run (this one included) creates, as it
    is created, for the stop to remove (local/segments.py). Looked for only at the stop, or every
    few seconds, they would be missed: an engine killed during start-up takes the only mappings of
    its queues along, and a Ctrl-C reaches every process of the group as it reaches the server."""
    global _shared_memory
    mark = lifecycle.run_mark()
    _shared_memory = segments.SegmentRecorder(mark, lambda: [os.getpid(), *lifecycle.run_processes(mark)]).start()


def stopping() -> bool:
    """Whether the run is stopping (a signal came, or the shutdown began): nothing starts again."""
    return _signals_seen > 0 or _exiting.locked()


def forget_run() -> None:
    """Removes the status file, and the run record if it is this run's."""
    STATUS_FILE.unlink(missing_ok=True)
    if read_json(RUN_RECORD).get("pid") == os.getpid():
        RUN_RECORD.unlink(missing_ok=True)
    segments.forget(mark=lifecycle.run_mark())


def remove_late_segments() -> None:
    """The stopping process was given the segments recorded when it started; one the run created
    while it stopped is in the record by now, and is removed here, before the record is forgotten."""
    lifecycle.remove_unmapped(_shared_memory)


def stop_now(code: int = 130, grace: float = 0.0, reason: str | None = None) -> None:
    """Stops every process of the run (SIGKILL after ``grace`` seconds), then exits with ``code``,
    once they are gone. Only the first caller does it (the others return and let it)."""
    if not _exiting.acquire(blocking=False):
        return
    if reason:
        say(reason)
    left = lifecycle.stop_run_apart(
        lifecycle.run_mark(), grace=grace, timeout=grace + STOP_SECONDS, shared_memory=_shared_memory
    )
    remove_late_segments()
    if left:
        say(f"{len(left)} process(es) of the run did not exit: {', '.join(map(str, left))}", error=True)
    forget_run()
    exit_now(code)


def exit_now(code: int) -> None:
    """Flushes what can still be printed and exits without Python's exit handlers: Ray's atexit hook
    would only try to reach processes that are gone, and can wait on a clean shutdown still under
    way in the graceful thread."""
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            pass
    os._exit(code)


def parent_gone() -> None:
    """What ``lifecycle.watch_parent`` calls once the process that started the server is gone."""
    stop_now(
        code=128 + lifecycle.PARENT_DEATH_SIGNAL,
        grace=PARENT_GONE_GRACE,
        reason="the process that started the local server is gone; stopping the run",
    )


def shutdown(timeout: float = SHUTDOWN_SECONDS) -> None:
    """Serve and Ray shut down cleanly if they can within ``timeout`` less STOP_SECONDS; then every
    process this run started that is still there is stopped, and this returns once none is left."""
    global _signals_seen
    _signals_seen = max(_signals_seen, 1)  # a signal from here on means "stop now"
    say("shutting down")
    STATUS_FILE.unlink(missing_ok=True)

    def graceful():
        try:
            ray_internals.shutdown_ray()
        except Exception as exc:  # noqa: BLE001 - whatever is left is stopped below
            say(f"clean shutdown failed ({exc}); stopping the run's processes")

    worker = threading.Thread(target=graceful, name="graceful-shutdown", daemon=True)
    worker.start()
    worker.join(max(0.0, timeout - STOP_SECONDS))
    left = lifecycle.stop_run_apart(lifecycle.run_mark(), grace=3, timeout=STOP_SECONDS, shared_memory=_shared_memory)
    remove_late_segments()
    if left:
        say(f"{len(left)} process(es) of the run did not exit: {', '.join(map(str, left))}", error=True)
    segments.forget(mark=lifecycle.run_mark())
