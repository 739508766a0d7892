"""A pytest plugin (pytest.ini loads it): once pytest has printed its summary, whatever the process
prints as it exits goes to ``.pytest_cache/exit-output.log`` under the rootdir, not the terminal.

A test that imported vLLM leaves triton's nanobind bindings behind, which report their leaked
objects (some thirty lines on stderr) at interpreter exit, after pytest's summary, in the controller
and in every xdist worker. A run then ends on pytest's summary, and the lines are kept, not lost.
"""

from __future__ import annotations

import atexit
import os
import sys

import pytest

EXIT_OUTPUT_LOG = os.path.join(".pytest_cache", "exit-output.log")


@pytest.hookimpl(trylast=True)
def pytest_unconfigure(config: pytest.Config) -> None:
    # At exit, not now: pytest restores the terminal's descriptors after this hook (its capture's
    # cleanup). atexit runs the handlers registered last first, so this one precedes those that tests'
    # imports registered, and the interpreter's own teardown (where nanobind reports) comes after all.
    atexit.register(_exit_output_to, config.rootpath / EXIT_OUTPUT_LOG)


def _exit_output_to(log) -> None:
    log.parent.mkdir(parents=True, exist_ok=True)
    for stream in (sys.stdout, sys.stderr):
        stream.flush()
    worker = os.environ.get("PYTEST_XDIST_WORKER", "controller")
    fd = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    os.write(fd, f"--- pytest process {os.getpid()} ({worker}) exits\n".encode())
    # The descriptors themselves, not sys.stdout/sys.stderr: the bindings write to fd 2 from C.
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    os.close(fd)
