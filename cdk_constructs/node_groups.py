"""Managed node groups: the CPU system group, and one EFA GPU group per serving phase.

Every node gets a launch template so that IMDSv2, the hop limit and encrypted root volumes are
set the same way. GPU nodes additionally get an EFA network interface, the EFA security group and
the shared cluster placement group, which only an L1 ``CfnLaunchTemplate`` can express.
"""

from __future__ import annotations

from aws_cdk import CfnTag, Tags
from aws_cdk import aws_ec2 as ec2
from aws_cdk import aws_eks_v2 as eks
from constructs import Construct

from cdk_constructs.policy import acknowledge, acknowledge_guard, managed_policy_finding
from config import catalog
from config.schema import GpuNodeGroupConfig, RootVolume, SystemNodeGroupConfig
from manifests.contract import (
    AUTOSCALER_GPU_LABEL,
    EFA_RESOURCE,
    EFA_TAINT_KEY,
    GPU_NODE_SELECTOR,
    GPU_RESOURCE,
    GPU_TAINT_KEY,
    NVIDIA_GPU_PRESENT_LABEL,
    PHASE_LABEL,
    SYSTEM_NODE_SELECTOR,
)

# Cluster Autoscaler reads a managed node group's own tags with this prefix as the extended
# resources of its nodes (cluster-autoscaler-1.36.1, cloudprovider/aws/aws_manager.go).
NODE_TEMPLATE_RESOURCE_TAG = "k8s.io/cluster-autoscaler/node-template/resources/"


def node_template_tags(resources: dict[str, int]) -> dict[str, str]:
    """Node group tags that tell the autoscaler a node's extended resources before any node exists."""
    return {f"{NODE_TEMPLATE_RESOURCE_TAG}{name}": str(count) for name, count in resources.items()}


def _root_volume(config: RootVolume, size_gib: int) -> ec2.CfnLaunchTemplate.BlockDeviceMappingProperty:
    return ec2.CfnLaunchTemplate.BlockDeviceMappingProperty(
        device_name="/dev/xvda",
        ebs=ec2.CfnLaunchTemplate.EbsProperty(
            volume_size=size_gib,
            volume_type="gp3",
            iops=config.root_volume_iops,
            throughput=config.root_volume_throughput_mibps,
            encrypted=True,
            delete_on_termination=True,
        ),
    )


def _metadata(hop_limit: int) -> ec2.CfnLaunchTemplate.MetadataOptionsProperty:
    return ec2.CfnLaunchTemplate.MetadataOptionsProperty(
        http_tokens="required", http_endpoint="enabled", http_put_response_hop_limit=hop_limit
    )


# What a node launches that bills: the instance, its EBS volumes, its network interfaces.
LAUNCHED_RESOURCE_TYPES = ("instance", "volume", "network-interface")


def _tag_specifications(tags: dict[str, str]) -> list[ec2.CfnLaunchTemplate.TagSpecificationProperty] | None:
    """The stack's tags on what the template launches. A managed node group's own tags stay on the
    node group, and ``Tags.of`` skips the L1 CfnLaunchTemplate: it has no tag manager (the L2
    LaunchTemplate tags instances and volumes, not network interfaces). Sorted, so that the order
    of the config's tags never makes a new template version, which would roll the nodes."""
    if not tags:
        return None
    cfn_tags = [CfnTag(key=key, value=value) for key, value in sorted(tags.items())]
    return [
        ec2.CfnLaunchTemplate.TagSpecificationProperty(resource_type=resource_type, tags=cfn_tags)
        for resource_type in LAUNCHED_RESOURCE_TYPES
    ]


def acknowledge_node_role(nodegroup: eks.Nodegroup) -> None:
    for policy in ("AmazonEKSWorkerNodePolicy", "AmazonEKS_CNI_Policy", "AmazonEC2ContainerRegistryReadOnly"):
        acknowledge(
            nodegroup,
            managed_policy_finding(policy),
            "EKS managed node groups need these AWS managed policies on the node role "
            "(join the cluster, run the VPC CNI, pull images); AWS keeps them current.",
        )


def acknowledge_basic_monitoring(template: ec2.CfnLaunchTemplate) -> None:
    acknowledge_guard(
        template,
        "ec2_launch_template_monitoring_enabled_check",
        "Nodes are watched through Kubernetes and the observability backend (Ray and vLLM metrics per pod); "
        "EC2 detailed monitoring would add paid one-minute CPU metrics, and a new launch template version "
        "rolls every node of the group.",
        resource_type="AWS::EC2::LaunchTemplate",
    )


def _template_spec(template: ec2.CfnLaunchTemplate) -> eks.LaunchTemplateSpec:
    return eks.LaunchTemplateSpec(id=template.ref, version=template.attr_latest_version_number)


def template_desired_size(
    *, min_size: int, max_size: int, initial: int, live: int | None, replaced: bool = False
) -> int | None:
    """The DesiredSize to write for a node group, or None to leave it out.

    EKS resizes a group to its DesiredSize whenever the value changes, terminating nodes above it;
    with CloudFormation, "no action occurs if you remove this parameter" (EKS API,
    NodegroupScalingConfig). So ``initial`` (the config's desired_size) sizes a group only when it
    is created. Once it exists (``live``, its size now), Cluster Autoscaler owns the size and the
    template leaves it out, unless the new bounds exclude it (EKS refuses min above desired, and
    max below it): then the nearest bound. A replaced group is a create, which needs all three
    sizes; it starts where the old group is, so the phase keeps its capacity.
    """
    if live is None:
        return initial
    within = min(max(live, min_size), max_size)
    if within == live and not replaced:
        return None
    return within


def sized(config: SystemNodeGroupConfig | GpuNodeGroupConfig, live: int | None, replaced: bool) -> int | None:
    return template_desired_size(
        min_size=config.min_size, max_size=config.max_size, initial=config.desired_size, live=live, replaced=replaced
    )


def apply_desired_size(nodegroup: eks.Nodegroup, desired: int | None) -> None:
    if desired is None:
        nodegroup.node.default_child.add_property_deletion_override("ScalingConfig.DesiredSize")
    else:
        nodegroup.node.default_child.add_property_override("ScalingConfig.DesiredSize", desired)


def pin_versions(nodegroup: eks.Nodegroup, kubernetes_version: str, ami_release: str | None) -> None:
    """Pins the node group to its Kubernetes minor and AMI release, so that a new minor or release rolls
    the nodes (after the control plane, which CloudFormation updates first); without them a managed node
    group stays on the release it was created with. aws_eks_v2's Nodegroup has no prop for the version."""
    child = nodegroup.node.default_child
    child.add_property_override("Version", kubernetes_version)
    if ami_release is not None:
        child.add_property_override("ReleaseVersion", ami_release)


class SystemNodeGroup(Construct):
    """CPU nodes labelled ``role=system`` for the KubeRay operator and the Ray head.

    Args:
        cluster: the EKS cluster.
        config: sizes and instance type.
        subnets: private subnets the nodes may use (all AZs).
        metadata_hop_limit: IMDSv2 hop limit.
        kubernetes_version: the Kubernetes minor the nodes run in this deploy (config/upgrade.py).
        ami_release: their AMI release (config/releases.py); None leaves the one they run.
        tags: the stack's tags, for the instances, volumes and network interfaces.
        live_size: the group's size now, when it exists (see ``template_desired_size``).
        replaced: this deploy replaces the group.
    """

    def __init__(
        self,
        scope: Construct,
        id_: str,
        *,
        cluster: eks.Cluster,
        config: SystemNodeGroupConfig,
        subnets: list[ec2.ISubnet],
        metadata_hop_limit: int,
        kubernetes_version: str,
        ami_release: str | None,
        tags: dict[str, str],
        live_size: int | None = None,
        replaced: bool = False,
    ) -> None:
        super().__init__(scope, id_)
        self.launch_template = ec2.CfnLaunchTemplate(
            self,
            "LaunchTemplate",
            launch_template_data=ec2.CfnLaunchTemplate.LaunchTemplateDataProperty(
                block_device_mappings=[_root_volume(config, config.root_volume_gib)],
                metadata_options=_metadata(metadata_hop_limit),
                tag_specifications=_tag_specifications(tags),
            ),
        )
        acknowledge_basic_monitoring(self.launch_template)
        self.nodegroup = cluster.add_nodegroup_capacity(
            "SystemNodes",
            ami_type=eks.NodegroupAmiType.AL2023_X86_64_STANDARD,
            instance_types=[ec2.InstanceType(config.instance_type)],
            min_size=config.min_size,
            desired_size=config.desired_size,
            max_size=config.max_size,
            labels=dict(SYSTEM_NODE_SELECTOR),
            subnets=ec2.SubnetSelection(subnets=subnets),
            launch_template_spec=_template_spec(self.launch_template),
        )
        apply_desired_size(self.nodegroup, sized(config, live_size, replaced))
        pin_versions(self.nodegroup, kubernetes_version, ami_release)
        acknowledge_node_role(self.nodegroup)


class EfaFabric(Construct):
    """What the GPU groups share for EFA: a cluster placement group and a self-referencing SG.

    EFA's OS-bypass traffic only flows between instances whose security group allows all
    traffic to and from itself; the placement group keeps the nodes physically close.

    Args:
        vpc: the VPC.
        kept_tags: the tags the deployed placement group has, when it has any. A placement group's
            tags cannot change in place (CloudFormation replaces it, and every GPU node rolls into
            the new one), so it carries no stack tags (app.py's TAGS_REPLACE), and one that an
            earlier release tagged keeps exactly those.
    """

    def __init__(self, scope: Construct, id_: str, *, vpc: ec2.IVpc, kept_tags: dict[str, str] | None = None) -> None:
        super().__init__(scope, id_)
        self.placement_group = ec2.CfnPlacementGroup(
            self,
            "PlacementGroup",
            strategy="cluster",
            tags=[CfnTag(key=key, value=value) for key, value in (kept_tags or {}).items()] or None,
        )
        self.security_group = ec2.SecurityGroup(
            self,
            "SecurityGroup",
            vpc=vpc,
            description="EFA: all traffic between GPU nodes, nothing else",
            allow_all_outbound=False,
        )
        self.security_group.add_ingress_rule(self.security_group, ec2.Port.all_traffic(), "EFA from GPU nodes")
        self.security_group.add_egress_rule(self.security_group, ec2.Port.all_traffic(), "EFA to GPU nodes")
        # A rule naming the group itself cannot be inline, so CDK writes it as its own resource and
        # drops its no-traffic placeholder: the group itself then has no SecurityGroupEgress, and EC2
        # keeps its default allow-all egress rule. The placeholder (CDK's own, it matches nothing)
        # removes that default, so only the self rule leaves this group. The nodes still reach the
        # control plane, ECR, S3 and the Internet: their interface also carries the cluster security
        # group, whose EKS-made egress allows all, and an interface's groups add up.
        self.security_group.node.default_child.add_property_override(
            "SecurityGroupEgress",
            [
                {
                    "CidrIp": "255.255.255.255/32",
                    "Description": "Disallow all traffic",
                    "IpProtocol": "icmp",
                    "FromPort": 252,
                    "ToPort": 86,
                }
            ],
        )


class GpuNodeGroup(Construct):
    """One serving phase's GPU nodes, with an EFA interface, in one subnet and the placement group.

    Args:
        cluster: the EKS cluster.
        phase: ``prefill`` or ``decode``; becomes a node label and part of the names.
        config: sizes, instance type and root volume of this phase.
        fabric: the shared placement group and EFA security group.
        subnet: the single private subnet (in the GPU AZ) for every GPU node.
        metadata_hop_limit: IMDSv2 hop limit.
        kubernetes_version: the Kubernetes minor the nodes run in this deploy (config/upgrade.py).
        ami_release: their AMI release (config/releases.py); None leaves the one they run.
        tags: the stack's tags, for the instances, volumes and network interfaces.
        live_size: the group's size now, when it exists (see ``template_desired_size``).
        replaced: this deploy replaces the group.

    The node group carries Cluster Autoscaler's ``node-template/resources`` tags for the GPUs and
    EFA interfaces, so that it can grow from zero nodes.
    """

    def __init__(
        self,
        scope: Construct,
        id_: str,
        *,
        cluster: eks.Cluster,
        phase: str,
        config: GpuNodeGroupConfig,
        fabric: EfaFabric,
        subnet: ec2.ISubnet,
        metadata_hop_limit: int,
        kubernetes_version: str,
        ami_release: str | None,
        tags: dict[str, str],
        live_size: int | None = None,
        replaced: bool = False,
    ) -> None:
        super().__init__(scope, id_)
        self.phase = phase
        facts = catalog.INSTANCES[config.instance_type]
        # What a node of this group offers besides CPU and memory, as the device plugins advertise it.
        self.extended_resources = {GPU_RESOURCE: facts.gpu_count, EFA_RESOURCE: facts.efa_interfaces}
        self.labels = {**GPU_NODE_SELECTOR, PHASE_LABEL: phase, NVIDIA_GPU_PRESENT_LABEL: "true"}
        # Set by kubelet when the node registers, before the device plugin advertises the GPU; the
        # autoscaler then waits for it instead of scaling up again. A GPU its AWS provider does not
        # list gets no label (catalog.GpuFacts.autoscaler_gpu_type).
        if facts.autoscaler_gpu_type:
            self.labels[AUTOSCALER_GPU_LABEL] = facts.autoscaler_gpu_type
        self.launch_template = ec2.CfnLaunchTemplate(
            self,
            "LaunchTemplate",
            launch_template_data=ec2.CfnLaunchTemplate.LaunchTemplateDataProperty(
                block_device_mappings=[_root_volume(config, config.root_volume_gib)],
                metadata_options=_metadata(metadata_hop_limit),
                tag_specifications=_tag_specifications(tags),
                # Custom groups replace the cluster security group that EKS would add, so the
                # interface carries it explicitly; SubnetId must stay out (EKS rejects it).
                network_interfaces=[
                    ec2.CfnLaunchTemplate.NetworkInterfaceProperty(
                        device_index=0,
                        network_card_index=0,
                        interface_type="efa",
                        groups=[
                            fabric.security_group.security_group_id,
                            cluster.cluster_security_group_id,
                        ],
                        delete_on_termination=True,
                    )
                ],
                placement=ec2.CfnLaunchTemplate.PlacementProperty(group_name=fabric.placement_group.ref),
            ),
        )
        acknowledge_basic_monitoring(self.launch_template)
        acknowledge_guard(
            self.launch_template,
            "ec2_launch_template_public_ip_disabled_check",
            "The EFA interface takes its address from the private GPU subnet, which assigns no public "
            "addresses (MapPublicIpOnLaunch false); saying so in the launch template too would roll every "
            "GPU node on the next deploy.",
            resource_type="AWS::EC2::LaunchTemplate",
        )
        # The instance type is set on the node group only: naming it in the launch template as
        # well passes synth but fails the EKS deployment.
        self.nodegroup = cluster.add_nodegroup_capacity(
            f"{phase.title()}Nodes",
            ami_type=eks.NodegroupAmiType.AL2023_X86_64_NVIDIA,
            instance_types=[ec2.InstanceType(config.instance_type)],
            min_size=config.min_size,
            desired_size=config.desired_size,
            max_size=config.max_size,
            labels=self.labels,
            taints=[
                eks.TaintSpec(effect=eks.TaintEffect.NO_SCHEDULE, key=GPU_TAINT_KEY, value="true"),
                eks.TaintSpec(effect=eks.TaintEffect.NO_SCHEDULE, key=EFA_TAINT_KEY, value="true"),
            ],
            subnets=ec2.SubnetSelection(subnets=[subnet]),
            launch_template_spec=_template_spec(self.launch_template),
        )
        Tags.of(self.nodegroup).add("pd-serving/phase", phase)
        # Read by Cluster Autoscaler through eks:DescribeNodegroup while the group has no node; it
        # infers nvidia.com/gpu from the instance type but cannot know vpc.amazonaws.com/efa.
        for key, value in node_template_tags(self.extended_resources).items():
            Tags.of(self.nodegroup).add(key, value)
        apply_desired_size(self.nodegroup, sized(config, live_size, replaced))
        pin_versions(self.nodegroup, kubernetes_version, ami_release)
        acknowledge_node_role(self.nodegroup)
