"""The local run's NIXL progress-thread delay (local/nixl_hook), in a real NIXL agent: the
environment ``enable`` sets is what every process of the run inherits."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from local import nixl_hook
from tests.conftest import ROOT

pytestmark = pytest.mark.serving

MAKE_AGENT = """
import nixl._api as nixl
nixl.nixl_agent("hook-test", nixl.nixl_agent_config())
try:
    import sitecustomize
except ImportError:
    print([])
else:
    print(getattr(sitecustomize, "applied", []))
"""


def agent_delays(environ: dict[str, str]) -> str:
    done = subprocess.run(
        [sys.executable, "-c", MAKE_AGENT], env=environ, cwd=ROOT, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr[-2000:]
    return done.stdout.strip().splitlines()[-1]


def test_an_agent_made_in_a_process_of_the_run_gets_the_delay():
    environ = dict(os.environ)
    nixl_hook.enable(environ)
    assert agent_delays(environ) == f"[{nixl_hook.DEFAULT_DELAY_US}]"


def test_without_it_nixl_is_as_it_ships():
    environ = {k: v for k, v in os.environ.items() if k != nixl_hook.DELAY_ENV}
    environ["PYTHONPATH"] = str(nixl_hook.HOOK_DIR)  # the hook on the path, but no delay asked for
    assert agent_delays(environ) == "[]"


def test_enable_keeps_the_path_it_was_given_and_adds_itself_once():
    environ = {"PYTHONPATH": "/somewhere"}
    nixl_hook.enable(environ, delay_us=2000)
    nixl_hook.enable(environ, delay_us=2000)
    assert environ["PYTHONPATH"].split(os.pathsep) == [str(nixl_hook.HOOK_DIR), "/somewhere"]
    assert environ[nixl_hook.DELAY_ENV] == "2000"


def test_a_delay_under_a_microsecond_is_refused():
    with pytest.raises(ValueError, match="PD_SERVING_NIXL_PROGRESS_DELAY_US: 0 is not a delay"):
        nixl_hook.enable({}, delay_us=0)
