"""What `make bench` and `make bench-compare` leave in the terminal: the report and where it was
written, last; what the libraries print (vLLM's generator for each run, triton's bindings as the
interpreter exits) goes to the results folder's log, not lost."""

from __future__ import annotations

import subprocess
import sys

import pytest

from tests.conftest import ROOT

pytest.importorskip("matplotlib", reason="the plots need the serving stack (requirements-serve.txt)")
pytestmark = pytest.mark.serving

# `python -m bench.run` itself (its __main__), with vLLM's load generator replaced by one that
# prints what vLLM's does around a run (a tip on stdout, a warning straight to the stderr
# descriptor, a child process's line), and an exit hook that writes to stderr after the program's
# last line, as triton's nanobind bindings do.
BENCH_WITH_NOISE = """
import argparse, atexit, os, runpy, subprocess, sys, types

def generator(args):
    print("tip: install termplotlib and gnuplot to plot the metrics")
    os.write(2, b"generator warning from C\\n")
    subprocess.run([sys.executable, "-c", "print('generator child process')"], check=True)
    return {"completed": 6, "failed": 0, "request_throughput": 2.0, "output_throughput": 16.0,
            "request_goodput": 2.0, "median_ttft_ms": 12.0}

class Parser(argparse.ArgumentParser):
    def parse_args(self, args=None, namespace=None):
        return self.parse_known_args(args, namespace)[0]

for name in ("vllm", "vllm.benchmarks", "vllm.utils"):
    sys.modules[name] = types.ModuleType(name)
sys.modules["vllm.benchmarks.serve"] = types.SimpleNamespace(add_cli_args=lambda parser: None, main=generator)
sys.modules["vllm.utils.argparse_utils"] = types.SimpleNamespace(FlexibleArgumentParser=Parser)
atexit.register(lambda: os.write(2, b"nanobind: leaked 7 instances!\\nnanobind: leaked 2 types!\\n"))
sys.argv = ["bench.run", *sys.argv[1:]]
runpy.run_module("bench.run", run_name="__main__", alter_sys=True)
"""


def test_the_terminal_ends_with_the_report_and_the_libraries_output_is_in_the_log(tmp_path):
    done = subprocess.run(
        [sys.executable, "-c", BENCH_WITH_NOISE, "--url", "http://127.0.0.1:9/v1", "--workload", "tiny"]
        + ["--out", str(tmp_path)],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stdout
    report = (tmp_path / "report.md").read_text()
    expected_end = [line for line in report.splitlines() if line] + [f"results in {tmp_path}"]
    terminal = [line for line in done.stdout.splitlines() if line]
    assert terminal[-len(expected_end) :] == expected_end, done.stdout
    for noise in ("tip: install termplotlib", "generator warning", "generator child process", "nanobind"):
        assert noise not in done.stdout
    log = (tmp_path / "bench.log").read_text()
    for noise in ("tip: install termplotlib", "generator warning", "generator child process", "leaked 7 instances"):
        assert noise in log
    assert "[bench] endpoint: 6 ok, 0 failed, 2.00 req/s" in done.stdout
