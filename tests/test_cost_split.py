"""The split by cost (pytest.ini's markers): a test that starts one of the programs that cost seconds
without the `consumer` marker fails at once, naming the marker (tests/conftest.py), so that
`make test-unit` stays the quick loop and such a test still runs in `make test-consumers`."""

from __future__ import annotations

import subprocess
import sys

import pytest

from tests.conftest import ROOT, consumer_program


@pytest.mark.parametrize(
    ("argv", "program"),
    [
        ([str(ROOT / "node_modules" / ".bin" / "cdk"), "diff", "pd-dev-pd-serving"], "the CDK CLI"),
        ([str(ROOT / ".venv-checkov" / "bin" / "checkov"), "-f", "t.json"], "checkov"),
        (["/tmp/tools/cfn-guard", "validate", "--rules", "r.guard"], "cfn-guard"),
        (["/tmp/tools/helm", "template", "chart.tgz"], "Helm"),
        ([sys.executable, "-m", "pip", "install", "--no-deps", "x"], "pip"),
        ([sys.executable, "-m", "venv", "/tmp/v"], "pip"),
        ([sys.executable, "app.py"], "app.py in a new interpreter"),
        ([sys.executable, "-c", "import runpy", "[]", str(ROOT / "app.py")], "app.py in a new interpreter"),
    ],
)
def test_the_programs_that_cost_seconds_are_recognised(argv, program):
    assert consumer_program(argv) == program


@pytest.mark.parametrize(
    "argv",
    [[sys.executable, "-m", "cli.plan", "--help"], ["bash", "-n", "bench/gpu/run.sh"], "kubectl", []],
    ids=["a-cli-module", "bash", "a-bare-string", "empty"],
)
def test_other_commands_are_left_alone(argv):
    assert consumer_program(argv) is None


def test_an_unmarked_test_that_starts_one_fails_naming_the_marker(tmp_path):
    helm = tmp_path / "helm"  # never created: the guard refuses before anything starts
    with pytest.raises(
        pytest.fail.Exception,
        match=r"test_cost_split\.py::test_an_unmarked_test_that_starts_one_fails_naming_the_marker runs Helm: "
        r"mark it @pytest\.mark\.consumer \(make test-unit leaves",
    ):
        subprocess.run([str(helm), "version"], check=False)


@pytest.mark.consumer
def test_a_marked_test_starts_it(tmp_path):
    helm = tmp_path / "helm"
    helm.write_text("#!/bin/sh\necho v3.20.0\n")
    helm.chmod(0o755)
    assert subprocess.run([str(helm), "version"], capture_output=True, text=True, check=True).stdout == "v3.20.0\n"
