"""Where a local run keeps its files: the run record, the status file, the logs."""

from __future__ import annotations

import json
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DEFAULT_SPEC = ROOT / "config" / "local.yaml"
RUN_DIR = ROOT / ".local" / "run"
# Written once the app is ready (tools read the replicas and URLs from it); gone when the run stops.
STATUS_FILE = RUN_DIR / "status.json"
# Written before anything starts: the server's pid and run mark, so the next start can find leftovers.
RUN_RECORD = RUN_DIR / "run.json"


def write_json(path: Path, data: dict) -> None:
    """Writes ``data`` so that a reader never sees half a file."""
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(data, indent=2))
    tmp.replace(path)


def read_json(path: Path) -> dict:
    """The JSON object in ``path``; empty if it is missing or unreadable."""
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}
