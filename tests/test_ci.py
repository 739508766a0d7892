"""CI does what a newcomer does: `.ci/run` runs the make targets the README names and sets up
nothing itself; what the tests need beyond the README's requirements, `make test` gets (Redis for
the fault-tolerant live server among them) or says in one line how to get."""

from __future__ import annotations

import os
import re
import shutil
import subprocess

from tests.conftest import ROOT

MAKE = shutil.which("make")


def readme_make_targets() -> set[str]:
    return set(re.findall(r"`make ([a-z][\w-]*)", (ROOT / "README.md").read_text()))


def test_ci_runs_only_make_targets_the_readme_names():
    commands = [
        line.strip()
        for line in (ROOT / ".ci" / "run").read_text().splitlines()
        if line.strip() and not line.lstrip().startswith("#")
    ]
    setup = re.compile(r"(set -[euxo pipefail]+|cd .+|export [A-Z_]+=.*)$")
    others = [command for command in commands if not setup.match(command)]
    assert others and all(re.fullmatch(r"make [a-z][\w-]*", command) for command in others), others
    assert {command.split()[1] for command in others} <= readme_make_targets()


def run_make(target: str, path: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [MAKE, "--no-print-directory", "-s", target],
        cwd=ROOT,
        env={**os.environ, "PATH": path},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def test_make_test_gets_redis_itself():
    dry_run = subprocess.run(
        [MAKE, "--no-print-directory", "-n", "test-deps"], cwd=ROOT, capture_output=True, text=True, timeout=120
    )
    assert "apt-get install" in dry_run.stdout and "redis-server" in dry_run.stdout, dry_run.stdout[-2000:]


def test_without_redis_and_without_root_one_line_says_what_to_run(tmp_path):
    """A PATH with no redis-server and no apt-get, and an `id` that answers a user's id."""
    (tmp_path / "id").write_text("#!/bin/sh\necho 1000\n")
    (tmp_path / "id").chmod(0o755)
    refused = run_make("redis-server", str(tmp_path))
    assert refused.returncode == 2
    assert refused.stdout.strip().count("\n") == 0 and "sudo apt-get install redis-server" in refused.stdout


def test_with_redis_on_the_path_nothing_is_installed(tmp_path):
    (tmp_path / "redis-server").write_text("#!/bin/sh\nexit 0\n")
    (tmp_path / "redis-server").chmod(0o755)
    present = run_make("redis-server", str(tmp_path))
    assert (present.returncode, present.stdout, present.stderr) == (0, "", "")
