"""What `make synth`, `make deploy` and `make plan` import is what their install step installs.

Those targets install only ``requirements.txt`` (the test venv has more). Each entry point runs
here in a child Python that refuses to import any module whose distribution is outside the
closure of ``requirements.txt`` (its pins and everything they require), so a missing runtime
dependency fails here as it would on a fresh clone.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from importlib import metadata

import pytest
from packaging.requirements import Requirement

from tests.conftest import CONFIG_DIR, ROOT

# Seconds per test (app.py and the commands behind make, each in a new interpreter held to
# requirements.txt):
# make test-unit leaves this file to make test-consumers and make test.
pytestmark = pytest.mark.consumer


def _name(text: str) -> str:
    return re.sub(r"[-_.]+", "-", text).lower()


def runtime_closure(requirements_file=ROOT / "requirements.txt") -> set[str]:
    """Distribution names that `pip install -r requirements.txt` brings in."""
    pending = [
        Requirement(line.split("#", 1)[0].strip())
        for line in requirements_file.read_text().splitlines()
        if line.split("#", 1)[0].strip() and not line.startswith("-")
    ]
    seen: set[str] = set()
    while pending:
        requirement = pending.pop()
        name = _name(requirement.name)
        if name in seen:
            continue
        seen.add(name)
        try:
            requires = metadata.requires(requirement.name) or []
        except metadata.PackageNotFoundError:
            continue
        for text in requires:
            child = Requirement(text)
            if child.marker is None or child.marker.evaluate({"extra": ""}):
                pending.append(child)
    return seen


GUARD = r"""
import importlib.abc, importlib.metadata as md, json, re, runpy, sys
allowed = set(json.loads(sys.argv[1]))
owners = md.packages_distributions()
class RuntimeOnly(importlib.abc.MetaPathFinder):
    def find_spec(self, fullname, path=None, target=None):
        top = fullname.partition(".")[0]
        dists = {re.sub(r"[-_.]+", "-", d).lower() for d in owners.get(top, [])}
        if dists and not dists & allowed:
            raise ModuleNotFoundError(
                f"No module named {top!r}: {', '.join(sorted(dists))} is not installed by requirements.txt", name=top)
        return None
sys.meta_path.insert(0, RuntimeOnly())
sys.path.insert(0, ".")
if sys.argv[2] == "-m":
    sys.argv = sys.argv[3:]
    runpy.run_module(sys.argv[0], run_name="__main__", alter_sys=True)
else:
    sys.argv = sys.argv[2:]
    runpy.run_path(sys.argv[0], run_name="__main__")
"""


def run_with_runtime_only(args: list[str], **env) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-c", GUARD, json.dumps(sorted(runtime_closure())), *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "JSII_SILENCE_WARNING_END_OF_LIFE_NODE_VERSION": "20", **env},
    )


def test_the_guard_refuses_a_test_only_package():
    result = run_with_runtime_only(["-m", "pytest", "--version"])
    assert "No module named 'pytest': pytest is not installed by requirements.txt" in result.stderr


def test_synth_and_its_summary_import_only_runtime_requirements(tmp_path):
    """`make synth` runs app.py (through the CDK CLI) and cli.summary with requirements.txt only."""
    out = tmp_path / "out"
    result = run_with_runtime_only(
        ["app.py"], CDK_CONTEXT_JSON=json.dumps({"config": str(CONFIG_DIR / "dev.yaml")}), CDK_OUTDIR=str(out)
    )
    assert result.returncode == 0, result.stderr[-3000:]
    summary = run_with_runtime_only(["-m", "cli.summary", str(CONFIG_DIR / "dev.yaml"), str(out)])
    assert summary.returncode == 0, summary.stderr[-3000:]
    assert "Synthesized pd-dev" in summary.stdout


def test_plan_imports_only_runtime_requirements():
    result = run_with_runtime_only(["-m", "cli.plan", str(CONFIG_DIR / "dev.yaml")])
    assert result.returncode == 0, result.stderr[-3000:]


def test_deploy_guard_imports_only_runtime_requirements():
    result = run_with_runtime_only(["-m", "cli.deploy_guard", "--help"])
    assert result.returncode == 0, result.stderr[-3000:]
