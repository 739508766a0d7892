"""Cluster Autoscaler: node groups grow when Ray's worker pods are Pending and shrink when nodes idle.

Each GPU phase is its own managed node group (one subnet, the shared placement group, an EFA
launch template). A pending prefill worker pod selects ``pd-serving/phase=prefill`` and tolerates
the GPU taints, so in Cluster Autoscaler's simulation only the prefill group's template fits it:
only that group grows, with the same launch template, subnet and placement group. Managed node
groups are found by the tags EKS puts on their Auto Scaling groups; a group at zero nodes is
simulated from ``eks:DescribeNodegroup`` (labels and taints) and the group's own
``k8s.io/cluster-autoscaler/node-template/resources/...`` tags (``vpc.amazonaws.com/efa``, which
the autoscaler cannot infer from the instance type). Sources: kubernetes/autoscaler at
cluster-autoscaler-1.36.1, ``cloudprovider/aws/README.md`` and ``aws_manager.go``
(``buildNodeFromTemplate``), ``aws_wrapper.go`` (``getManagedNodegroupInfo``).
"""

from __future__ import annotations

from aws_cdk import Stack
from aws_cdk import aws_eks_v2 as eks
from aws_cdk import aws_iam as iam
from constructs import Construct

from cdk_constructs.addons import HelmAddon
from cdk_constructs.policy import acknowledge
from config.versions import CLUSTER_AUTOSCALER, CLUSTER_AUTOSCALER_RELEASES
from manifests.autoscaler import chart_values
from manifests.contract import AUTOSCALER_NAMESPACE, AUTOSCALER_RELEASE, AUTOSCALER_SERVICE_ACCOUNT

# Reads that AWS does not scope by resource (Auto Scaling and EC2 Describe* take Resource "*").
DESCRIBE_ACTIONS = (
    "autoscaling:DescribeAutoScalingGroups",
    "autoscaling:DescribeAutoScalingInstances",
    "autoscaling:DescribeLaunchConfigurations",
    "autoscaling:DescribeScalingActivities",
    "ec2:DescribeImages",
    "ec2:DescribeInstanceTypes",
    "ec2:DescribeLaunchTemplateVersions",
    "ec2:GetInstanceTypesFromInstanceRequirements",
)
SCALING_ACTIONS = ("autoscaling:SetDesiredCapacity", "autoscaling:TerminateInstanceInAutoScalingGroup")


class ClusterAutoscaler(Construct):
    """Cluster Autoscaler on the system nodes, with AWS access through EKS Pod Identity.

    Args:
        cluster: the EKS cluster.
        cluster_name: the cluster's name (auto-discovery and the IAM scope use it).
        chart_version: the cluster-autoscaler chart version.
        kubernetes_version: the cluster's Kubernetes minor; the autoscaler release follows it.
        scale_down_idle_minutes: how long a node stays unneeded before it is removed.
    """

    def __init__(
        self,
        scope: Construct,
        id_: str,
        *,
        cluster: eks.Cluster,
        cluster_name: str,
        chart_version: str,
        kubernetes_version: str,
        scale_down_idle_minutes: int,
    ) -> None:
        super().__init__(scope, id_)
        stack = Stack.of(self)
        self.service_account = cluster.add_service_account(
            "ClusterAutoscalerServiceAccount",
            name=AUTOSCALER_SERVICE_ACCOUNT,
            namespace=AUTOSCALER_NAMESPACE,
            identity_type=eks.IdentityType.POD_IDENTITY,
        )
        self.statements = [
            iam.PolicyStatement(actions=list(DESCRIBE_ACTIONS), resources=["*"]),
            # Labels and taints of a node group at zero nodes; only this cluster's node groups.
            iam.PolicyStatement(
                actions=["eks:DescribeNodegroup"],
                resources=[f"arn:{stack.partition}:eks:{stack.region}:{stack.account}:nodegroup/{cluster_name}/*/*"],
            ),
            # Scaling: Auto Scaling groups that EKS made for this cluster's managed node groups
            # (named eks-<nodegroup>-<id>, tagged eks:cluster-name=<cluster>).
            iam.PolicyStatement(
                actions=list(SCALING_ACTIONS),
                resources=[
                    f"arn:{stack.partition}:autoscaling:{stack.region}:{stack.account}:autoScalingGroup:*:"
                    "autoScalingGroupName/eks-*"
                ],
                conditions={"StringEquals": {"aws:ResourceTag/eks:cluster-name": cluster_name}},
            ),
        ]
        for statement in self.statements:
            self.service_account.add_to_principal_policy(statement)
        acknowledge(
            self.service_account,
            "AwsSolutions-IAM5[Resource::*]",
            "Auto Scaling and EC2 Describe* calls cannot be scoped to resources; scaling itself is limited to "
            "this cluster's node group Auto Scaling groups by ARN and tag.",
        )
        acknowledge(
            self.service_account,
            f"AwsSolutions-IAM5[Resource::arn:<AWS::Partition>:eks:{stack.region}:{stack.account}:nodegroup/{cluster_name}/*/*]",
            "Node group names are generated at deploy time; the scope is this cluster's node groups only.",
        )
        acknowledge(
            self.service_account,
            f"AwsSolutions-IAM5[Resource::arn:<AWS::Partition>:autoscaling:{stack.region}:{stack.account}:"
            "autoScalingGroup:*:autoScalingGroupName/eks-*]",
            "EKS names its node groups' Auto Scaling groups at deploy time; the eks:cluster-name tag condition "
            "limits scaling to this cluster's groups.",
        )
        self.values = chart_values(
            cluster_name=cluster_name,
            region=stack.region,
            image_tag=CLUSTER_AUTOSCALER_RELEASES[kubernetes_version],
            scale_down_idle_minutes=scale_down_idle_minutes,
        )
        self.addon = HelmAddon(
            self,
            "Chart",
            cluster=cluster,
            pin=CLUSTER_AUTOSCALER,
            version=chart_version,
            namespace=AUTOSCALER_NAMESPACE,
            release=AUTOSCALER_RELEASE,
            values=self.values,
        )
        self.addon.node.add_dependency(self.service_account)
