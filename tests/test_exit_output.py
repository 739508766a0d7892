"""`make test` ends on pytest's summary: what a process prints as the interpreter exits (triton's
nanobind bindings, once a test imported vLLM) goes to the log of tests/exit_output.py, from the
controller and from every xdist worker."""

from __future__ import annotations

import subprocess
import sys

import pytest

from tests.conftest import ROOT
from tests.exit_output import EXIT_OUTPUT_LOG

# A test module that, like an imported vLLM, leaves an exit hook writing to the stderr descriptor.
NOISY_TESTS = """
import atexit, os

atexit.register(lambda: os.write(2, b"nanobind: leaked 7 instances!\\nnanobind: leaked 2 types!\\n"))


def test_one():
    assert True


def test_two():
    assert True
"""


@pytest.mark.parametrize("workers", [[], ["-n", "2"]], ids=["one process", "xdist workers"])
def test_the_run_ends_on_the_summary_and_the_exit_output_is_in_the_log(tmp_path, workers):
    (tmp_path / "test_noisy.py").write_text(NOISY_TESTS)
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-c", "/dev/null", "--rootdir", str(tmp_path), "-p", "tests.exit_output"]
        + ["-p", "no:cacheprovider", *workers, str(tmp_path / "test_noisy.py")],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stdout
    last = [line for line in done.stdout.splitlines() if line.strip()][-1]
    assert "2 passed" in last, done.stdout
    assert "nanobind" not in done.stdout
    log = (tmp_path / EXIT_OUTPUT_LOG).read_text()
    # The process that ran the tests: pytest's own, or with xdist each worker (the controller imports
    # no test module).
    assert log.count("nanobind: leaked 7 instances!") == (1 if not workers else 2), log
