"""The pinned Helm charts: where they are cached, how they are fetched, and Helm's own rendering.

Charts are read from a cache folder, never vendored: ``$CHART_CACHE`` (``make`` sets
``.cache/charts`` unless told otherwise; CI points it at a copy of the charts), filled by
``make charts`` with ``helm pull`` where the chart repositories are reachable. The file of a chart
is ``<chart>-<version>.tgz``, as ``helm pull`` names it.
"""

from __future__ import annotations

import json
import os
import subprocess
import tempfile
from pathlib import Path
from typing import Any

from config import versions
from consumers.binaries import ROOT, helm

CHART_CACHE_VARIABLE = "CHART_CACHE"
DEFAULT_CHART_CACHE = ROOT / ".cache" / "charts"
# Every chart the stack can install, by chart name.
PINNED_CHARTS: dict[str, versions.HelmChartPin] = {
    pin.chart: pin
    for pin in (
        versions.NVIDIA_DEVICE_PLUGIN,
        versions.EFA_DEVICE_PLUGIN,
        versions.KUBERAY_OPERATOR,
        versions.CLUSTER_AUTOSCALER,
        versions.SECRETS_STORE_CSI_DRIVER,
        versions.SECRETS_STORE_CSI_PROVIDER_AWS,
    )
}
# Charts aws-cdk-lib's own constructs choose, at the version they choose for this project's pins.
CDK_CHOSEN_CHARTS: dict[str, versions.HelmChartPin] = {
    versions.AWS_LOAD_BALANCER_CONTROLLER_CHART.chart: versions.AWS_LOAD_BALANCER_CONTROLLER_CHART,
}


class ChartNotCached(RuntimeError):
    """A pinned chart is not in the chart cache."""


class ChartRenderError(RuntimeError):
    """Helm could not render a chart with the values given."""


def chart_cache() -> Path:
    configured = os.environ.get(CHART_CACHE_VARIABLE)
    if not configured:
        return DEFAULT_CHART_CACHE
    path = Path(configured)
    return path if path.is_absolute() else ROOT / path


def archive_name(chart: str, version: str) -> str:
    return f"{chart}-{version}.tgz"


def chart_archive(chart: str, version: str, cache: Path | None = None) -> Path:
    """The packaged chart in the cache, or one line naming the chart, the version and how to fetch it."""
    cache = cache or chart_cache()
    path = cache / archive_name(chart, version)
    if not path.is_file():
        raise ChartNotCached(
            f"chart {chart} {version} is not in the chart cache {cache}: run `make charts` where the chart "
            f"repositories are reachable, or set {CHART_CACHE_VARIABLE} to a folder that holds "
            f"{archive_name(chart, version)}"
        )
    return path


def pull(pin: versions.HelmChartPin, version: str, cache: Path) -> Path:
    """``helm pull`` one chart into the cache (the same archive CloudFormation's Helm fetches at deploy)."""
    cache.mkdir(parents=True, exist_ok=True)
    result = subprocess.run(
        [str(helm()), "pull", pin.chart, "--repo", pin.repository, "--version", version, "--destination", str(cache)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    if result.returncode != 0:
        reason = (result.stderr.strip().splitlines() or ["no output"])[-1]
        raise ChartRenderError(f"helm pull {pin.chart} {version} from {pin.repository} failed: {reason}")
    return chart_archive(pin.chart, version, cache)


def render(
    archive: Path,
    *,
    release: str,
    namespace: str,
    values: dict[str, Any],
    kube_version: str,
) -> str:
    """The chart's objects as ``helm template`` renders them for that Kubernetes version, CRDs included."""
    with tempfile.NamedTemporaryFile("w", suffix=".json", prefix="values-") as values_file:
        json.dump(values, values_file)
        values_file.flush()
        command = [
            str(helm()),
            "template",
            release,
            str(archive),
            "--namespace",
            namespace,
            "--kube-version",
            kube_version,
            "--include-crds",
            "--values",
            values_file.name,
        ]
        result = subprocess.run(command, capture_output=True, text=True, timeout=120)
    if result.returncode != 0:
        raise ChartRenderError(f"helm template {archive.name}: {result.stderr.strip()}")
    return result.stdout


Path_ = tuple[str | int, ...]


def leaf_paths(values: Any, prefix: Path_ = ()) -> list[Path_]:
    """Every value the caller sets: scalars, and maps or lists left empty on purpose."""
    if isinstance(values, dict) and values:
        return [path for key, child in values.items() for path in leaf_paths(child, (*prefix, key))]
    if isinstance(values, list) and values:
        return [path for index, child in enumerate(values) for path in leaf_paths(child, (*prefix, index))]
    return [prefix]


def sentinel_for(value: Any) -> Any:
    """A value of the same kind that no chart would render the same way."""
    if isinstance(value, bool):
        return not value
    if isinstance(value, int | float):
        return value + 7919
    if isinstance(value, str):
        return f"{value}-sentinel"
    if isinstance(value, dict):
        return {"sentinel": "sentinel"}
    if isinstance(value, list):
        return ["sentinel"]
    return "sentinel"


def with_value(values: Any, path: Path_, new: Any) -> Any:
    copied = json.loads(json.dumps(values))
    target = copied
    for part in path[:-1]:
        target = target[part]
    target[path[-1]] = new
    return copied


def unread_values(
    archive: Path, *, release: str, namespace: str, values: dict[str, Any], kube_version: str
) -> list[str]:
    """The values no template reads: changing one to a sentinel leaves the rendered output as it was.

    Helm merges given values into the chart's defaults and drops a key no template reads without a
    word, so a misspelt key, or one a chart release stopped reading, is found only this way. A value
    whose sentinel makes the chart refuse to render is read (a template checked it).
    """

    def render_with(given: dict[str, Any]) -> str:
        return render(archive, release=release, namespace=namespace, values=given, kube_version=kube_version)

    baseline = render_with(values)
    if render_with(values) != baseline:
        raise ChartRenderError(f"{archive.name} renders differently each time; its values cannot be checked this way")
    unread = []
    for path in leaf_paths(values):
        if not path:
            continue
        current: Any = values
        for part in path:
            current = current[part]
        try:
            changed = render_with(with_value(values, path, sentinel_for(current)))
        except ChartRenderError:
            continue
        if changed == baseline:
            unread.append(".".join(str(part) for part in path))
    return unread


def rendered_objects(text: str) -> list[dict[str, Any]]:
    """The objects in Helm's output as the API server receives them (libyaml's parser: KubeRay's CRDs
    alone are megabytes of YAML). A ``v1`` ``List`` is no kind of the API: Helm's client flattens it
    into its items (the load balancer controller's chart renders its IngressClass objects so)."""
    import yaml

    loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
    found: list[dict[str, Any]] = []
    for item in yaml.load_all(text, Loader=loader):
        if not item:
            continue
        if item.get("kind") == "List" and item.get("apiVersion") == "v1":
            found += [child for child in item.get("items") or [] if child]
        else:
            found.append(item)
    return found
