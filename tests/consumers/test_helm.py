"""Every chart the stack installs, rendered by the real Helm (the one the deploy runs, from the pinned
kubectl layer package) at its pinned version, with the values the synthesized template carries and
the config's Kubernetes version; and every value the stack sets is one a template reads."""

from __future__ import annotations

import subprocess

import pytest

from config import versions
from consumers import binaries, charts
from consumers.template import helm_releases
from tests.consumers.conftest import TEMPLATES, kube_version, render_release

# Seconds per test (every chart rendered by Helm):
# make test-unit leaves this file to make test-consumers and make test.
pytestmark = pytest.mark.consumer


def test_helm_is_the_one_the_kubectl_layer_ships():
    out = subprocess.run([str(binaries.helm()), "version", "--short"], capture_output=True, text=True, check=True)
    assert out.stdout.startswith("v4."), out.stdout


@pytest.mark.parametrize("name", TEMPLATES)
def test_every_chart_renders_with_the_templates_values(template_of, name):
    config, template = template_of(name)
    releases = helm_releases(template)
    assert {"kuberay-operator", "nvidia-device-plugin", "aws-efa-k8s-device-plugin", "cluster-autoscaler"} <= {
        r.chart for r in releases
    }
    for release in releases:
        if release.chart in charts.CDK_CHOSEN_CHARTS:
            continue  # rendered in its own test: the shared chart copy may not hold it
        objects = charts.rendered_objects(render_release(release, config))
        assert objects, f"{release.chart} rendered nothing"


def test_the_load_balancer_controller_chart_renders(template_of):
    config, template = template_of("internal-nlb")
    (release,) = [r for r in helm_releases(template) if r.chart == versions.AWS_LOAD_BALANCER_CONTROLLER_CHART.chart]
    assert release.version == versions.AWS_LOAD_BALANCER_CONTROLLER_CHART.version, "aws-cdk-lib moved the chart"
    assert charts.rendered_objects(render_release(release, config))


def _releases_of_every_chart(template_of):
    """The releases of dev and the gated variant: between them, every chart the project pins."""
    found = {}
    for name in ("dev", "gated"):
        config, template = template_of(name)
        for release in helm_releases(template):
            found[release.chart] = (config, release)
    return found


@pytest.mark.parametrize("chart", sorted(charts.PINNED_CHARTS))
def test_every_value_the_stack_sets_is_read_by_a_template(template_of, chart):
    config, release = _releases_of_every_chart(template_of)[chart]
    assert release.version == charts.PINNED_CHARTS[chart].version
    if not release.values:
        pytest.skip(f"the stack sets no values for {chart}")
    unread = charts.unread_values(
        charts.chart_archive(chart, release.version),
        release=release.release,
        namespace=release.namespace,
        values=release.values,
        kube_version=kube_version(config),
    )
    assert unread == [], f"{chart} {release.version} reads none of these values: {unread}"


def test_a_misspelt_value_is_caught(template_of):
    """What a key-tree fixture misses when its tree is stale, and what Helm drops without a word."""
    config, release = _releases_of_every_chart(template_of)["cluster-autoscaler"]
    values = {**release.values, "rbac": {**release.values.get("rbac", {}), "serviceAcount": {"create": False}}}
    unread = charts.unread_values(
        charts.chart_archive(release.chart, release.version),
        release=release.release,
        namespace=release.namespace,
        values=values,
        kube_version=kube_version(config),
    )
    assert unread == ["rbac.serviceAcount.create"]


def test_a_chart_missing_from_the_cache_fails_in_one_line_naming_it_and_how_to_fetch_it(tmp_path, monkeypatch):
    monkeypatch.setenv(charts.CHART_CACHE_VARIABLE, str(tmp_path))
    with pytest.raises(charts.ChartNotCached) as missing:
        charts.chart_archive("kuberay-operator", "1.7.0")
    message = str(missing.value)
    assert "\n" not in message
    assert "kuberay-operator 1.7.0" in message and "make charts" in message and "CHART_CACHE" in message


def test_every_pin_is_in_the_chart_cache():
    """A pin no chart repository has fails the deploy and rolls the stack back; the cache is filled
    from the repositories (make charts) or from a copy packaged at the release tags."""
    missing = []
    for pin in charts.PINNED_CHARTS.values():
        try:
            charts.chart_archive(pin.chart, pin.version)
        except charts.ChartNotCached as error:
            missing.append(str(error))
    assert missing == []
