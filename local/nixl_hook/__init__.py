"""A poll timeout for NIXL's progress thread in a local run, so an idle P/D engine sleeps instead of
spinning a core.

NIXL's Python agent (1.3.1, the image's: ``nixl_agent.__init__`` in ``_api.py``) sets the C++ agent
config's ``pthrDelay`` to 0 and ``nixl_agent_config`` has no field for it. The UCX backend's shared progress thread uses that
delay, rounded up to whole milliseconds, as its ``poll()`` timeout, so at 0 it never blocks: each
idle P/D engine's worker burns most of a core (``docs/benchmarks.md``, "Selective P/D on the CPU").
vLLM builds its agent through that class, so no vLLM or serving setting reaches the delay.

With a delay the thread still progresses every worker when UCX signals an event, and again at
each timeout; only its idle loop sleeps. ``enable`` puts this folder on ``PYTHONPATH`` and the
delay in the environment before the run starts Ray: every process of the run inherits both, and
Python imports ``sitecustomize`` from here at start-up, which sets the delay as NIXL's bindings
load. Only local runs do this; a cluster's engines run NIXL as it ships (a GPU node has 32 vCPUs,
and its backend is LIBFABRIC).
"""

from __future__ import annotations

import os
from collections.abc import MutableMapping
from pathlib import Path

# The one definition of the variable's name is the hook's own: it runs in Ray's workers, where this
# package is not importable. Imported here with no delay in the environment, it installs nothing.
from local.nixl_hook.sitecustomize import DELAY_ENV

HOOK_DIR = Path(__file__).resolve().parent
# 1 ms: the shortest poll() timeout there is (NIXL rounds up to milliseconds). Two agents on an
# idle 2-core machine, two runs each way: idle CPU 0.04-0.07 cores against 1.99 (both cores); a
# 1 MiB loopback read p50 3.7 ms against 0.4-5.1 ms, p90 3.8 ms against 7.5-10.9 ms.
DEFAULT_DELAY_US = 1000


def enable(environ: MutableMapping[str, str], delay_us: int = DEFAULT_DELAY_US) -> None:
    """Sets up ``environ`` (the run's, before Ray starts) so NIXL agents get ``delay_us``."""
    if delay_us < 1:
        raise ValueError(f"{DELAY_ENV}: {delay_us} is not a delay; give at least 1 microsecond")
    environ[DELAY_ENV] = str(delay_us)
    paths = [p for p in environ.get("PYTHONPATH", "").split(os.pathsep) if p and p != str(HOOK_DIR)]
    environ["PYTHONPATH"] = os.pathsep.join([str(HOOK_DIR), *paths])
