"""`make charts` fills the chart cache with `helm pull`, from a Helm repository served on loopback
here (the pinned repositories are not reachable from the tests), and says in one line what it cannot fetch."""

from __future__ import annotations

import functools
import http.server
import shutil
import subprocess
import sys

import pytest

from cli import charts as make_charts
from config.versions import HelmChartPin
from consumers import binaries, charts
from tests.conftest import ROOT, loopback_http_server

# Seconds per test (helm pull and helm repo index):
# make test-unit leaves this file to make test-consumers and make test.
pytestmark = pytest.mark.consumer


@pytest.fixture
def loopback_repository(tmp_path):
    """A Helm chart repository on 127.0.0.1 holding the cached KubeRay chart, indexed by Helm itself."""
    served = tmp_path / "repository"
    served.mkdir()
    shutil.copy(charts.chart_archive("kuberay-operator", "1.7.0"), served)
    subprocess.run([str(binaries.helm()), "repo", "index", str(served)], check=True, timeout=60)
    with loopback_http_server(functools.partial(http.server.SimpleHTTPRequestHandler, directory=str(served))) as url:
        yield url


def test_make_charts_pulls_a_missing_chart_with_helm(loopback_repository, tmp_path, monkeypatch):
    cache = tmp_path / "cache"
    pin = HelmChartPin(chart="kuberay-operator", repository=loopback_repository, version="1.7.0")
    monkeypatch.setattr(charts, "PINNED_CHARTS", {pin.chart: pin})
    monkeypatch.setattr(charts, "CDK_CHOSEN_CHARTS", {"ignored-unless-asked": pin})
    assert make_charts.main(["--check", "--cache", str(cache)]) == 1
    assert make_charts.main(["--cache", str(cache)]) == 0
    assert charts.chart_archive("kuberay-operator", "1.7.0", cache).read_bytes() == (
        charts.chart_archive("kuberay-operator", "1.7.0").read_bytes()
    )
    assert make_charts.main(["--check", "--cache", str(cache)]) == 0


def test_a_repository_that_cannot_be_reached_is_one_line(tmp_path):
    pin = HelmChartPin(chart="kuberay-operator", repository="http://127.0.0.1:9", version="1.7.0")
    with pytest.raises(charts.ChartRenderError) as failed:
        charts.pull(pin, pin.version, tmp_path)
    assert "\n" not in str(failed.value) and "helm pull kuberay-operator 1.7.0 from http://127.0.0.1:9" in str(
        failed.value
    )


def test_an_unreachable_repository_ends_with_how_to_point_the_cache_at_the_charts(tmp_path, monkeypatch, capsys):
    pin = HelmChartPin(chart="kuberay-operator", repository="http://127.0.0.1:9", version="1.7.0")
    monkeypatch.setattr(charts, "PINNED_CHARTS", {pin.chart: pin})
    assert make_charts.main(["--cache", str(tmp_path)]) == 1
    lines = capsys.readouterr().err.strip().splitlines()
    assert lines[0].startswith("helm pull kuberay-operator 1.7.0 from http://127.0.0.1:9 failed: ")
    assert lines[-1] == (
        f"1 chart(s) are not in the chart cache {tmp_path} and could not be pulled: run where the chart "
        "repositories are reachable, or set CHART_CACHE to a folder that holds kuberay-operator-1.7.0.tgz"
    )


def test_check_names_every_missing_chart_and_how_to_fetch_it(tmp_path):
    result = subprocess.run(
        [sys.executable, "-m", "cli.charts", "--check", "--with-cdk-chosen", "--cache", str(tmp_path)],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=60,
    )
    assert result.returncode == 1
    lines = result.stderr.strip().splitlines()
    assert len(lines) == len(charts.PINNED_CHARTS) + len(charts.CDK_CHOSEN_CHARTS)
    assert all("make charts" in line for line in lines)
    assert any("aws-efa-k8s-device-plugin v0.5.30" in line for line in lines)
