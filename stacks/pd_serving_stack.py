"""The one stack of an environment: network, cluster, node groups, add-ons, serving app."""

from __future__ import annotations

from typing import Any

from aws_cdk import CfnOutput, Stack
from constructs import Construct

from cdk_constructs import addons
from cdk_constructs.autoscaler import ClusterAutoscaler
from cdk_constructs.cluster import EksCluster
from cdk_constructs.gcs_store import GcsStore
from cdk_constructs.log_groups import EncryptedLogs
from cdk_constructs.model_mirror import ModelMirror
from cdk_constructs.network import Network
from cdk_constructs.node_groups import EfaFabric, GpuNodeGroup, SystemNodeGroup
from cdk_constructs.observability import Observability
from cdk_constructs.ray_service import RayServiceApp
from config.releases import node_releases
from config.schema import AppConfig, DeployFacts, GcsStoreConfig
from config.token_rotation import rotation_of
from config.upgrade import step_of
from manifests.contract import PHASES, RAY_HEAD_SERVICE_ACCOUNT, RAY_WORKER_SERVICE_ACCOUNT
from manifests.finalizers import POD_NETWORK_ADDONS
from manifests.network_policies import network_policies
from manifests.ray_service import ray_service as ray_service_manifest
from manifests.ray_service import streamer_wheels_location


class PdServingStack(Stack):
    def __init__(
        self,
        scope: Construct,
        id_: str,
        *,
        config: AppConfig,
        deployer: DeployFacts | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(scope, id_, **kwargs)
        cluster_config = config.cluster
        deployer = deployer or DeployFacts()
        logs = EncryptedLogs(self, "Logs", description=f"CloudWatch log groups of {config.stack_name}")
        network = Network(self, "Network", config=config.network, logs=logs)
        eks_cluster = EksCluster(
            self,
            "Eks",
            config=cluster_config,
            deployer=deployer,
            cluster_name=config.cluster_name,
            vpc=network.vpc,
            subnets=network.private_subnets,
            logs=logs,
            load_balancer_controller=config.ray_service.endpoint.internal_nlb,
        )
        cluster = eks_cluster.cluster
        cni = eks_cluster.addons["vpc-cni"]

        versions = step_of(cluster_config, deployer)
        releases = node_releases(cluster_config, versions, deployer).releases
        system = SystemNodeGroup(
            self,
            "System",
            cluster=cluster,
            config=cluster_config.system_node_group,
            subnets=network.private_subnets,
            metadata_hop_limit=cluster_config.metadata_hop_limit,
            kubernetes_version=versions.node_groups["system"],
            ami_release=releases["system"],
            tags=config.tags,
            live_size=deployer.node_group_sizes.get("system"),
            replaced="system" in deployer.replaced_node_groups,
        )
        fabric = EfaFabric(self, "EfaFabric", vpc=network.vpc, kept_tags=deployer.placement_group_tags)
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
                kubernetes_version=versions.node_groups[phase],
                ami_release=releases[phase],
                tags=config.tags,
                live_size=deployer.node_group_sizes.get(phase),
                replaced=phase in deployer.replaced_node_groups,
            )
            for phase in PHASES
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
            logs=logs,
            cluster_name=config.cluster_name,
            subnets=network.private_subnets,
            adopted_log_groups=deployer.adopted_log_groups,
        )
        # The collector only becomes ACTIVE once its agents can run on a node.
        observability.node.add_dependency(system.nodegroup)

        charts = config.charts
        autoscaler = ClusterAutoscaler(
            self,
            "ClusterAutoscaler",
            cluster=cluster,
            cluster_name=config.cluster_name,
            chart_version=charts.cluster_autoscaler,
            kubernetes_version=cluster_config.kubernetes_version,
            scale_down_idle_minutes=cluster_config.autoscaling.scale_down_idle_minutes,
        )
        nodegroups = (system.nodegroup, *(g.nodegroup for g in gpu_groups.values()))
        # Removed before any node group on teardown, so that it never scales a group being deleted.
        autoscaler.node.add_dependency(*nodegroups)
        addons.nvidia_device_plugin(self, cluster=cluster, version=charts.nvidia_device_plugin)
        addons.efa_device_plugin(self, cluster=cluster, version=charts.efa_device_plugin)
        self.kuberay = addons.kuberay_operator(self, cluster=cluster, version=charts.kuberay_operator)
        gcs_ft = config.ray_service.gcs_fault_tolerance
        deployed_store = deployer.gcs_store
        gcs_store = None
        if config.gcs_fault_tolerant and gcs_ft.store:
            gcs_store = GcsStore(
                self,
                "GcsStore",
                config=gcs_ft.store,
                multi_az=config.gcs_store_multi_az,
                vpc=network.vpc,
                subnets=network.private_subnets,
                cluster_security_group_id=cluster.cluster_security_group_id,
                deployed=deployed_store,
            )
        elif deployed_store and deployed_store.in_use:
            # Fault tolerance turned off: the RayCluster that serves now keeps its GCS in the store
            # until KubeRay deletes it, minutes after this deploy. The store stays as it is for this
            # deploy (the new RayService no longer names it); the next deploy removes it.
            gcs_store = GcsStore(
                self,
                "GcsStore",
                config=GcsStoreConfig(node_type=deployed_store.node_type),
                multi_az=deployed_store.failover,
                vpc=network.vpc,
                subnets=network.private_subnets,
                cluster_security_group_id=cluster.cluster_security_group_id,
                deployed=deployed_store,
            )
        # The head starts with the token generation the rotation has reached (config/token_rotation.py).
        token_generation = (
            rotation_of(gcs_ft.store.auth_token_generation, deployer.store_token).head_generation
            if (config.gcs_fault_tolerant and gcs_ft.store)
            else 1
        )
        serving = RayServiceApp(
            self,
            "Serving",
            cluster=cluster,
            ray_service=config.ray_service,
            serving=config.serving,
            charts=charts,
            render_manifest=lambda serve_config_v2: ray_service_manifest(
                config,
                serve_config_v2=serve_config_v2,
                head_service_account=RAY_HEAD_SERVICE_ACCOUNT,
                worker_service_account=RAY_WORKER_SERVICE_ACCOUNT,
                gcs_store_host=gcs_store.host if gcs_store and config.gcs_fault_tolerant else None,
                gcs_token_generation=token_generation,
                serving_replicas=deployer.worker_replicas,
            ),
            operator=self.kuberay,
            token_key_arn=deployer.hf_token_kms_key_arn,
            gcs_store=gcs_store,
            streamer_wheels=streamer_wheels_location(config),
            api_key_key_arns=deployer.api_key_kms_key_arns,
            keep_secrets_store=deployer.secrets_store_in_use,
            network_policies=network_policies(config) if config.cluster.network_policies else (),
        )
        mirror = None
        if config.model_mirror.enabled:
            mirror = ModelMirror(
                self,
                "ModelMirror",
                cluster=cluster,
                bucket_name=config.mirror_bucket,
                namespace=config.ray_service.namespace,
                keep_on_destroy=config.mirror_kept_on_destroy,
                namespace_manifest=serving.namespace,
                token_secret=config.serving.model.hf_token_secret,
                token_key_arn=deployer.hf_token_kms_key_arn,
            )
        # Teardown runs in reverse: the RayService is deleted while the nodes and KubeRay still run;
        # then the NLB's Service, whose deletion waits until the load balancer controller has removed
        # the NLB, its security groups and ENIs; only then the controller, the nodes and the VPC.
        serving.manifest.node.add_dependency(*nodegroups)
        if serving.secrets_store:
            # The driver chart's pre-install hook Job, which Helm always waits for, needs a node.
            serving.secrets_store.driver.node.add_dependency(*nodegroups)
        if serving.serve_service:
            serving.serve_service.node.add_dependency(*nodegroups, cluster.alb_controller)
        # The namespace's deletion waits for the finalizers on what is in it (manifests/finalizers.py):
        # KubeRay's, taken off by the operator on the system nodes after its Redis cleanup Job, and
        # the load balancer controller's. So the nodes, what a pod needs to start and to reach the API
        # server and the store (the networking add-ons, Pod Identity's agent) and the controller go
        # after the namespace.
        serving.namespace.node.add_dependency(
            *nodegroups,
            *(eks_cluster.addons[name] for name in POD_NETWORK_ADDONS),
            eks_cluster.pod_identity_agent,
        )
        if cluster.alb_controller:
            serving.namespace.node.add_dependency(cluster.alb_controller)

        # Last, once every construct exists: CDK's provider functions log to groups the stack owns.
        logs.capture_function_logs(self, retention_days=cluster_config.log_retention_days)

        CfnOutput(self, "ClusterName", value=cluster.cluster_name)
        CfnOutput(
            self,
            "UpdateKubeconfigCommand",
            value=f"aws eks update-kubeconfig --region {self.region} --name {cluster.cluster_name}",
        )
        CfnOutput(self, "ClusterSecurityGroupId", value=cluster.cluster_security_group_id)
        CfnOutput(self, "SystemNodeGroup", value=system.nodegroup.nodegroup_name)
        for phase, group in gpu_groups.items():
            CfnOutput(self, f"{phase.title()}NodeGroup", value=group.nodegroup.nodegroup_name)
        CfnOutput(self, "PortForwardCommand", value=serving.port_forward_command)
        CfnOutput(self, "OpenAiBaseUrl", value="http://127.0.0.1:8000/v1 (after the port-forward)")
        CfnOutput(self, "ServedModel", value=config.serving.model.model_id)
        if mirror:
            CfnOutput(self, "ModelMirrorBucket", value=mirror.bucket.bucket_name)
        if gcs_store is not None:
            # What `make deploy` rotates the store's AUTH token with (config/token_rotation.py).
            CfnOutput(self, "GcsStoreAuthTokenSecret", value=gcs_store.auth_token.secret_arn)
            CfnOutput(self, "GcsStoreReplicationGroup", value=gcs_store.replication_group.ref)
        if gcs_store:
            CfnOutput(self, "GcsStoreEndpoint", value=gcs_store.host)
        if observability.workspace_arn:
            CfnOutput(self, "PrometheusWorkspaceArn", value=observability.workspace_arn)
        self.config = config
        self.cluster = cluster
        self.serving = serving
        self.network = network
        self.gpu_groups = gpu_groups
        self.autoscaler = autoscaler
        self.mirror = mirror
        self.gcs_store = gcs_store
