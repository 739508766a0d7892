"""KubeRay's rules, mirrored as data so that synth refuses what KubeRay's controller refuses.

KubeRay's Go cannot run here, so its rules are mirrored from ray-project/kuberay at the tag named
by :data:`MIRRORED_VERSION`; every rule cites the Go function it mirrors and keeps its message.

- :mod:`kuberay.apimachinery`: the name, label and quantity syntax KubeRay calls;
- :mod:`kuberay.rules`: the controller's validation of a RayService and the RayCluster it creates;
- :mod:`kuberay.oracle`: what KubeRay derives from a spec (the ``ray start`` resources of a group,
  the cluster-spec hash that decides a NewCluster upgrade), for tests to check the manifest against.

No CDK here: the construct and the tests call these on the manifest as data.
"""

from __future__ import annotations

# The KubeRay release these rules were read from. A config that installs another operator chart
# is still checked against these rules, and synth says so (``rules_version_note``).
MIRRORED_VERSION = "1.7.0"


class KubeRayRejection(ValueError):
    """KubeRay's controller would refuse the object; the message is KubeRay's own."""


def rules_version_note(operator_chart_version: str) -> str | None:
    """None when the operator the config installs is the release the rules mirror; else one line saying
    that the RayService was checked against another release's rules."""
    if operator_chart_version == MIRRORED_VERSION:
        return None
    return (
        f"charts.kuberay_operator is {operator_chart_version}, but the controller rules "
        f"checked at synth are KubeRay {MIRRORED_VERSION}'s (kuberay/rules.py): compare "
        f"ray-operator/controllers/ray/utils/validation.go at v{operator_chart_version} before you deploy"
    )
