"""The synthesized templates the real consumers read: every shipped config, and the variants that
add what the shipped ones lack (see VARIANTS)."""

from __future__ import annotations

import functools
import json

import pytest

from tests.conftest import SHIPPED_ENVIRONMENTS


def _variants() -> dict[str, dict]:
    """The same variants, by the same names, as the policy checks (tests/stacks/test_template_policies.py)
    build: each is synthesized once for both."""
    from tests.manifests.test_ray_service import streaming_data
    from tests.stacks.test_template_policies import _variants as policy_variants

    return {
        **{name: data for name, data in policy_variants().items() if name in VARIANTS},
        "streaming": streaming_data(),
    }


# The token's charts and SecretProviderClass; the load balancer controller and the NLB Service; the
# CloudWatch add-on; the mirror's service account; the streamer's init containers.
VARIANTS = ("gated", "internal-nlb", "cloudwatch", "mirror-dev", "streaming")
TEMPLATES = [*SHIPPED_ENVIRONMENTS, *VARIANTS]


@pytest.fixture(scope="session")
def template_of(synthesized, variant):
    """(config, template as CloudFormation reads it) of a shipped config or a variant, once each."""
    cache: dict[str, tuple] = {}

    def get(name: str):
        if name not in cache:
            if name in VARIANTS:
                stack, template, _ = variant(name, _variants()[name])
                config = stack.config
            else:
                config, _, template, _, _ = synthesized(name)
            cache[name] = (config, json.loads(json.dumps(template.to_json())))
        return cache[name]

    return get


def kube_version(config) -> str:
    return config.cluster.kubernetes_version


def render_release(release, config) -> str:
    """One Helm release of a template, rendered by the real Helm from the cached chart."""
    from consumers import charts

    if release.chart in charts.CDK_CHOSEN_CHARTS:
        # The copy of the charts CI reads was packaged for this project's own pins; `make charts` pulls this one.
        try:
            archive = charts.chart_archive(release.chart, release.version)
        except charts.ChartNotCached as missing:
            pytest.skip(f"{missing} (a chart aws-cdk-lib pins, not this project)")
    else:
        assert release.chart in charts.PINNED_CHARTS, f"{release.chart} is installed but pinned nowhere"
        archive = charts.chart_archive(release.chart, release.version)
    return _render(archive, release.release, release.namespace, json.dumps(release.values), kube_version(config))


@functools.cache
def _render(archive, release: str, namespace: str, values: str, kube: str) -> str:
    """Rendered once per session: the Helm test and the schema test read the same output."""
    from consumers import charts

    return charts.render(archive, release=release, namespace=namespace, values=json.loads(values), kube_version=kube)
