"""Every Kubernetes object the project produces, checked strictly against the config's Kubernetes
version with Kubernetes' own OpenAPI schemas (``kubernetes-validate``): the charts' rendered output,
the manifests the template applies, and the mirror Job. Custom resources are checked against the
CRDs the stack installs (from the rendered charts), with the fields the API server would prune refused."""

from __future__ import annotations

import copy

import pytest

from consumers import charts
from consumers import kubernetes as k8s
from consumers.template import helm_releases, manifests
from tests.consumers.conftest import TEMPLATES, kube_version, render_release

# Seconds per test (the charts rendered by Helm, then Kubernetes' schemas):
# make test-unit leaves this file to make test-consumers and make test.
pytestmark = pytest.mark.consumer


def objects_of(config, template) -> list[tuple[str, dict]]:
    """(where it comes from, object) for everything the template puts on the cluster."""
    found = []
    for release in helm_releases(template):
        if release.chart in charts.CDK_CHOSEN_CHARTS:
            try:
                charts.chart_archive(release.chart, release.version)
            except charts.ChartNotCached:
                continue  # rendered, and skipped with its reason, in test_helm.py
        for item in charts.rendered_objects(render_release(release, config)):
            found.append((f"chart {release.chart} {release.version}", item))
    found += [(f"manifest {logical_id}", item) for logical_id, item in manifests(template)]
    return found


@pytest.fixture(scope="module")
def objects(template_of):
    cache: dict[str, tuple] = {}

    def get(name: str):
        if name not in cache:
            config, template = template_of(name)
            found = objects_of(config, template)
            cache[name] = (config, found, k8s.crd_schemas(item for _, item in found))
        return cache[name]

    return get


@pytest.mark.parametrize("name", TEMPLATES)
def test_every_object_is_valid_for_the_configs_kubernetes_version(objects, name):
    config, found, crds = objects(name)
    assert ("ray.io/v1", "RayService") in crds, "the KubeRay chart's CRDs were not rendered"
    kinds = {item["kind"] for _, item in found}
    assert {"RayService", "Deployment", "DaemonSet", "Namespace", "ServiceAccount", "ClusterRole"} <= kinds
    errors = [
        f"{source}: {error}" for source, item in found for error in k8s.object_errors(item, kube_version(config), crds)
    ]
    assert errors == []


def test_the_token_variant_checks_its_secret_provider_class_against_the_drivers_crd(objects):
    _, found, crds = objects("gated")
    assert ("secrets-store.csi.x-k8s.io/v1", "SecretProviderClass") in crds
    assert "SecretProviderClass" in {item["kind"] for _, item in found}


def test_the_mirror_jobs_objects_are_valid(objects):
    from config.loader import parse_config
    from manifests.mirror_job import manifests as mirror_manifests
    from tests.mirror.test_model_mirror import data

    config = parse_config(data("dev"))
    _, _, crds = objects("dev")
    for repo in ("Qwen/Qwen2.5-7B-Instruct",):
        for item in mirror_manifests(config, repo=repo, prefix="qwen2.5-7b-instruct"):
            assert k8s.object_errors(item, kube_version(config), crds) == []


def _first(found, kind):
    return copy.deepcopy(next(item for _, item in found if item["kind"] == kind))


def test_what_the_old_checks_let_through_is_refused(objects):
    """A wrong-typed field, an unknown field and a custom resource field the API server would prune."""
    config, found, crds = objects("dev")
    version = kube_version(config)

    deployment = _first(found, "Deployment")
    deployment["spec"]["replicas"] = "2"
    assert "'2' is not of type 'integer'" in " ".join(k8s.object_errors(deployment, version, crds))

    service = _first(found, "Service")
    service["spec"]["ports"][0]["targetPortt"] = 8080
    assert any("targetPortt" in error for error in k8s.object_errors(service, version, crds))

    ray_service = _first(found, "RayService")
    ray_service["spec"]["rayClusterConfig"]["headGroupSpec"]["rayStartParam"] = {}
    assert any("rayStartParam" in error for error in k8s.object_errors(ray_service, version, crds))

    unknown = {"apiVersion": "example.com/v1", "kind": "Widget", "metadata": {"name": "w"}}
    assert "no such kind" in k8s.object_errors(unknown, version, crds)[0]


def test_the_schemas_loaded_once_give_kubernetes_validates_own_answers(objects):
    """``consumers.kubernetes`` loads each schema once; kubernetes-validate's own call, per object, agrees."""
    import kubernetes_validate

    config, found, crds = objects("dev")
    version = kube_version(config)
    one_of_each = {item["kind"]: item for _, item in found if (item["apiVersion"], item["kind"]) not in crds}
    broken = _first(found, "Deployment")
    broken["spec"]["template"]["spec"]["containers"][0]["imagePullPolicyy"] = "Always"
    for item in [*one_of_each.values(), broken]:
        try:
            kubernetes_validate.validate(item, version, strict=True)
            expected_valid = True
        except kubernetes_validate.ValidationError:
            expected_valid = False
        assert (k8s.object_errors(item, version, crds) == []) == expected_valid, k8s.describe(item)
    assert not expected_valid


def test_a_list_in_helms_output_is_checked_as_its_items():
    """kind: List is no kind of the API (Helm's client flattens it); its items are what is applied."""
    text = """
apiVersion: v1
kind: List
items:
- apiVersion: networking.k8s.io/v1
  kind: IngressClass
  metadata: {name: alb}
  spec: {controller: ingress.k8s.aws/alb}
---
apiVersion: v1
kind: ConfigMap
metadata: {name: c}
"""
    objects = charts.rendered_objects(text)
    assert [o["kind"] for o in objects] == ["IngressClass", "ConfigMap"]
    assert all(k8s.object_errors(o, "1.36", {}) == [] for o in objects)
