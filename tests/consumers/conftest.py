"""The synthesized templates the real consumers read: every shipped config, and the variants that
add what the shipped ones lack (a gated model's token charts, the internal NLB and its controller,
the CloudWatch backend)."""

from __future__ import annotations

import functools
import json

import pytest
import yaml

from tests.conftest import CONFIG_DIR, SHIPPED_ENVIRONMENTS, synth_variant


def _dev() -> dict:
    return yaml.safe_load((CONFIG_DIR / "dev.yaml").read_text())


def _gated() -> dict:
    from tests.cdk_constructs.test_hf_token import gated_data

    return gated_data()


def _internal_nlb_with_cloudwatch() -> dict:
    data = _dev()
    data["ray_service"] = {"endpoint": {"internal_nlb": True, "allowed_cidrs": ["10.40.0.0/16"]}}
    data.setdefault("observability", {})["backend"] = "cloudwatch"
    return data


VARIANTS = {"gated": _gated, "internal-nlb-cloudwatch": _internal_nlb_with_cloudwatch}
TEMPLATES = [*SHIPPED_ENVIRONMENTS, *VARIANTS]


@pytest.fixture(scope="session")
def template_of(synthesized, tmp_path_factory):
    """(config, template as CloudFormation reads it) of a shipped config or a variant, once each."""
    cache: dict[str, tuple] = {}

    def get(name: str):
        if name not in cache:
            if name in VARIANTS:
                folder = tmp_path_factory.mktemp(f"consumers-{name}")
                stack, template = synth_variant(folder, VARIANTS[name](), name)
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
