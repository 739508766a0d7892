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
# The run's own secrets, readable by this user alone and gone when the run stops: Ray's token
# (every node and the driver read it through RAY_AUTH_TOKEN_PATH) and, with an API key, its file.
RAY_AUTH_TOKEN_FILE = RUN_DIR / "ray-auth-token"
API_KEYS_DIR = RUN_DIR / "api-keys"
# The secret the keyed ingress salts each key's prefix cache under (the stack generates the cluster's).
CACHE_SALT_FILE = RUN_DIR / "cache-salt"


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


def write_private(path: Path, text: str) -> Path:
    """Writes ``text`` to ``path``, readable and writable by this user only, from its first byte."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.touch(mode=0o600)
    path.chmod(0o600)
    path.write_text(text)
    return path
