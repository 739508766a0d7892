"""Every value the stack gives a Helm chart is one the chart reads, and every Cluster Autoscaler
flag is one the binary defines.

Helm merges the given values into the chart's defaults and renders the templates, and a key that
no template reads is dropped without a word. So each path is followed through the chart's own
``values.yaml`` at the pinned version (``tests/fixtures/charts``, each file naming its source):
the path must exist there down to a point where the chart's default is not a non-empty map (a
scalar, a list or ``{}``: free-form content belongs there). The autoscaler chart turns
``extraArgs`` into ``--key=value`` arguments (``templates/deployment.yaml`` at chart 9.59.0:
``--{{ $key | mustRegexFind "^[^_]+" }}={{ $value }}``), and the binary exits on a flag it does not
define, so each key must be a flag of its ``flags.go`` at the pinned release.
"""

from __future__ import annotations

import json
import re

import pytest

from config import versions
from tests.conftest import ROOT, synth_variant

CHARTS = ROOT / "tests" / "fixtures" / "charts"
PINS = {
    "cluster-autoscaler": versions.CLUSTER_AUTOSCALER,
    "nvidia-device-plugin": versions.NVIDIA_DEVICE_PLUGIN,
    "kuberay-operator": versions.KUBERAY_OPERATOR,
    "secrets-store-csi-driver": versions.SECRETS_STORE_CSI_DRIVER,
    "secrets-store-csi-driver-provider-aws": versions.SECRETS_STORE_CSI_PROVIDER_AWS,
}
GATED_ONLY = {"secrets-store-csi-driver", "secrets-store-csi-driver-provider-aws"}


def chart_keys(chart: str) -> dict:
    return json.loads((CHARTS / f"{chart}-{PINS[chart].version}.keys.json").read_text())["keys"]


def autoscaler_flags(release: str) -> set[str]:
    """The flags of the autoscaler release (an image tag such as v1.36.1)."""
    return set(json.loads((CHARTS / f"cluster-autoscaler-{release.removeprefix('v')}.flags.json").read_text())["flags"])


def unread_paths(values: dict, keys: dict, prefix: str = "") -> list[str]:
    """The paths in ``values`` that the chart's defaults (``keys``) do not have."""
    unread = []
    for key, value in values.items():
        path = prefix + key
        if key not in keys:
            unread.append(path)
        elif isinstance(value, dict) and keys[key]:
            unread += unread_paths(value, keys[key], path + ".")
    return unread


def unknown_flags(extra_args: dict, flags: set[str]) -> list[str]:
    return [key for key in extra_args if re.match(r"^[^_]+", key).group(0) not in flags]


@pytest.fixture(scope="module")
def chart_values(synthesized, tmp_path_factory):
    """{chart: (version, values)} as the synthesized templates give them to Helm (dev, and a gated
    variant of dev for the token's charts)."""
    from tests.cdk_constructs.test_hf_token import gated_data

    _, _, dev, _, _ = synthesized("dev")
    _, gated = synth_variant(tmp_path_factory.mktemp("gated-charts"), gated_data(), "gated-charts")
    found = {}
    for template in (dev, gated):
        for resource in template.find_resources("Custom::AWSCDK-EKS-HelmChart").values():
            props = resource["Properties"]
            found[props["Chart"]] = (props["Version"], json.loads(props.get("Values") or "{}"))
    return found


@pytest.mark.parametrize("chart", sorted(PINS))
def test_every_value_is_one_the_pinned_chart_reads(chart_values, chart):
    version, values = chart_values[chart]
    assert version == PINS[chart].version, f"{chart} is pinned at {version}; add its keys file for that version"
    values = {k: v for k, v in values.items() if not (chart == "cluster-autoscaler" and k == "extraArgs")}
    assert values, f"no values for {chart}"
    assert unread_paths(values, chart_keys(chart)) == []


def test_every_autoscaler_argument_is_a_flag_of_the_pinned_release(chart_values):
    _, values = chart_values["cluster-autoscaler"]
    assert values["extraArgs"]
    assert unknown_flags(values["extraArgs"], autoscaler_flags(values["image"]["tag"])) == []


def test_a_misspelt_value_or_flag_is_caught():
    keys = chart_keys("cluster-autoscaler")
    assert unread_paths({"rbac": {"serviceAcount": {"create": False}}, "awsRegion": "us-east-2"}, keys) == [
        "rbac.serviceAcount"
    ]
    assert unread_paths({"nodeSelector": {"role": "system"}}, keys) == []  # {} by default: free-form
    flags = autoscaler_flags(versions.CLUSTER_AUTOSCALER_RELEASES[versions.DEFAULT_KUBERNETES_VERSION])
    assert unknown_flags({"scale-down-unneded-time": "10m", "expander_2": "random"}, flags) == [
        "scale-down-unneded-time"
    ]
