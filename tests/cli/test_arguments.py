"""Every command behind a Makefile target parses its arguments with argparse.

``--help`` prints the usage and exits 0 without doing anything; an unknown flag is refused in one
line (argparse's ``error:`` line, exit 2) before any config is read, AWS asked or file written.
Each command runs in a real child Python, as `make` runs it.
"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from tests.conftest import CONFIG_DIR, ROOT

DEV = str(CONFIG_DIR / "dev.yaml")
GRAFANA_FILE = ROOT / "manifests" / "dashboards" / "pd_serving.grafana.json"

# module -> arguments that are otherwise complete, so that only the unknown flag is wrong; OUT is
# replaced by a fresh folder, which must stay empty.
COMMANDS = {
    "cli.summary": [DEV, "OUT"],
    "cli.deploy_guard": [DEV, "--facts-out", "OUT/facts.json"],
    "cli.plan": [DEV],
    "cli.kuberay_crds": [DEV],
    "cli.charts": ["--cache", "OUT/charts"],
    "cli.preview": [DEV, "--assembly", "OUT", "--template", "OUT/deployed.json"],
    "cli.deploy": [DEV, "--preview-only", "--template", "OUT/deployed.json", "--outdir", "OUT/cdk.out"],
    "cli.mirror_model": [DEV, "--repo", "Qwen/Qwen2.5-7B-Instruct", "--dry-run"],
    "verify": ["--config", DEV],
    "bench.run": ["--url", "http://127.0.0.1:9/v1"],
    "bench.compare": ["--pd-url", "http://127.0.0.1:9/v1", "--colocated-url", "http://127.0.0.1:9/v1"],
    "bench.ttft": ["--url", "http://127.0.0.1:9/v1"],
    "bench.next_turn": ["--url", "http://127.0.0.1:9/v1"],
    "bench.agent_tools": ["--url", "http://127.0.0.1:9/v1"],
    "bench.gpu.check": ["--out", "OUT/gpu-check"],
    "verify.efa": ["--script"],
    "mirror.job": ["--repo", "Qwen/Qwen2.5-7B-Instruct", "--bucket", "b", "--prefix", "p"],
    "cli.dashboards": [],
    "local.server": [],
}


def run(module: str, *args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "JSII_SILENCE_WARNING_END_OF_LIFE_NODE_VERSION": "20"}
    return subprocess.run(
        [sys.executable, "-m", module, *args],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


@pytest.fixture
def grafana_unchanged():
    """`python -m cli.dashboards` rewrites this file; --help and a bad flag must not."""
    before = GRAFANA_FILE.stat().st_mtime_ns
    yield
    assert GRAFANA_FILE.stat().st_mtime_ns == before


@pytest.mark.parametrize("module", sorted(COMMANDS))
def test_help_prints_the_usage_and_does_nothing(module, grafana_unchanged):
    result = run(module, "--help")
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("usage:"), result.stdout
    assert result.stderr == ""


@pytest.mark.parametrize("module", sorted(COMMANDS))
def test_an_unknown_flag_is_refused_in_one_line(module, tmp_path, grafana_unchanged):
    args = [arg.replace("OUT", str(tmp_path)) for arg in COMMANDS[module]]
    result = run(module, *args, "--bogus")
    assert result.returncode == 2, result.stderr
    assert result.stdout == ""
    lines = result.stderr.splitlines()
    assert len(lines) == 1, result.stderr
    assert "error: unrecognized arguments: --bogus" in lines[0]
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("module", ["cli.plan", "cli.kuberay_crds", "cli.mirror_model", "cli.deploy_guard"])
def test_help_is_not_read_as_a_config_path(module):
    result = run(module, "--help")
    assert result.returncode == 0
    assert "Config error" not in result.stderr
    assert "config" in result.stdout


def test_a_missing_argument_is_one_line_too():
    result = run("cli.summary", DEV)
    assert result.returncode == 2
    assert result.stdout == ""
    assert result.stderr.splitlines() == [
        "python -m cli.summary: error: the following arguments are required: outdir (try --help)"
    ]
