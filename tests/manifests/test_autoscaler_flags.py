"""Every Cluster Autoscaler flag the stack passes is one the binary defines.

The autoscaler chart turns ``extraArgs`` into ``--key=value`` arguments (``templates/deployment.yaml``
at chart 9.59.0: ``--{{ $key | mustRegexFind "^[^_]+" }}={{ $value }}``; Helm renders them in
tests/consumers/test_helm.py), and the binary exits on a flag it does not define. The binary cannot
run here, so each key is checked against the flags its ``flags.go`` registers at the pinned release
(``tests/fixtures/charts``, the file naming its source).
"""

from __future__ import annotations

import json
import re

from config import versions
from consumers.template import helm_releases
from tests.conftest import ROOT

FLAGS = ROOT / "tests" / "fixtures" / "charts"


def autoscaler_flags(release: str) -> set[str]:
    """The flags of the autoscaler release (an image tag such as v1.36.1)."""
    return set(json.loads((FLAGS / f"cluster-autoscaler-{release.removeprefix('v')}.flags.json").read_text())["flags"])


def unknown_flags(extra_args: dict, flags: set[str]) -> list[str]:
    return [key for key in extra_args if re.match(r"^[^_]+", key).group(0) not in flags]


def test_every_autoscaler_argument_is_a_flag_of_the_pinned_release(synthesized):
    _, _, template, _, _ = synthesized("dev")
    (release,) = [r for r in helm_releases(template.to_json()) if r.chart == versions.CLUSTER_AUTOSCALER.chart]
    assert release.values["extraArgs"]
    assert unknown_flags(release.values["extraArgs"], autoscaler_flags(release.values["image"]["tag"])) == []


def test_a_misspelt_flag_is_caught():
    flags = autoscaler_flags(versions.CLUSTER_AUTOSCALER_RELEASES[versions.DEFAULT_KUBERNETES_VERSION])
    assert unknown_flags({"scale-down-unneded-time": "10m", "expander_2": "random"}, flags) == [
        "scale-down-unneded-time"
    ]
