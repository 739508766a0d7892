"""cli is the top of the tools: no package of the project imports it, and `make check` keeps it so.

The packages are import-linter's own ``root_packages`` in pyproject.toml, and the graph is grimp's,
the library import-linter checks its contracts on, so a package added later is covered as well.
"""

from __future__ import annotations

import tomllib

import grimp
import pytest

from tests.conftest import ROOT

IMPORTLINTER = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["importlinter"]
PACKAGES = IMPORTLINTER["root_packages"]
TOP = "cli"
BELOW_TOP = [package for package in PACKAGES if package != TOP]


@pytest.fixture(scope="module")
def graph():
    return grimp.build_graph(*PACKAGES, cache_dir=None)


def test_the_top_package_is_one_of_the_graphed():
    assert TOP in PACKAGES


@pytest.mark.parametrize("package", BELOW_TOP)
def test_no_package_imports_the_commands_at_the_top(graph, package):
    chains = graph.find_shortest_chains(importer=package, imported=TOP, as_packages=True)
    assert not chains, f"{package} imports {TOP}: " + "; ".join(" -> ".join(chain) for chain in sorted(chains))


@pytest.mark.parametrize("package", BELOW_TOP)
def test_a_contract_make_check_runs_forbids_it(package):
    forbidding = [
        contract["name"]
        for contract in IMPORTLINTER["contracts"]
        if contract["type"] == "forbidden"
        and package in contract["source_modules"]
        and TOP in contract["forbidden_modules"]
    ]
    assert forbidding, f"no import-linter contract forbids {package} to import {TOP}"
