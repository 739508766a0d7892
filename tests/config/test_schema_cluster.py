"""config/schema/cluster.py: endpoint access, node groups, Kubernetes versions and chart versions."""

from __future__ import annotations

import datetime as dt

import pytest

from config import versions
from tests.config.helpers import problems_for


def test_instance_type_without_efa(dev_data):
    dev_data["cluster"]["gpu_node_groups"]["decode"]["instance_type"] = "g6.xlarge"
    message = problems_for(dev_data)
    assert "cluster.gpu_node_groups.decode.instance_type: g6.xlarge does not support EFA" in message
    assert "g6.8xlarge" in message


def test_unknown_instance_type(dev_data):
    dev_data["cluster"]["gpu_node_groups"]["prefill"]["instance_type"] = "x9.huge"
    message = problems_for(dev_data)
    assert "cluster.gpu_node_groups.prefill.instance_type: 'x9.huge' is not in the instance table" in message


def test_cpu_instance_type_for_gpu_group(dev_data):
    dev_data["cluster"]["gpu_node_groups"]["prefill"]["instance_type"] = "m7i.xlarge"
    assert "m7i.xlarge has no GPU" in problems_for(dev_data)


@pytest.mark.parametrize("version", ["1.30", "1.31"])
def test_kubernetes_version_eks_no_longer_creates(dev_data, version):
    dev_data["cluster"]["kubernetes_version"] = version
    message = problems_for(dev_data)
    assert f"EKS no longer creates Kubernetes {version} clusters" in message
    assert "use 1.36" in message


def test_kubernetes_version_without_installed_layer(dev_data):
    release = versions.KUBERNETES_RELEASES["1.34"]
    assert release.end_of_extended_support > dt.date.today()
    dev_data["cluster"]["kubernetes_version"] = "1.34"
    message = problems_for(dev_data)
    assert "needs the kubectl layer package aws-cdk.lambda-layer-kubectl-v34" in message


def test_unknown_kubernetes_version(dev_data):
    dev_data["cluster"]["kubernetes_version"] = "1.99"
    assert "Kubernetes 1.99 is unknown" in problems_for(dev_data)


@pytest.mark.parametrize(
    "sizes",
    [(2, 1, 3), (1, 3, 2), (3, 2, 1)],
    ids=["min>desired", "desired>max", "min>desired>max"],
)
def test_node_group_sizes_out_of_order(dev_data, sizes):
    group = dev_data["cluster"]["gpu_node_groups"]["prefill"]
    group["min_size"], group["desired_size"], group["max_size"] = sizes
    message = problems_for(dev_data)
    assert "cluster.gpu_node_groups.prefill: sizes must satisfy min_size <= desired_size <= max_size" in message


def test_public_endpoint_needs_cidrs(dev_data):
    dev_data["cluster"]["endpoint"].update(public_cidrs=[], allow_deployer_address=False)
    message = problems_for(dev_data)
    assert "cluster.endpoint: public is true but public_cidrs is empty" in message
    assert "set allow_deployer_address: true" in message


def test_root_volume_too_small_for_serving_image(dev_data):
    dev_data["cluster"]["gpu_node_groups"]["decode"]["root_volume_gib"] = 50
    message = problems_for(dev_data)
    assert "cluster.gpu_node_groups.decode.root_volume_gib" in message
    assert "greater than or equal to 200" in message


def test_system_root_volume_too_small_for_the_head_image(dev_data):
    dev_data["cluster"]["system_node_group"]["root_volume_gib"] = 50
    message = problems_for(dev_data)
    assert (
        "cluster.system_node_group.root_volume_gib: root_volume_gib=50 leaves no room for the serving image" in message
    )
    assert "use at least 100" in message


def test_gp3_throughput_needs_its_iops(dev_data):
    dev_data["cluster"]["gpu_node_groups"]["prefill"].update(root_volume_throughput_mibps=1000, root_volume_iops=3000)
    message = problems_for(dev_data)
    assert (
        "cluster.gpu_node_groups.prefill: root_volume_throughput_mibps=1000 needs at least 4000 root_volume_iops"
        in message
    )


def test_endpoint_reachable_somewhere(dev_data):
    dev_data["cluster"]["endpoint"].update(public=False, private=False)
    assert problems_for(dev_data) == (
        "test.yaml: cluster.endpoint: public and private are both false: the API would be unreachable"
    )


def test_public_only_endpoint_is_refused(dev_data):
    # aws_eks_v2 would crash at synth (CannotRestricPublicAccessEndpoint): the nodes need the private one.
    dev_data["cluster"]["endpoint"].update(public=True, private=False)
    assert problems_for(dev_data) == (
        "test.yaml: cluster.endpoint: public is true but private is false: the nodes could not reach an API "
        "restricted to public_cidrs; set private: true"
    )


def test_addon_version_form(dev_data):
    dev_data["cluster"]["addon_versions"] = {"kube-proxy": "1.2"}
    assert problems_for(dev_data) == (
        "test.yaml: cluster.addon_versions: kube-proxy: '1.2' is not an EKS add-on version such as "
        "v1.35.3-eksbuild.2; list them with `aws eks describe-addon-versions --addon-name kube-proxy`"
    )


# Chart versions ----------------------------------------------------------------------------------

CHART_DESCRIPTIONS = {
    "nvidia_device_plugin": "Chart version of NVIDIA's device plugin.",
    "efa_device_plugin": "Chart version of the AWS EFA device plugin.",
    "kuberay_operator": (
        "Chart version of the KubeRay operator (its CRDs must match the RayService; Helm does not "
        "upgrade CRDs, `make upgrade-crds` does)."
    ),
    "secrets_store_csi_driver": (
        "Chart version of the Secrets Store CSI driver (installed only for a gated model's token)."
    ),
    "secrets_store_csi_provider_aws": (
        "Chart version of AWS's Secrets Store CSI provider (installed only for a gated model's token)."
    ),
    "cluster_autoscaler": (
        "Chart version of Cluster Autoscaler; the autoscaler release itself follows "
        "cluster.kubernetes_version (config/versions.py)."
    ),
}


def test_chart_versions_default_to_the_pins_with_their_descriptions():
    from config.schema import ChartVersions

    pins = {name: getattr(versions, name.upper()) for name in CHART_DESCRIPTIONS}
    assert list(ChartVersions.model_fields) == list(CHART_DESCRIPTIONS)
    for name, field in ChartVersions.model_fields.items():
        assert (field.description, field.default) == (CHART_DESCRIPTIONS[name], pins[name].version), name
    schema = ChartVersions.model_json_schema()["properties"]
    assert {name: prop["description"] for name, prop in schema.items()} == CHART_DESCRIPTIONS
    assert {name: prop["default"] for name, prop in schema.items()} == {n: p.version for n, p in pins.items()}


def test_chart_version_can_be_set(dev_data):
    from config.loader import parse_config

    dev_data["charts"] = {"kuberay_operator": "1.6.0"}
    charts = parse_config(dev_data).charts
    assert charts.kuberay_operator == "1.6.0"
    assert charts.cluster_autoscaler == versions.CLUSTER_AUTOSCALER.version
