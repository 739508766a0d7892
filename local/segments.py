"""The shared-memory segments a run creates, recorded as they are created, so that the stop (and,
after a kill -9, the next start) removes exactly those.

Found only at the stop, by the processes that map them, a segment is missed whenever every process
that mapped it is gone by then: an engine killed during start-up takes its worker, and with it the
only mappings of the queue between them (vLLM's ``psm_*``, a few hundred MiB), while the Python
resource tracker that would unlink it is killed with the rest of the run. And a segment the run
merely attached to is not the run's to remove.

So the run watches /dev/shm for the whole of its life (inotify, through libc: no package needed) and
looks, as each new file appears, at who holds it: its creator holds the file descriptor shm_open or
sem_open gave it, or the mapping made from it, from the moment the file exists. A new file that a
process of the run holds is the run's, and is written to ``SEGMENTS_RECORD`` at once (it outlives a
kill -9 of the server). A file that was there before the run started, or that a process outside the
run holds when it appears, is never recorded. Linux only (inotify, ``/proc``).
"""

from __future__ import annotations

import ctypes
import os
import select
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path

from local import lifecycle
from local.paths import RUN_DIR, read_json, write_json

SEGMENTS_RECORD = RUN_DIR / "shared-memory.json"
# <sys/inotify.h>
_IN_MOVED_TO = 0x00000080
_IN_CREATE = 0x00000100
_IN_CLOEXEC = 0o2000000
# A new file that no process holds yet, or any more, is looked at again this often, this long: its
# creator may be between shm_open and the look; once every holder is gone, nothing tells whose it was.
_LOOK_AGAIN_SECONDS = 0.02
_LOOKS = 10


def _inotify(directory: Path) -> int:
    libc = ctypes.CDLL(None, use_errno=True)
    fd = libc.inotify_init1(_IN_CLOEXEC)
    if fd < 0:
        raise OSError(ctypes.get_errno(), "inotify_init1")
    if libc.inotify_add_watch(fd, str(directory).encode(), _IN_CREATE | _IN_MOVED_TO) < 0:
        errno = ctypes.get_errno()
        os.close(fd)
        raise OSError(errno, f"inotify_add_watch {directory}")
    return fd


def holders(inode: int, pids: Iterable[int], directory: Path = lifecycle.SHARED_MEMORY) -> Iterator[int]:
    """Those of ``pids`` that hold the file ``inode`` of ``directory``: an open descriptor or a
    mapping (a semaphore's creator maps it under a temporary name it has unlinked since: by inode)."""
    pids = list(pids)
    prefix = f"{directory}/"
    by_descriptor = set()
    for pid in pids:
        fd_dir = lifecycle.PROC / str(pid) / "fd"
        try:
            descriptors = os.listdir(fd_dir)
        except OSError:
            continue
        for fd in descriptors:
            try:
                if os.readlink(fd_dir / fd).startswith(prefix) and os.stat(fd_dir / fd).st_ino == inode:
                    by_descriptor.add(pid)
                    yield pid
                    break
            except OSError:
                continue
    for pid in pids:
        if pid not in by_descriptor and inode in lifecycle.mapped_inodes([pid], directory):
            yield pid


def held_by(inode: int, pids: Iterable[int], directory: Path = lifecycle.SHARED_MEMORY) -> bool:
    return next(holders(inode, pids, directory), None) is not None


class SegmentRecorder:
    """Records the files a run's processes create in ``directory`` while it runs (see the module)."""

    def __init__(
        self,
        mark: str,
        run_pids: Callable[[], Iterable[int]],
        record: Path = SEGMENTS_RECORD,
        directory: Path = lifecycle.SHARED_MEMORY,
    ):
        self.mark = mark
        self.run_pids = run_pids
        self.record = record
        self.directory = directory
        self.recorded: dict[str, int] = {}  # name -> inode
        self._seen: set[tuple[str, int]] = set()
        self._lock = threading.Lock()
        self._stop_read, self._stop_write = os.pipe()
        self._thread: threading.Thread | None = None

    def start(self) -> SegmentRecorder:
        events = _inotify(self.directory)
        # What is there before the watch began is not the run's: seen, never recorded.
        self._seen = set(self._listing())
        self._thread = threading.Thread(target=self._watch, args=(events,), name="shared-memory", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        os.write(self._stop_write, b"x")
        if self._thread is not None:
            self._thread.join(5)
        if self._thread is None or not self._thread.is_alive():
            os.close(self._stop_read)
            os.close(self._stop_write)

    def __iter__(self) -> Iterator[Path]:
        """The recorded segments still there (the same file: the same inode)."""
        with self._lock:
            recorded = dict(self.recorded)
        return iter(present(recorded, self.directory))

    def _listing(self) -> dict[tuple[str, int], int]:
        """(name, inode) -> owner of every file in the directory."""
        found = {}
        try:
            for entry in os.scandir(self.directory):
                try:
                    if entry.is_file(follow_symlinks=False):
                        found[(entry.name, entry.inode())] = entry.stat(follow_symlinks=False).st_uid
                except OSError:  # removed meanwhile
                    continue
        except OSError:
            pass
        return found

    def _watch(self, events: int) -> None:
        try:
            while True:
                ready, _, _ = select.select([events, self._stop_read], [], [])
                if self._stop_read in ready:
                    return
                os.read(events, 65536)  # which names does not matter: the listing says what is new
                self._look()
        finally:
            os.close(events)

    def _look(self) -> None:
        """Records each new file of this user's that a process of the run holds: all of them first,
        at once, as the run's processes may die any moment; then those whose creator outside the
        run holds them too (the run merely attached) are struck off again."""
        pending = [key for key, owner in self._listing().items() if key not in self._seen and owner == os.getuid()]
        self._seen.update(pending)
        for _ in range(_LOOKS):
            run_pids = list(self.run_pids())
            claimed = {name: inode for name, inode in pending if held_by(inode, run_pids, self.directory)}
            if claimed:
                self._write(claimed)
            others = self._others(run_pids)
            if attached := [name for name, inode in claimed.items() if self._held_outside(inode, others)]:
                self._write(dict.fromkeys(attached))
            # A file nobody holds yet may be its creator's between open and look; one another holds is theirs.
            pending = [
                (name, inode)
                for name, inode in pending
                if name not in claimed and (self.directory / name).exists() and not self._held_outside(inode, others)
            ]
            if not pending:
                return
            time.sleep(_LOOK_AGAIN_SECONDS)

    def _write(self, changes: dict[str, int | None]) -> None:
        """Records (name -> inode) or strikes off (name -> None), and writes the record at once."""
        with self._lock:
            for name, inode in changes.items():
                if inode is None:
                    self.recorded.pop(name, None)
                else:
                    self.recorded[name] = inode
            try:
                self.record.parent.mkdir(parents=True, exist_ok=True)
                write_json(self.record, {"mark": self.mark, "segments": self.recorded})
            except OSError:  # the stop still has them; only a kill -9 of the server loses them
                pass

    @staticmethod
    def _others(run_pids: list[int]) -> list[int]:
        mine = set(run_pids)
        return [int(e.name) for e in lifecycle.PROC.iterdir() if e.name.isdigit() and int(e.name) not in mine]

    def _held_outside(self, inode: int, others: list[int]) -> bool:
        """Whether a process outside the run holds it. Each holder is asked again: one of ``others``
        may be a process the run started since (a child forked with the creator's descriptors
        still open, before its exec closes them), which is the run's."""
        return any(not self._of_run(pid) for pid in holders(inode, others, self.directory))

    def _of_run(self, pid: int) -> bool:
        server = int(self.mark.partition("-")[0])
        try:
            return os.getsid(pid) == server or lifecycle._environ_mark(pid) == self.mark
        except (ProcessLookupError, PermissionError):  # gone: no longer anyone's holder
            return True


def present(recorded: dict[str, int], directory: Path = lifecycle.SHARED_MEMORY) -> set[Path]:
    """Those of ``recorded`` (name -> inode) still in ``directory`` as the very file recorded."""
    found = set()
    for name, inode in recorded.items():
        try:
            if os.stat(directory / name).st_ino == inode:
                found.add(directory / name)
        except OSError:
            continue
    return found


def left_by_earlier_run(record: Path = SEGMENTS_RECORD) -> tuple[str | None, set[Path]]:
    """The segments a run whose server is gone recorded and left (its mark, and their paths)."""
    data = read_json(record)
    mark = data.get("mark")
    if not mark or lifecycle.server_alive(mark):
        return None, set()
    return mark, present({str(k): int(v) for k, v in data.get("segments", {}).items()})


def forget(record: Path = SEGMENTS_RECORD, mark: str | None = None) -> None:
    """Removes the record (of ``mark``'s run, when given) once none of its segments is left."""
    data = read_json(record)
    if mark is not None and data.get("mark") != mark:
        return
    if not present({str(k): int(v) for k, v in data.get("segments", {}).items()}):
        record.unlink(missing_ok=True)
