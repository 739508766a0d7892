"""Reading the cluster through kubectl, or replaying what kubectl printed once.

A recording holds one file per command, named by a slug of its arguments (``.json`` for
``get_json``, ``.txt`` for text), so a user can attach a cluster's outputs to a bug report and the
tests replay the very same files.
"""

from __future__ import annotations

import hashlib
import json
import re
import shutil
import subprocess
from pathlib import Path

# Ray writes the output of its actors (the vLLM engines, NIXL inside them) to files in the
# session's log folder, not to the container's stdout; only these lines are fetched.
RAY_LOG_DIR = "/tmp/ray/session_latest/logs"
RAY_LOG_LINES = "nixl|libfabric"
_SLUG_MAX = 120


class KubeError(Exception):
    """kubectl could not answer; the message says what to do."""


def slug(args: list[str]) -> str:
    text = re.sub(r"[^A-Za-z0-9.=-]+", "_", " ".join(args)).strip("_")
    if len(text) <= _SLUG_MAX:
        return text
    return f"{text[: _SLUG_MAX - 11]}_{hashlib.sha1(' '.join(args).encode()).hexdigest()[:10]}"


class Kube:
    """The few reads the checks need. Subclasses implement ``get_json`` and ``text``."""

    def get_json(self, args: list[str]) -> dict:
        raise NotImplementedError

    def text(self, args: list[str]) -> str:
        raise NotImplementedError

    def logs(self, pod: str, namespace: str, container: str, tail: int = 2000) -> str:
        return self.text(["logs", pod, "-n", namespace, "-c", container, f"--tail={tail}"])

    def ray_logs(self, pod: str, namespace: str, container: str, lines: int = 500) -> str:
        """The NIXL/libfabric lines of the Ray session logs inside a pod."""
        script = (
            f"grep -h -i -E '{RAY_LOG_LINES}' {RAY_LOG_DIR}/*.out {RAY_LOG_DIR}/*.err 2>/dev/null | tail -n {lines}"
        )
        return self.text(["exec", pod, "-n", namespace, "-c", container, "--", "sh", "-c", script])


class KubectlRunner(Kube):
    def __init__(self, kubeconfig: str | None = None, context: str | None = None, timeout: float = 60):
        self.timeout = timeout
        self.base = ["kubectl"]
        if kubeconfig:
            self.base += ["--kubeconfig", kubeconfig]
        if context:
            self.base += ["--context", context]

    def run(self, args: list[str]) -> str:
        if shutil.which(self.base[0]) is None:
            raise KubeError(
                "kubectl is not on PATH; install it (https://kubernetes.io/docs/tasks/tools/) or "
                "replay a recording with --recorded DIR"
            )
        try:
            done = subprocess.run(
                [*self.base, *args], capture_output=True, text=True, timeout=self.timeout, check=False
            )
        except subprocess.TimeoutExpired:
            raise KubeError(
                f"`kubectl {' '.join(args)}` took over {self.timeout:.0f} s; is the cluster reachable?"
            ) from None
        if done.returncode != 0:
            detail = done.stderr.strip().splitlines()[-1:] or ["(no output)"]
            raise KubeError(
                f"`kubectl {' '.join(args)}` failed: {detail[0]}. Check that the kubeconfig points at "
                "this environment's cluster (run the stack's UpdateKubeconfigCommand output, or pass "
                "--kubeconfig / --context)"
            )
        return done.stdout

    def get_json(self, args: list[str]) -> dict:
        return json.loads(self.run([*args, "-o", "json"]))

    def text(self, args: list[str]) -> str:
        return self.run(args)


class RecordedKube(Kube):
    """Replays a directory written by :class:`RecordingKube`."""

    def __init__(self, directory: str | Path):
        self.directory = Path(directory)

    def _read(self, args: list[str], suffix: str) -> str:
        path = self.directory / f"{slug(args)}{suffix}"
        if not path.is_file():
            raise KubeError(f"no recorded output for `kubectl {' '.join(args)}` (expected {path})")
        return path.read_text()

    def get_json(self, args: list[str]) -> dict:
        return json.loads(self._read(args, ".json"))

    def text(self, args: list[str]) -> str:
        return self._read(args, ".txt")


class RecordingKube(Kube):
    """Passes every read to ``inner`` and keeps its answer in ``directory``."""

    def __init__(self, inner: Kube, directory: str | Path):
        self.inner = inner
        self.directory = Path(directory)
        self.directory.mkdir(parents=True, exist_ok=True)

    def get_json(self, args: list[str]) -> dict:
        data = self.inner.get_json(args)
        (self.directory / f"{slug(args)}.json").write_text(json.dumps(data, indent=1) + "\n")
        return data

    def text(self, args: list[str]) -> str:
        data = self.inner.text(args)
        (self.directory / f"{slug(args)}.txt").write_text(data)
        return data
