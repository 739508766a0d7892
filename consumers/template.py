"""What a synthesized CloudFormation template hands the cluster: Helm releases and Kubernetes manifests.

Both are read from the template itself (the properties CDK's Helm and manifest custom resources
get), not from the Python that built them, so whatever reaches CloudFormation is what is checked.
Values that CloudFormation resolves at deploy time (a cluster name, a role ARN) become placeholders.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

HELM_CHART_TYPE = "Custom::AWSCDK-EKS-HelmChart"
MANIFEST_TYPE = "Custom::AWSCDK-EKS-KubernetesResource"
# Valid in every field it may land in: DNS labels, ARNs, annotations.
PLACEHOLDER = "resolved-at-deploy"


@dataclass(frozen=True)
class HelmRelease:
    logical_id: str
    chart: str
    version: str
    release: str
    namespace: str
    values: dict[str, Any]


def resolved(value: Any) -> Any:
    """``value`` with CloudFormation's intrinsic functions replaced: joins joined, the rest placeholders."""
    if isinstance(value, dict):
        if len(value) == 1:
            ((key, argument),) = value.items()
            if key == "Fn::Join":
                separator, parts = argument
                return separator.join(str(resolved(part)) for part in parts)
            if key == "Ref" or key.startswith("Fn::"):
                return PLACEHOLDER
        return {k: resolved(v) for k, v in value.items()}
    if isinstance(value, list):
        return [resolved(v) for v in value]
    return value


def helm_releases(template: dict) -> list[HelmRelease]:
    releases = []
    for logical_id, resource in template["Resources"].items():
        if resource["Type"] != HELM_CHART_TYPE:
            continue
        props = resource["Properties"]
        values_text = resolved(props.get("Values")) or "{}"
        releases.append(
            HelmRelease(
                logical_id=logical_id,
                chart=props["Chart"],
                version=props["Version"],
                release=props["Release"],
                namespace=props.get("Namespace", "default"),
                values=json.loads(values_text),
            )
        )
    return releases


def manifests(template: dict) -> list[tuple[str, dict]]:
    """(logical id, object) for every Kubernetes object the template applies."""
    found = []
    for logical_id, resource in template["Resources"].items():
        if resource["Type"] == MANIFEST_TYPE:
            for item in json.loads(resolved(resource["Properties"]["Manifest"])):
                found.append((logical_id, item))
    return found
