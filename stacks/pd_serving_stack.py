"""The one stack of an environment: network, cluster, node groups, add-ons, serving app."""

from __future__ import annotations

from typing import Any

from aws_cdk import CfnOutput, Stack
from constructs import Construct

from cdk_constructs import addons
from cdk_constructs.cluster import EksCluster
from cdk_constructs.network import Network
from cdk_constructs.observability import Observability
from cdk_constructs.ray_service import RayServiceApp
from cdk_constructs.node_groups import EfaFabric, GpuNodeGroup, SystemNodeGroup
from config.schema import AppConfig


class PdServingStack(Stack):
    def __init__(self, scope: Construct, id_: str, *, config: AppConfig, **kwargs: Any) -> None:
        super().__init__(scope, id_, **kwargs)
        cluster_config = config.cluster
        network = Network(self, "Network", config=config.network)
        eks_cluster = EksCluster(
            self,
            "Eks",
            config=cluster_config,
            cluster_name=config.cluster_name,
            vpc=network.vpc,
            subnets=network.private_subnets,
            load_balancer_controller=config.ray_service.endpoint.internal_nlb,
        )
        cluster = eks_cluster.cluster
        cni = eks_cluster.addons["vpc-cni"]

        system = SystemNodeGroup(
            self,
            "System",
            cluster=cluster,
            config=cluster_config.system_node_group,
            subnets=network.private_subnets,
            metadata_hop_limit=cluster_config.metadata_hop_limit,
        )
        fabric = EfaFabric(self, "EfaFabric", vpc=network.vpc)
        gpu_groups = {
            phase: GpuNodeGroup(
                self,
                phase.title(),
                cluster=cluster,
                phase=phase,
                config=getattr(cluster_config.gpu_node_groups, phase),
                fabric=fabric,
                subnet=network.gpu_subnet,
                metadata_hop_limit=cluster_config.metadata_hop_limit,
            )
            for phase in ("prefill", "decode")
        }
        for group in (system, *gpu_groups.values()):
            group.node.add_dependency(cni)
        eks_cluster.add_coredns_after(system.nodegroup)

        observability = Observability(
            self,
            "Observability",
            cluster=cluster,
            config=config.observability,
            namespace=config.ray_service.namespace,
            dashboard_name=f"{config.name}-pd-serving",
            subnets=network.private_subnets,
        )
        # The collector only becomes ACTIVE once its agents can run on a node.
        observability.node.add_dependency(system.nodegroup)

        charts = config.charts
        addons.nvidia_device_plugin(self, cluster=cluster, version=charts.nvidia_device_plugin)
        addons.efa_device_plugin(self, cluster=cluster, version=charts.efa_device_plugin)
        self.kuberay = addons.kuberay_operator(
            self, cluster=cluster, version=charts.kuberay_operator
        )
        serving = RayServiceApp(self, "Serving", cluster=cluster, config=config, operator=self.kuberay)
        # Teardown runs in reverse: the RayService (and any load balancer its Service owns) is
        # deleted while the nodes, KubeRay and the load balancer controller still run, so the
        # controller removes the NLB, its security groups and ENIs before the VPC goes.
        serving.manifest.node.add_dependency(system.nodegroup, *(g.nodegroup for g in gpu_groups.values()))
        if cluster.alb_controller:
            serving.manifest.node.add_dependency(cluster.alb_controller)

        CfnOutput(self, "ClusterName", value=cluster.cluster_name)
        CfnOutput(
            self,
            "UpdateKubeconfigCommand",
            value=f"aws eks update-kubeconfig --region {self.region} --name {cluster.cluster_name}",
        )
        CfnOutput(self, "SystemNodeGroup", value=system.nodegroup.nodegroup_name)
        for phase, group in gpu_groups.items():
            CfnOutput(self, f"{phase.title()}NodeGroup", value=group.nodegroup.nodegroup_name)
        CfnOutput(self, "PortForwardCommand", value=serving.port_forward_command)
        CfnOutput(self, "OpenAiBaseUrl", value="http://127.0.0.1:8000/v1 (after the port-forward)")
        CfnOutput(self, "ServedModel", value=config.serving.model.model_id)
        if observability.workspace_arn:
            CfnOutput(self, "PrometheusWorkspaceArn", value=observability.workspace_arn)
        self.config = config
        self.cluster = cluster
        self.serving = serving
        self.network = network
        self.gpu_groups = gpu_groups
