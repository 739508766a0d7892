"""Start and stop the local server as a child process: for tests, benchmarks and `make verify`.

The server runs in its own session so that stopping it reaches Ray's processes too; stopping sends
SIGINT (a clean Serve and Ray shutdown) and escalates to SIGKILL only after a grace period. Should the
process that started it die without stopping it, the server stops its run by itself within seconds.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from local import lifecycle
from local.paths import ROOT, RUN_DIR

# The variable the harness hands a server's API key in.
API_KEY_ENV = "LOCAL_SERVER_API_KEY"


@dataclass
class LocalServer:
    mode: str = "disaggregated"
    port: int = 8000
    metrics_port: int = 8085
    spec: Path | None = None
    # serve serve_app from this config's synthesized code asset (--code-from-asset), as the cluster does
    code_from_asset: Path | None = None
    extra_args: list[str] = field(default_factory=list)
    # The API key the ingress asks for (--api-key-env; passed in the environment), or None.
    api_key: str | None = None
    # More keys it accepts, each a tenant with a prefix cache of its own.
    other_api_keys: tuple[str, ...] = ()
    log_path: Path = field(default_factory=lambda: RUN_DIR / "server.log")
    process: subprocess.Popen | None = None
    status: dict = field(default_factory=dict)
    started_at: float = 0.0

    def _api_key_env(self) -> dict[str, str]:
        """The environment variables that hand the server its keys (never its command line)."""
        if not self.api_key:
            return {}
        keys = (self.api_key, *self.other_api_keys)
        return {API_KEY_ENV if i == 0 else f"{API_KEY_ENV}_{i}": key for i, key in enumerate(keys)}

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    def start(self, timeout: float = 900) -> LocalServer:
        RUN_DIR.mkdir(parents=True, exist_ok=True)
        (RUN_DIR / "status.json").unlink(missing_ok=True)
        log = open(self.log_path, "w")
        self.started_at = time.monotonic()
        self.process = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "local.server",
                "--mode",
                self.mode,
                "--port",
                str(self.port),
                "--metrics-port",
                str(self.metrics_port),
                *(["--spec", str(self.spec)] if self.spec else []),
                *(["--code-from-asset", str(self.code_from_asset)] if self.code_from_asset else []),
                *[arg for name in self._api_key_env() for arg in ("--api-key-env", name)],
                *self.extra_args,
            ],
            cwd=ROOT,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            env={**os.environ, "PYTHONUNBUFFERED": "1", **self._api_key_env()},
        )
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"local server exited with {self.process.returncode}:\n{self.log_tail()}")
            status = self.read_status()
            if status.get("pid") == self.process.pid and status.get("mode") == self.mode:
                self.status = status
                return self
            time.sleep(2)
        self.stop()
        raise TimeoutError(f"local server not ready after {timeout:.0f} s:\n{self.log_tail()}")

    def read_status(self) -> dict:
        try:
            return json.loads((RUN_DIR / "status.json").read_text())
        except (FileNotFoundError, json.JSONDecodeError):
            return {}

    def replicas(self) -> dict[str, str]:
        """Current replica ids -> deployment (replicas change when one is restarted)."""
        return self.read_status().get("replicas", self.status.get("replicas", {}))

    def metrics_urls(self) -> list[str]:
        """Where the engines' counters are exported: each node's own port in the cluster's shape."""
        return list(self.status.get("cluster", {}).get("metrics_urls", {}).values()) or [self.status["metrics_url"]]

    def counters(self, settle: float = 1.5, timeout: float = 30) -> dict:
        """Every engine's counters, settled (see :func:`local.metrics.settled`)."""
        from local.metrics import engine_counters, scrape, settled

        def snapshot() -> dict:
            return engine_counters([s for url in self.metrics_urls() for s in scrape(url)], self.replicas())

        return settled(snapshot, settle, timeout)

    def log_tail(self, lines: int = 40) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except FileNotFoundError:
            return "(no log)"

    def stop(self, grace: float = 90) -> int | None:
        if self.process is None or self.process.poll() is not None:
            return self.process.returncode if self.process else None
        os.killpg(self.process.pid, signal.SIGINT)
        try:
            self.process.wait(grace)
        except subprocess.TimeoutExpired:
            os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait(30)
        # Anything Ray left in the session (workers outlive a killed driver) goes too, and stop()
        # returns only once the kernel has let them go.
        try:
            os.killpg(self.process.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        deadline = time.monotonic() + 15
        while session_processes(self.process.pid) and time.monotonic() < deadline:
            time.sleep(0.2)
        return self.process.returncode


# Processes still alive in a process session (to prove nothing leaked); zombies are dead.
session_processes = lifecycle.session_members
