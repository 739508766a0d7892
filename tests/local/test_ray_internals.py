"""local/ray_internals.py on the installed Ray: a Ray start interrupted half-way is shut down by Ray.

Ctrl-C during start-up can land inside ``ray.init`` after Ray started its processes and made the
driver's core worker, but before the driver counts as connected: ``ray.is_initialized()`` is then
False. Ray's own shutdown must still run (it destroys the core worker before it stops the node's
processes); left to the run's stop, the processes go first under a live core worker. The start runs
in a process of its own, so no Ray is left in pytest's.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys

import pytest

from tests.conftest import ROOT

pytest.importorskip("ray", reason="the serving stack (requirements-serve.txt) is not installed")
pytestmark = pytest.mark.serving

INTERRUPTED_START = """
import json, os, time
import ray, ray._raylet
from ray._private import worker
from local import ray_internals

made = ray._raylet.CoreWorker

def made_then_interrupted(*args, **kwargs):
    # The moment after connect() assigns the core worker: the earliest a signal handler runs.
    worker.global_worker.core_worker = made(*args, **kwargs)
    raise KeyboardInterrupt

ray._raylet.CoreWorker = made_then_interrupted
try:
    ray.init(address="local", num_cpus=1, include_dashboard=False, logging_level="ERROR")
except KeyboardInterrupt:
    pass
node = worker._global_node
started = [p.process.pid for processes in node.all_processes.values() for p in processes]
half_made = {"initialized": ray.is_initialized(), "core_worker": hasattr(worker.global_worker, "core_worker")}
ray_internals.shutdown_ray()

def running(pid):
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False

deadline = time.monotonic() + 20
while any(map(running, started)) and time.monotonic() < deadline:
    time.sleep(0.2)
print(json.dumps({
    **half_made,
    "started": len(started),
    "running": [pid for pid in started if running(pid)],
    "core_worker_after": hasattr(worker.global_worker, "core_worker"),
}))
"""


def test_a_start_interrupted_after_the_core_worker_is_made_is_shut_down_by_ray():
    process = subprocess.Popen(
        [sys.executable, "-c", INTERRUPTED_START],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        out, err = process.communicate(timeout=120)
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait(10)
    assert process.returncode == 0, err[-3000:]
    result = json.loads(out.strip().splitlines()[-1])
    assert result["initialized"] is False and result["core_worker"] is True, result  # the half-made start
    assert result["started"] >= 2, result  # the GCS and the raylet at least
    assert result["running"] == [] and result["core_worker_after"] is False, result
