"""Each construct on a bare stack, asserted with aws-cdk-lib's Template and Match."""

from __future__ import annotations

import json

import aws_cdk as cdk
import pytest
from aws_cdk.assertions import Match, Template

from cdk_constructs import addons
from cdk_constructs.log_groups import EncryptedLogs
from cdk_constructs.network import Network
from cdk_constructs.node_groups import EfaFabric, GpuNodeGroup, SystemNodeGroup
from config.loader import load_config, parse_config
from tests.conftest import SHIPPED_ENVIRONMENTS, network_and_cluster

ENV = cdk.Environment(account="111111111111", region="us-east-2")


@pytest.fixture(scope="module")
def config():
    from tests.conftest import CONFIG_DIR

    return load_config(CONFIG_DIR / "dev.yaml")


def bare_stack(config) -> cdk.Stack:
    app = cdk.App(
        context={"availability-zones:account=111111111111:region=us-east-2": list(config.network.availability_zones)}
    )
    return cdk.Stack(app, "Bare", env=ENV)


@pytest.fixture(scope="module")
def network_template(config):
    stack = bare_stack(config)
    Network(stack, "Network", config=config.network, logs=EncryptedLogs(stack, "Logs", description="unit"))
    return Template.from_stack(stack)


@pytest.fixture(scope="module")
def cluster_parts(config):
    stack = bare_stack(config)
    network, eks_cluster = network_and_cluster(stack, config)
    system = SystemNodeGroup(
        stack,
        "System",
        cluster=eks_cluster.cluster,
        config=config.cluster.system_node_group,
        subnets=network.private_subnets,
        metadata_hop_limit=1,
        kubernetes_version="1.36",
        ami_release="1.36.3-20260903",
        tags=config.tags,
    )
    eks_cluster.add_coredns_after(system.nodegroup)
    fabric = EfaFabric(stack, "Fabric", vpc=network.vpc)
    group = GpuNodeGroup(
        stack,
        "Decode",
        cluster=eks_cluster.cluster,
        phase="decode",
        config=config.cluster.gpu_node_groups.decode,
        fabric=fabric,
        subnet=network.gpu_subnet,
        metadata_hop_limit=1,
        kubernetes_version="1.36",
        ami_release="1.36.3-20260903",
        tags=config.tags,
    )
    addons.nvidia_device_plugin(stack, cluster=eks_cluster.cluster, version="0.20.0")
    addons.efa_device_plugin(stack, cluster=eks_cluster.cluster, version="v0.5.30")
    addons.kuberay_operator(stack, cluster=eks_cluster.cluster, version="1.7.0")
    return stack, network, group, Template.from_stack(stack)


# Network -----------------------------------------------------------------------------------------


def test_vpc_spans_configured_zones(network_template, config):
    network_template.has_resource_properties("AWS::EC2::VPC", {"CidrBlock": "10.40.0.0/16"})
    for zone in config.network.availability_zones:
        network_template.has_resource_properties(
            "AWS::EC2::Subnet",
            {"AvailabilityZone": zone, "MapPublicIpOnLaunch": False},
        )
    network_template.resource_count_is("AWS::EC2::Subnet", 4)
    network_template.resource_count_is("AWS::EC2::NatGateway", config.network.nat_gateways)


def test_flow_logs_capture_all_traffic(network_template):
    network_template.has_resource_properties(
        "AWS::EC2::FlowLog", {"TrafficType": "ALL", "LogDestinationType": "cloud-watch-logs"}
    )
    network_template.has_resource_properties("AWS::Logs::LogGroup", {"RetentionInDays": 14})


def test_s3_gateway_and_ecr_interface_endpoints(network_template):
    network_template.has_resource_properties(
        "AWS::EC2::VPCEndpoint",
        {"VpcEndpointType": "Gateway", "ServiceName": Match.object_like({"Fn::Join": Match.any_value()})},
    )
    for service in ("ecr.api", "ecr.dkr"):
        network_template.has_resource_properties(
            "AWS::EC2::VPCEndpoint",
            {
                "VpcEndpointType": "Interface",
                "ServiceName": f"com.amazonaws.us-east-2.{service}",
                "PrivateDnsEnabled": True,
            },
        )


def test_private_subnets_tagged_for_internal_load_balancers(network_template):
    network_template.has_resource_properties(
        "AWS::EC2::Subnet",
        {
            "MapPublicIpOnLaunch": False,
            "Tags": Match.array_with([{"Key": "kubernetes.io/role/internal-elb", "Value": "1"}]),
        },
    )


def test_gpu_subnet_is_private_and_in_gpu_zone(cluster_parts, config):
    _, network, _, _ = cluster_parts
    assert network.gpu_subnet.availability_zone == config.network.gpu_availability_zone
    assert network.gpu_subnet in network.private_subnets


# Cluster ------------------------------------------------------------------------------------------


def test_cluster_version_logging_and_secrets_encryption(cluster_parts):
    _, _, _, template = cluster_parts
    template.has_resource_properties(
        "AWS::EKS::Cluster",
        {
            "Version": "1.36",
            "Logging": {
                "ClusterLogging": {
                    "EnabledTypes": [
                        {"Type": t} for t in ("api", "audit", "authenticator", "controllerManager", "scheduler")
                    ]
                }
            },
            "EncryptionConfig": [{"Provider": {"KeyArn": Match.any_value()}, "Resources": ["secrets"]}],
            "AccessConfig": Match.object_like({"AuthenticationMode": "API"}),
            "ResourcesVpcConfig": Match.object_like(
                {
                    "EndpointPublicAccess": True,
                    "EndpointPrivateAccess": True,
                    "PublicAccessCidrs": ["192.0.2.1/32"],  # the deployer, unresolved at offline synth
                }
            ),
        },
    )
    template.has_resource_properties("AWS::KMS::Key", {"EnableKeyRotation": True})


def test_managed_addons(cluster_parts):
    _, _, _, template = cluster_parts
    for name in ("vpc-cni", "kube-proxy", "coredns", "eks-pod-identity-agent"):
        template.has_resource_properties("AWS::EKS::Addon", {"AddonName": name})


def test_coredns_waits_for_system_nodes(cluster_parts):
    _, _, _, template = cluster_parts
    addons_by_name = {r["Properties"]["AddonName"]: r for r in template.find_resources("AWS::EKS::Addon").values()}
    system_nodegroup = next(
        k
        for k, r in template.find_resources("AWS::EKS::Nodegroup").items()
        if r["Properties"]["Labels"]["role"] == "system"
    )
    assert system_nodegroup in addons_by_name["coredns"]["DependsOn"]


def test_admin_principals_get_access_entries(config):
    data = config.model_dump()
    data["cluster"]["admin_principals"] = ["arn:aws:iam::111111111111:role/Admin"]
    admin_config = parse_config(data)
    stack = bare_stack(admin_config)
    network_and_cluster(stack, admin_config)
    entries = Template.from_stack(stack).find_resources(
        "AWS::EKS::AccessEntry",
        {"Properties": {"PrincipalArn": "arn:aws:iam::111111111111:role/Admin"}},
    )
    assert len(entries) == 1
    (entry,) = entries.values()
    (policy,) = entry["Properties"]["AccessPolicies"]
    assert policy["AccessScope"] == {"Type": "cluster"}
    assert "AmazonEKSClusterAdminPolicy" in json.dumps(policy["PolicyArn"])


# Node groups --------------------------------------------------------------------------------------


def test_system_node_group(cluster_parts):
    _, _, _, template = cluster_parts
    template.has_resource_properties(
        "AWS::EKS::Nodegroup",
        {
            "AmiType": "AL2023_x86_64_STANDARD",
            "InstanceTypes": ["m7i.xlarge"],
            "Labels": {"role": "system"},
            "Subnets": [
                {"Ref": Match.string_like_regexp("PrivateSubnet1")},
                {"Ref": Match.string_like_regexp("PrivateSubnet2")},
            ],
        },
    )


def test_gpu_node_group_ami_labels_taints_single_subnet(cluster_parts):
    _, network, _, template = cluster_parts
    template.has_resource_properties(
        "AWS::EKS::Nodegroup",
        {
            "AmiType": "AL2023_x86_64_NVIDIA",
            "InstanceTypes": ["g6.8xlarge"],
            "Labels": {"role": "gpu", "pd-serving/phase": "decode"},
            "Taints": [
                {"Effect": "NO_SCHEDULE", "Key": "nvidia.com/gpu", "Value": "true"},
                {"Effect": "NO_SCHEDULE", "Key": "aws.amazon.com/efa", "Value": "true"},
            ],
            "Subnets": [{"Ref": Match.string_like_regexp("PrivateSubnet1")}],
            "ScalingConfig": {"MinSize": 1, "DesiredSize": 1, "MaxSize": 2},
        },
    )
    gpu_group = next(
        r
        for r in template.find_resources("AWS::EKS::Nodegroup").values()
        if r["Properties"]["AmiType"] == "AL2023_x86_64_NVIDIA"
    )
    assert "DiskSize" not in gpu_group["Properties"]


def test_gpu_launch_template_has_efa_interface_and_placement(cluster_parts):
    _, _, _, template = cluster_parts
    template.has_resource_properties(
        "AWS::EC2::LaunchTemplate",
        {
            "LaunchTemplateData": {
                "NetworkInterfaces": [
                    {
                        "DeviceIndex": 0,
                        "NetworkCardIndex": 0,
                        "InterfaceType": "efa",
                        "DeleteOnTermination": True,
                        "Groups": [
                            {"Fn::GetAtt": [Match.string_like_regexp("FabricSecurityGroup"), "GroupId"]},
                            {"Fn::GetAtt": [Match.string_like_regexp("EksCluster"), "ClusterSecurityGroupId"]},
                        ],
                    }
                ],
                "Placement": {"GroupName": {"Ref": Match.string_like_regexp("FabricPlacementGroup")}},
                "MetadataOptions": {
                    "HttpTokens": "required",
                    "HttpEndpoint": "enabled",
                    "HttpPutResponseHopLimit": 1,
                },
                "BlockDeviceMappings": [
                    {
                        "DeviceName": "/dev/xvda",
                        "Ebs": Match.object_like({"VolumeSize": 200, "VolumeType": "gp3", "Encrypted": True}),
                    }
                ],
            }
        },
    )


def test_launch_templates_never_name_subnet_or_instance_type(cluster_parts):
    _, _, _, template = cluster_parts
    templates = template.find_resources("AWS::EC2::LaunchTemplate")
    assert len(templates) == 2
    for resource in templates.values():
        data = resource["Properties"]["LaunchTemplateData"]
        assert "InstanceType" not in data
        for interface in data.get("NetworkInterfaces", []):
            assert "SubnetId" not in interface
        assert data["MetadataOptions"]["HttpTokens"] == "required"


LAUNCHED_RESOURCE_TYPES = ("instance", "volume", "network-interface")


@pytest.mark.parametrize("env", ["dev", "prod"])
def test_cost_tags_reach_what_each_launch_template_launches(synthesized, env):
    """Node group tags stay on the node group; an instance, its volumes and its network
    interfaces are tagged only through the launch template's TagSpecifications."""
    config, _, template, _, _ = synthesized(env)
    assert config.tags
    expected = [{"Key": key, "Value": value} for key, value in sorted(config.tags.items())]
    templates = template.find_resources("AWS::EC2::LaunchTemplate")
    assert len(templates) == 3
    for logical_id, resource in templates.items():
        specs = resource["Properties"]["LaunchTemplateData"].get("TagSpecifications", [])
        by_type = {spec["ResourceType"]: spec["Tags"] for spec in specs}
        assert set(by_type) == set(LAUNCHED_RESOURCE_TYPES), logical_id
        for resource_type in LAUNCHED_RESOURCE_TYPES:
            assert by_type[resource_type] == expected, (logical_id, resource_type)


def test_placement_group_is_cluster_strategy(cluster_parts):
    _, _, _, template = cluster_parts
    template.has_resource_properties("AWS::EC2::PlacementGroup", {"Strategy": "cluster"})


def test_efa_security_group_allows_all_traffic_to_and_from_itself(cluster_parts):
    _, _, _, template = cluster_parts
    sg_ref = {"Fn::GetAtt": [Match.string_like_regexp("FabricSecurityGroup"), "GroupId"]}
    template.has_resource_properties(
        "AWS::EC2::SecurityGroupIngress",
        {"IpProtocol": "-1", "GroupId": sg_ref, "SourceSecurityGroupId": sg_ref},
    )
    template.has_resource_properties(
        "AWS::EC2::SecurityGroupEgress",
        {"IpProtocol": "-1", "GroupId": sg_ref, "DestinationSecurityGroupId": sg_ref},
    )
    (fabric_group,) = [
        r for k, r in template.find_resources("AWS::EC2::SecurityGroup").items() if "FabricSecurityGroup" in k
    ]
    # A group created without SecurityGroupEgress keeps EC2's default allow-all egress; the inline
    # rule matches no traffic (CDK's own placeholder), so the separate self rule is all that leaves.
    assert fabric_group["Properties"]["SecurityGroupEgress"] == [
        {
            "CidrIp": "255.255.255.255/32",
            "Description": "Disallow all traffic",
            "FromPort": 252,
            "IpProtocol": "icmp",
            "ToPort": 86,
        }
    ]
    egress = [
        r["Properties"]
        for r in template.find_resources("AWS::EC2::SecurityGroupEgress").values()
        if "FabricSecurityGroup" in str(r["Properties"]["GroupId"])
    ]
    assert len(egress) == 1 and "DestinationSecurityGroupId" in egress[0]


# Add-ons ------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("chart", "version", "namespace", "selector"),
    [
        ("nvidia-device-plugin", "0.20.0", "kube-system", {"role": "gpu"}),
        ("aws-efa-k8s-device-plugin", "v0.5.30", "kube-system", {"role": "gpu"}),
        ("kuberay-operator", "1.7.0", "kuberay-system", {"role": "system"}),
    ],
)
def test_helm_charts_pinned_and_placed(cluster_parts, chart, version, namespace, selector):
    import json

    _, _, _, template = cluster_parts
    charts = {
        r["Properties"]["Chart"]: r["Properties"]
        for r in template.find_resources("Custom::AWSCDK-EKS-HelmChart").values()
    }
    props = charts[chart]
    assert props["Version"] == version
    assert props["Namespace"] == namespace
    values = json.loads(props["Values"])
    assert values["nodeSelector"] == selector


def test_device_plugins_tolerate_gpu_and_efa_taints(cluster_parts):
    import json

    _, _, _, template = cluster_parts
    for resource in template.find_resources("Custom::AWSCDK-EKS-HelmChart").values():
        props = resource["Properties"]
        if props["Chart"] == "kuberay-operator":
            continue
        keys = {t["key"] for t in json.loads(props["Values"])["tolerations"]}
        assert keys == {"nvidia.com/gpu", "aws.amazon.com/efa"}


def test_helm_addon_requires_a_version(config):
    stack = bare_stack(config)
    network, eks_cluster = network_and_cluster(stack, config)
    with pytest.raises(ValueError, match="no version given for kuberay-operator; pin one"):
        addons.kuberay_operator(stack, cluster=eks_cluster.cluster, version="")


# NVIDIA/k8s-device-plugin v0.20.0, deployments/helm/nvidia-device-plugin/values.yaml: the chart's
# default `affinity`, which Helm keeps next to the nodeSelector this project passes. Each term is
# one nodeSelectorTerm (terms are ORed, expressions ANDed, all with operator In).
NVIDIA_CHART_DEFAULT_AFFINITY = [
    {"feature.node.kubernetes.io/pci-10de.present": ["true"]},
    {"feature.node.kubernetes.io/cpu-model.vendor_id": ["NVIDIA"]},
    {"nvidia.com/gpu.present": ["true"]},
]


def _schedulable(labels: dict, node_selector: dict, affinity_terms: list[dict]) -> bool:
    selected = all(labels.get(k) == v for k, v in node_selector.items())
    return selected and any(all(labels.get(k) in values for k, values in term.items()) for term in affinity_terms)


@pytest.mark.parametrize("env", ["dev", "prod"])
def test_nvidia_device_plugin_can_land_on_every_gpu_node_and_no_other(synthesized, env):
    import json

    _, _, template, _, _ = synthesized(env)
    (chart,) = [
        r["Properties"]
        for r in template.find_resources("Custom::AWSCDK-EKS-HelmChart").values()
        if r["Properties"]["Chart"] == "nvidia-device-plugin"
    ]
    values = json.loads(chart["Values"])
    assert "affinity" not in values  # the chart's default affinity stays in force
    nodegroups = [r["Properties"] for r in template.find_resources("AWS::EKS::Nodegroup").values()]
    for group in nodegroups:
        gpu = group["AmiType"] == "AL2023_x86_64_NVIDIA"
        assert _schedulable(group["Labels"], values["nodeSelector"], NVIDIA_CHART_DEFAULT_AFFINITY) is gpu, group[
            "Labels"
        ]


@pytest.mark.parametrize("env", SHIPPED_ENVIRONMENTS)
def test_the_execution_role_is_no_admin_and_kubectl_has_its_own_entry_first(synthesized, env):
    """EKS makes the cluster's creator (CloudFormation's execution role) an admin unless
    BootstrapClusterCreatorAdminPermissions is false. Every Kubernetes object the stack applies
    goes through the kubectl provider, whose role has its own access entry, and waits for it."""
    _, _, template, _, _ = synthesized(env)
    (cluster,) = template.find_resources("AWS::EKS::Cluster").values()
    assert cluster["Properties"]["AccessConfig"] == {
        "AuthenticationMode": "API",
        "BootstrapClusterCreatorAdminPermissions": False,
    }
    resources = template.to_json()["Resources"]
    kubectl_entries = [
        logical_id
        for logical_id, entry in resources.items()
        if entry["Type"] == "AWS::EKS::AccessEntry"
        and "KubectlProviderHandlerServiceRole" in json.dumps(entry["Properties"]["PrincipalArn"])
    ]
    assert len(kubectl_entries) == 1
    (barrier,) = [k for k, r in resources.items() if r["Type"] == "AWS::SSM::Parameter" and "KubectlReadyBarrier" in k]
    assert kubectl_entries[0] in resources[barrier]["DependsOn"]
    applied = [k for k, r in resources.items() if r["Type"].startswith("Custom::AWSCDK-EKS-")]
    assert applied and all(barrier in resources[k].get("DependsOn", []) for k in applied)
