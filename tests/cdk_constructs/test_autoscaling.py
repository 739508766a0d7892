"""Capacity follows demand: Cluster Autoscaler, scale from zero, room for upgrades, what scaling costs."""

from __future__ import annotations

import json

import pytest
import yaml
from aws_cdk.assertions import Match

from config import versions
from config.loader import load_config, parse_config
from planner import render_text
from planner.from_config import plan_config
from tests.conftest import CONFIG_DIR, SHIPPED_ENVIRONMENTS, rendered_ray_service, synth_variant


def chart(template, name: str) -> dict:
    (found,) = [
        r for r in template.find_resources("Custom::AWSCDK-EKS-HelmChart").values() if r["Properties"]["Chart"] == name
    ]
    return found


@pytest.mark.parametrize("env", SHIPPED_ENVIRONMENTS)
def test_cluster_autoscaler_chart_is_pinned_and_matches_the_kubernetes_minor(synthesized, env):
    config, _, template, _, _ = synthesized(env)
    props = chart(template, "cluster-autoscaler")["Properties"]
    assert props["Version"] == versions.CLUSTER_AUTOSCALER.version == "9.59.0"
    assert props["Repository"] == "https://kubernetes.github.io/autoscaler"
    assert props["Namespace"] == "kube-system"
    values = json.loads(props["Values"])
    assert values["image"] == {
        "repository": "registry.k8s.io/autoscaling/cluster-autoscaler",
        "tag": versions.CLUSTER_AUTOSCALER_RELEASES[config.cluster.kubernetes_version],
    }
    assert values["image"]["tag"] == "v1.36.1"
    assert values["autoDiscovery"] == {"clusterName": config.cluster_name}
    assert values["awsRegion"] == config.aws.region
    assert values["nodeSelector"] == {"role": "system"}
    assert values["rbac"]["serviceAccount"] == {"create": False, "name": "cluster-autoscaler"}
    args = values["extraArgs"]
    assert args["balance-similar-node-groups"] == "false"
    assert args["scale-down-unneeded-time"] == f"{config.cluster.autoscaling.scale_down_idle_minutes}m"


def test_every_accepted_kubernetes_version_has_an_autoscaler_release():
    for version, release in versions.KUBERNETES_RELEASES.items():
        if release.end_of_extended_support is None or version >= "1.32":
            assert versions.CLUSTER_AUTOSCALER_RELEASES[version].startswith(f"v{version}.")


def test_autoscaler_gets_its_aws_access_through_pod_identity_scoped_to_this_cluster(synthesized):
    config, _, template, _, _ = synthesized("dev")
    template.has_resource_properties(
        "AWS::EKS::PodIdentityAssociation", {"Namespace": "kube-system", "ServiceAccount": "cluster-autoscaler"}
    )
    policies = [
        p["Properties"]["PolicyDocument"]["Statement"]
        for k, p in template.find_resources("AWS::IAM::Policy").items()
        if "ClusterAutoscaler" in k
    ]
    (statements,) = policies
    by_action = {tuple(sorted(s["Action"] if isinstance(s["Action"], list) else [s["Action"]])): s for s in statements}
    scaling = by_action[("autoscaling:SetDesiredCapacity", "autoscaling:TerminateInstanceInAutoScalingGroup")]
    assert scaling["Condition"] == {"StringEquals": {"aws:ResourceTag/eks:cluster-name": config.cluster_name}}
    assert "autoScalingGroupName/eks-*" in json.dumps(scaling["Resource"])
    describe_nodegroup = by_action[("eks:DescribeNodegroup",)]
    assert f"nodegroup/{config.cluster_name}/*/*" in json.dumps(describe_nodegroup["Resource"])
    reads = next(s for actions, s in by_action.items() if "ec2:DescribeInstanceTypes" in actions)
    assert reads["Resource"] == "*"
    assert all(not a.startswith(("autoscaling:Set", "autoscaling:Terminate")) for a in reads["Action"])


@pytest.mark.parametrize("env", SHIPPED_ENVIRONMENTS)
def test_gpu_groups_carry_what_a_scale_up_from_zero_needs(synthesized, env):
    config, _, template, _, _ = synthesized(env)
    for phase in ("prefill", "decode"):
        (group,) = [
            r["Properties"]
            for r in template.find_resources("AWS::EKS::Nodegroup").values()
            if r["Properties"]["Labels"].get("pd-serving/phase") == phase
        ]
        tags = group["Tags"]
        assert tags["k8s.io/cluster-autoscaler/node-template/resources/vpc.amazonaws.com/efa"] == "1"
        assert tags["k8s.io/cluster-autoscaler/node-template/resources/nvidia.com/gpu"] == "1"
        # Cluster Autoscaler drops a managed node group's taint that has no value from its template.
        assert all(t.get("Value") for t in group["Taints"])
        assert group["Labels"]["pd-serving/phase"] == phase
        assert group["Version"] == config.cluster.kubernetes_version


# kubernetes/autoscaler at cluster-autoscaler-1.36.1, cloudprovider/aws/aws_cloud_provider.go:
# GPULabel (line 48) and availableGPUTypes (lines 54-63), the values it knows for that label.
AUTOSCALER_GPU_LABEL = "k8s.amazonaws.com/accelerator"
AUTOSCALER_GPU_TYPES = {
    "nvidia-tesla-k80",
    "nvidia-tesla-p100",
    "nvidia-tesla-v100",
    "nvidia-tesla-t4",
    "nvidia-tesla-a100",
    "nvidia-a10g",
    "nvidia-l4",
    "nvidia-l40s",
}


@pytest.mark.parametrize("env", SHIPPED_ENVIRONMENTS)
def test_gpu_nodes_say_they_have_a_gpu_before_the_device_plugin_does(synthesized, env):
    """Cluster Autoscaler takes a node with this label but no nvidia.com/gpu allocatable yet as
    "GPU not ready" (processors/customresources/gpu_processor.go) instead of as a node that does
    not fit the pending pods, which would trigger another scale-up."""
    config, _, template, _, _ = synthesized(env)
    groups = {
        r["Properties"]["Labels"].get("pd-serving/phase", "system"): r["Properties"]
        for r in template.find_resources("AWS::EKS::Nodegroup").values()
    }
    assert AUTOSCALER_GPU_LABEL not in groups.pop("system")["Labels"]
    for phase, group in groups.items():
        assert getattr(config.cluster.gpu_node_groups, phase).instance_type == "g6.8xlarge"
        assert group["Labels"][AUTOSCALER_GPU_LABEL] == "nvidia-l4"


def test_every_gpu_of_the_catalog_names_a_type_the_autoscaler_knows_or_none():
    from config import catalog

    for name, gpu in catalog.GPUS.items():
        assert gpu.autoscaler_gpu_type is None or gpu.autoscaler_gpu_type in AUTOSCALER_GPU_TYPES, name
    assert catalog.INSTANCES["g6.8xlarge"].autoscaler_gpu_type == "nvidia-l4"
    assert catalog.INSTANCES["m7i.xlarge"].autoscaler_gpu_type is None


@pytest.mark.parametrize("env", SHIPPED_ENVIRONMENTS)
def test_a_phase_pod_fits_only_its_own_groups_template(synthesized, env):
    """What the autoscaler simulates: a pending worker pod against each group's labels and taints."""
    config, stack, template, _, _ = synthesized(env)
    groups = {
        r["Properties"]["Labels"].get("pd-serving/phase", "system"): r["Properties"]
        for r in template.find_resources("AWS::EKS::Nodegroup").values()
    }
    for worker in stack.serving.manifest_body["spec"]["rayClusterConfig"]["workerGroupSpecs"]:
        pod = worker["template"]["spec"]
        tolerated = {(t["key"], t["effect"]) for t in pod["tolerations"]}
        fits = [
            name
            for name, group in groups.items()
            if all(group["Labels"].get(k) == v for k, v in pod["nodeSelector"].items())
            and all(
                (t["Key"], t["Effect"].replace("NO_SCHEDULE", "NoSchedule")) in tolerated
                for t in group.get("Taints", [])
            )
        ]
        assert fits == [worker["groupName"].removesuffix("-gpu")]


def test_ray_drops_idle_workers_as_the_autoscaler_drops_idle_nodes():
    config = load_config(CONFIG_DIR / "dev.yaml")
    cluster = rendered_ray_service(config)["spec"]["rayClusterConfig"]
    assert cluster["autoscalerOptions"]["idleTimeoutSeconds"] == config.cluster.autoscaling.scale_down_idle_minutes * 60
    for worker in cluster["workerGroupSpecs"]:
        annotations = worker["template"]["metadata"]["annotations"]
        assert annotations["cluster-autoscaler.kubernetes.io/safe-to-evict"] == "false"


def test_autoscaler_goes_before_the_node_groups_on_teardown(synthesized):
    _, _, template, _, _ = synthesized("dev")
    resources = template.to_json()["Resources"]
    (chart_id,) = [
        k
        for k, r in resources.items()
        if r["Type"] == "Custom::AWSCDK-EKS-HelmChart" and r["Properties"]["Chart"] == "cluster-autoscaler"
    ]
    nodegroups = {k for k, r in resources.items() if r["Type"] == "AWS::EKS::Nodegroup"}
    assert nodegroups <= set(resources[chart_id]["DependsOn"])


def test_scale_to_zero_variant_synthesizes_with_zero_sized_groups(tmp_path):
    data = yaml.safe_load((CONFIG_DIR / "dev.yaml").read_text())
    for phase in ("prefill", "decode"):
        data["cluster"]["gpu_node_groups"][phase].update(min_size=0, desired_size=0)
        data["serving"][phase]["min_replicas"] = 0
    stack, template = synth_variant(tmp_path, data, "zero")
    template.has_resource_properties(
        "AWS::EKS::Nodegroup",
        {
            "Labels": Match.object_like({"pd-serving/phase": "prefill"}),
            "ScalingConfig": {"MinSize": 0, "DesiredSize": 0, "MaxSize": 2},
        },
    )
    workers = stack.serving.manifest_body["spec"]["rayClusterConfig"]["workerGroupSpecs"]
    assert {(w["minReplicas"], w["replicas"]) for w in workers} == {(0, 0)}
    report = plan_config(stack.config)
    assert not any("idle node" in w for w in report.warnings)


def _data(env="dev", **groups):
    data = yaml.safe_load((CONFIG_DIR / f"{env}.yaml").read_text())
    for phase, sizes in groups.items():
        data["cluster"]["gpu_node_groups"][phase].update(sizes)
    return data


def test_max_size_without_room_for_a_new_cluster_warns_in_dev_and_fails_in_production():
    dev = plan_config(parse_config(_data(decode={"min_size": 1, "desired_size": 1, "max_size": 1})))
    (line,) = [w for w in dev.warnings if "NewCluster" in w]
    assert line.startswith("cluster.gpu_node_groups.decode.max_size=1 leaves no room for a NewCluster upgrade")
    assert "holds 1 decode node(s) and the new one needs 1 more" in line and "raise max_size to at least 2" in line
    prod_data = _data("prod", decode={"min_size": 2, "desired_size": 2, "max_size": 3})
    prod_data["serving"]["decode"]["max_replicas"] = 3
    prod = plan_config(parse_config(prod_data))
    assert any("decode.max_size=3 leaves no room" in e and "at least 4" in e for e in prod.errors)


def test_scaling_a_phase_to_zero_replicas_on_nodes_that_stay_warns():
    data = _data()
    data["serving"]["prefill"]["min_replicas"] = 0
    report = plan_config(parse_config(data))
    (line,) = [w for w in report.warnings if "min_replicas is 0" in w]
    assert "cluster.gpu_node_groups.prefill.min_size is 1: the idle node(s) are paid for anyway" in line


def test_plan_prints_cost_at_min_and_max_and_time_to_a_replica():
    report = plan_config(parse_config(_data()))
    text = render_text(report)
    # dev: system m7i.xlarge, NAT, endpoints, control plane, and 1 or 2 g6.8xlarge per phase.
    fixed = report.cost.per_hour - 2 * 2.0144
    assert f"${fixed + 2 * 2.0144:.4f} with every GPU group at min_size" in text
    assert f"${fixed + 4 * 2.0144:.4f} at max_size" in text
    (times,) = {tuple(t) for t in report.scaling.replica_times.values()}
    hf, s3 = times
    assert hf.source == "Hugging Face through NAT" and s3.source == "S3 mirror, streamed"
    # image: (12.6 + 28.6) GiB written at the GPU root volume's 500 MiB/s
    assert hf.image_pull == pytest.approx((12.6 + 28.6) * 1024 / 500)
    assert hf.weights == pytest.approx(report.model.num_parameters * 2 / (475 * 2**20))
    assert s3.weights == pytest.approx(report.model.num_parameters * 2 / (25 * 0.7 * 1e9 / 8))
    assert hf.nat_cost == pytest.approx(report.model.num_parameters * 2 / 1e9 * 0.045)
    assert s3.nat_cost == 0
    assert "Time to a new prefill or decode replica on a new node" in text


def test_upgrade_crds_applies_the_pinned_kuberay_crds_server_side():
    import subprocess
    import sys

    from tests.conftest import ROOT

    done = subprocess.run(
        [sys.executable, "-m", "cli.kuberay_crds", str(CONFIG_DIR / "prod.yaml"), "--dry-run"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == (
        "kubectl apply --server-side --force-conflicts -k "
        f"github.com/ray-project/kuberay/ray-operator/config/crd?ref=v{versions.KUBERAY_OPERATOR.version}"
    )


def test_eks_addon_versions_can_be_pinned_per_environment(tmp_path):
    data = _data()
    data["cluster"]["addon_versions"] = {
        "kube-proxy": "v1.35.3-eksbuild.2",
        "coredns": "v1.14.2-eksbuild.4",
        "eks-pod-identity-agent": "v1.3.10-eksbuild.2",
    }
    data["cluster"]["kubernetes_version"] = "1.36"
    _, template = synth_variant(tmp_path, data, "addons")
    versions_by_name = {
        r["Properties"]["AddonName"]: r["Properties"].get("AddonVersion")
        for r in template.find_resources("AWS::EKS::Addon").values()
    }
    assert versions_by_name["kube-proxy"] == "v1.35.3-eksbuild.2"
    assert versions_by_name["coredns"] == "v1.14.2-eksbuild.4"
    assert versions_by_name["eks-pod-identity-agent"] == "v1.3.10-eksbuild.2"
    assert versions_by_name["vpc-cni"] is None  # not listed: EKS's default for the version


def test_a_malformed_addon_version_is_refused(dev_data):
    from config.loader import ConfigError

    dev_data["cluster"]["addon_versions"] = {"vpc-cni": "1.21"}
    with pytest.raises(ConfigError, match=r"cluster.addon_versions: vpc-cni: '1.21' is not an EKS add-on version"):
        parse_config(dev_data)


@pytest.mark.parametrize(
    ("live", "replaced", "bounds", "expected"),
    [
        (None, False, (1, 2), 1),  # the group's creation: the config's desired_size
        (4, False, (1, 6), None),  # exists within the bounds: the autoscaler's size stands
        (0, False, (0, 6), None),
        (4, False, (1, 2), 2),  # max lowered below it: EKS refuses desired above max, so max
        (0, False, (1, 6), 1),  # min raised above it: EKS refuses min above desired, so min
        (3, True, (1, 6), 3),  # a replacement is a create: it starts where the old group is
        (9, True, (1, 6), 6),
    ],
)
def test_a_deploy_sizes_a_node_group_only_when_it_is_created_or_must(live, replaced, bounds, expected):
    from cdk_constructs.node_groups import template_desired_size

    low, high = bounds
    assert template_desired_size(min_size=low, max_size=high, initial=1, live=live, replaced=replaced) == expected


def test_an_existing_node_group_leaves_its_size_to_the_autoscaler(tmp_path, dev_data):
    """With the sizes `make deploy` reads (decode grown to 2 by the autoscaler), no group's template
    sets DesiredSize, which CloudFormation takes as "no change"; offline synth (a first deploy) sets it."""
    from config.schema import DeployFacts

    facts = DeployFacts.model_validate({"node_group_sizes": {"system": 1, "prefill": 1, "decode": 2}})
    _, template = synth_variant(tmp_path, dev_data, "grown", facts)
    groups = template.find_resources("AWS::EKS::Nodegroup")
    assert len(groups) == 3
    assert all("DesiredSize" not in g["Properties"]["ScalingConfig"] for g in groups.values())
    assert all(g["Properties"]["ScalingConfig"].keys() == {"MinSize", "MaxSize"} for g in groups.values())
