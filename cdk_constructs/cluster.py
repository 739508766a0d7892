"""The EKS control plane (aws_eks_v2), its kubectl provider, access entries and managed add-ons."""

from __future__ import annotations

import importlib

from aws_cdk import Duration, RemovalPolicy
from aws_cdk import aws_ec2 as ec2
from aws_cdk import aws_eks_v2 as eks
from aws_cdk import aws_kms as kms
from constructs import Construct

from cdk_constructs.log_groups import EncryptedLogs
from cdk_constructs.policy import (
    acknowledge,
    acknowledge_checkov,
    acknowledge_cloudformation_only_functions,
    acknowledge_guard,
    cdk_provider,
    managed_policy_finding,
)
from config.releases import addon_versions
from config.schema import UNRESOLVED_DEPLOYER_CIDR, ClusterConfig, DeployFacts
from config.versions import AWS_LOAD_BALANCER_CONTROLLER, KUBERNETES_RELEASES
from manifests.observability import control_plane_log_group

ALL_LOG_TYPES = [
    eks.ClusterLoggingTypes.API,
    eks.ClusterLoggingTypes.AUDIT,
    eks.ClusterLoggingTypes.AUTHENTICATOR,
    eks.ClusterLoggingTypes.CONTROLLER_MANAGER,
    eks.ClusterLoggingTypes.SCHEDULER,
]

# Managed so that EKS patches them; vpc-cni and kube-proxy run on every node as DaemonSets,
# coredns needs a node to become ACTIVE, so it is created after the system node group.
NODE_INDEPENDENT_ADDONS = ("vpc-cni", "kube-proxy")

_ELB = "arn:<AWS::Partition>:elasticloadbalancing:*:*"
LOAD_BALANCER_CONTROLLER_WILDCARDS = (
    "*",
    "arn:<AWS::Partition>:ec2:*:*:security-group/*",
    f"{_ELB}:targetgroup/*/*",
    f"{_ELB}:loadbalancer/net/*/*",
    f"{_ELB}:loadbalancer/app/*/*",
    f"{_ELB}:listener/net/*/*/*",
    f"{_ELB}:listener/app/*/*/*",
    f"{_ELB}:listener-rule/net/*/*/*",
    f"{_ELB}:listener-rule/app/*/*/*",
)


def kubectl_layer(scope: Construct, kubernetes_version: str):
    """The kubectl/helm Lambda layer that matches the cluster's Kubernetes version."""
    release = KUBERNETES_RELEASES[kubernetes_version]
    module = importlib.import_module(release.layer_module)
    return getattr(module, release.layer_class)(scope, "KubectlLayer")


def public_cidrs(config: ClusterConfig, deployer: DeployFacts) -> list[str]:
    """The configured CIDRs, plus the deployer's address when the config asks for it."""
    cidrs = list(config.endpoint.public_cidrs)
    if config.endpoint.allow_deployer_address:
        address = deployer.deployer_cidr or UNRESOLVED_DEPLOYER_CIDR
        if address not in cidrs:
            cidrs.append(address)
    return cidrs


def admin_principals(config: ClusterConfig, deployer: DeployFacts) -> list[str]:
    """The configured admins, plus whoever runs `make deploy` when the config asks for it."""
    principals = list(config.admin_principals)
    if config.grant_deployer_admin and deployer.deployer_principal and deployer.deployer_principal not in principals:
        principals.append(deployer.deployer_principal)
    return principals


def access_entry_id(principal: str) -> str:
    """The construct id of a principal's access entry: its ARN, so that an entry's logical id depends on
    its principal alone, never on its position in the list (construct ids may not hold "/")."""
    account, resource = principal.split(":")[4], principal.split(":", 5)[5]
    return f"Admin:{account}:{resource.replace('/', '.')}"


def endpoint_access(config: ClusterConfig, deployer: DeployFacts) -> eks.EndpointAccess:
    if config.endpoint.public and config.endpoint.private:
        return eks.EndpointAccess.PUBLIC_AND_PRIVATE.only_from(*public_cidrs(config, deployer))
    if config.endpoint.public:
        return eks.EndpointAccess.PUBLIC.only_from(*public_cidrs(config, deployer))
    return eks.EndpointAccess.PRIVATE


class EksCluster(Construct):
    """An EKS cluster without default capacity; node groups are added by their own constructs.

    Args:
        config: the cluster section of the environment's config.
        deployer: who runs `make deploy` and from where (empty at offline synth).
        cluster_name: the EKS cluster name.
        vpc: the VPC; the control plane's ENIs go into ``subnets``.
        subnets: private subnets for the control plane's network interfaces.
        logs: the stack's encrypted log groups (the control plane's is one of them).
        load_balancer_controller: install the AWS Load Balancer Controller (for an internal NLB).
    """

    def __init__(
        self,
        scope: Construct,
        id_: str,
        *,
        config: ClusterConfig,
        deployer: DeployFacts,
        cluster_name: str,
        vpc: ec2.IVpc,
        subnets: list[ec2.ISubnet],
        logs: EncryptedLogs,
        load_balancer_controller: bool = False,
    ) -> None:
        super().__init__(scope, id_)
        # EKS writes control-plane logs here and would create it with no expiry, left behind on destroy.
        self.control_plane_logs = logs.log_group(
            self,
            "ControlPlaneLogs",
            name=control_plane_log_group(cluster_name),
            retention_days=config.log_retention_days,
        )
        self.secrets_key = kms.Key(
            self,
            "SecretsKey",
            description=f"Envelope encryption of Kubernetes secrets in {cluster_name}",
            enable_key_rotation=True,
            # `make destroy` leaves nothing behind; KMS still waits this long before deleting.
            removal_policy=RemovalPolicy.DESTROY,
            pending_window=Duration.days(7),
        )
        acknowledge_guard(
            self.secrets_key,
            "kms_create_grant_aws_service_check",
            "EKS creates a grant on this key when it creates the cluster; whether that call counts as an AWS "
            "service's (kms:GrantIsForAWSResource) cannot be shown without an account, and a Deny that catches "
            "it fails the cluster's creation.",
            resource_type="AWS::KMS::Key",
        )
        self.cluster = eks.Cluster(
            self,
            "Cluster",
            cluster_name=cluster_name,
            version=eks.KubernetesVersion.of(config.kubernetes_version),
            vpc=vpc,
            vpc_subnets=[ec2.SubnetSelection(subnets=subnets)],
            default_capacity=0,
            default_capacity_type=eks.DefaultCapacityType.NODEGROUP,
            endpoint_access=endpoint_access(config, deployer),
            cluster_logging=ALL_LOG_TYPES,
            secrets_encryption_key=self.secrets_key,
            bootstrap_self_managed_addons=False,
            kubectl_provider_options=eks.KubectlProviderOptions(
                kubectl_layer=kubectl_layer(self, config.kubernetes_version)
            ),
            alb_controller=(
                eks.AlbControllerOptions(version=getattr(eks.AlbControllerVersion, AWS_LOAD_BALANCER_CONTROLLER))
                if load_balancer_controller
                else None
            ),
        )
        self.cluster.node.add_dependency(self.control_plane_logs)
        # EKS gives the cluster's creator, here CloudFormation's execution role (AdministratorAccess), a
        # cluster-admin access entry unless this is false ("The default value is true"). kubectl work
        # goes through the kubectl provider's own access entry, which aws-cdk-lib creates and waits for.
        # Create-only: a cluster that exists keeps its creator's entry rather than be replaced.
        if not deployer.cluster_has_bootstrap_admin:
            self.cluster.node.default_child.add_property_override(
                "AccessConfig.BootstrapClusterCreatorAdminPermissions", False
            )
        if config.endpoint.public:
            acknowledge_guard(
                self.cluster,
                "eks_endpoint_no_public_access_check",
                "The config opens the public API endpoint to its listed CIDRs and, with allow_deployer_address, "
                "the deployer's /32 only; set cluster.endpoint.public: false (as prod does) for private access alone.",
                resource_type="AWS::EKS::Cluster",
            )
        self._acknowledge_cdk_managed_parts()
        if self.cluster.alb_controller:
            self._acknowledge_load_balancer_controller(self.cluster.alb_controller)
        for principal in admin_principals(config, deployer):
            entry_id = access_entry_id(principal)
            self.cluster.grant_access(
                entry_id,
                principal,
                [
                    eks.AccessPolicy.from_access_policy_name(
                        "AmazonEKSClusterAdminPolicy",
                        access_scope_type=eks.AccessScopeType.CLUSTER,
                    )
                ],
            )
            entry = self.cluster.node.find_child(entry_id)
            deployed_id = deployer.access_entry_ids.get(principal)
            if deployed_id:
                entry.node.default_child.override_logical_id(deployed_id)
            # Every manifest and chart waits for aws_eks_v2's kubectl barrier: behind it, the admins' entries
            # are deleted only after every Kubernetes object, so a destroy that stalls on a finalizer
            # leaves them the kubectl to lift it with.
            self.cluster.node.find_child("KubectlReadyBarrier").node.add_dependency(entry)
        # The control plane's add-ons move with it, in the deploy that moves it (config/releases.py).
        self.addon_versions = addon_versions(
            control_plane=config.kubernetes_version, overrides=config.addon_versions, live=deployer.addon_versions
        )
        self.addons = {
            name: eks.Addon(
                self,
                _addon_id(name),
                addon_name=name,
                cluster=self.cluster,
                addon_version=self.addon_versions.get(name),
                configuration_values=addon_configuration(name, config) or None,
            )
            for name in NODE_INDEPENDENT_ADDONS
        }
        # Pod Identity's agent is created through the cluster so that service accounts
        # with IdentityType.POD_IDENTITY reuse it instead of adding a second one.
        self.pod_identity_agent = self.cluster.eks_pod_identity_agent
        if "eks-pod-identity-agent" in self.addon_versions:
            self.pod_identity_agent.node.default_child.add_property_override(
                "AddonVersion", self.addon_versions["eks-pod-identity-agent"]
            )

    def _acknowledge_cdk_managed_parts(self) -> None:
        acknowledge(
            self.cluster.role,
            managed_policy_finding("AmazonEKSClusterPolicy"),
            "EKS requires this AWS managed policy on the cluster role; AWS keeps it current.",
        )
        provider = self.cluster.kubectl_provider
        reason = (
            "CDK's kubectl provider (Lambda handler and provider framework) is created and "
            "maintained by aws-cdk-lib; its roles use the AWS managed policies CDK attaches."
        )
        for policy in (
            "service-role/AWSLambdaBasicExecutionRole",
            "service-role/AWSLambdaVPCAccessExecutionRole",
            "AmazonEC2ContainerRegistryReadOnly",
        ):
            acknowledge(provider, managed_policy_finding(policy), reason)
        acknowledge(
            provider,
            'AwsSolutions-IAM4[Policy::{"Fn::If":["EksClusterKubectlProviderHandlerHasEcrPublicC426D1A5",'
            '{"Fn::Join":["",["arn:",{"Ref":"AWS::Partition"},":iam::aws:policy/'
            'AmazonElasticContainerRegistryPublicReadOnly"]]},{"Ref":"AWS::NoValue"}]}]',
            reason,
        )
        acknowledge(
            provider,
            "AwsSolutions-IAM5[Resource::<EksClusterKubectlProviderHandlerDA75FB7A.Arn>:*]",
            "The provider framework invokes every version of its own handler (ARN:*), as CDK builds it.",
        )
        acknowledge(
            provider,
            "AwsSolutions-L1",
            "The kubectl handler's runtime is pinned by aws-cdk-lib to match its kubectl layer.",
        )
        acknowledge_cloudformation_only_functions(provider)
        function = "AWS::Lambda::Function"
        acknowledge_checkov(
            provider,
            "CKV_AWS_173",
            "The environment holds no secret (the STS endpoint mode, the handler's function ARN); Lambda "
            "encrypts it at rest with its AWS managed key.",
            resource_type=function,
        )
        acknowledge_guard(
            provider,
            "lambda_inside_vpc_check",
            "Both functions run in the VPC's private subnets with the cluster security group; the rule only "
            "accepts groups declared as AWS::EC2::SecurityGroup, and EKS creates this one (a GetAtt of the cluster).",
            resource_type=function,
        )

    @staticmethod
    def _acknowledge_load_balancer_controller(controller: Construct) -> None:
        reason = (
            "This is AWS's published IAM policy for the AWS Load Balancer Controller, shipped by "
            "aws-cdk-lib; it manages load balancers and groups whose ARNs exist only at runtime."
        )
        for resource in LOAD_BALANCER_CONTROLLER_WILDCARDS:
            acknowledge(controller, f"AwsSolutions-IAM5[Resource::{resource}]", reason)
        acknowledge_checkov(controller, "CKV_AWS_111", reason, resource_type="AWS::IAM::Policy")
        # The controller's service account uses IRSA, whose OIDC provider and the CfnJson behind its
        # trust policy are aws-cdk-lib singletons at the stack's root.
        oidc = cdk_provider(controller, "Custom::AWSCDKOpenIdConnectProviderCustomResourceProvider")
        acknowledge_cloudformation_only_functions(
            oidc,
            outside_vpc="It calls only the IAM API (global, public) to manage the cluster's OIDC provider, "
            "once per stack operation; aws-cdk-lib runs it outside any VPC.",
        )
        acknowledge_checkov(
            oidc,
            "CKV_AWS_109",
            "aws-cdk-lib's OIDC provider function manages IAM OIDC providers, whose ARNs exist only once it "
            "creates them; its five actions touch nothing but OIDC providers.",
            resource_type="AWS::IAM::Role",
        )
        acknowledge_cloudformation_only_functions(
            cdk_provider(controller, "AWSCDKCfnUtilsProviderCustomResourceProvider"),
            outside_vpc="It calls no AWS API at all: it renders JSON for the service account's trust policy "
            "during stack operations.",
        )

    def add_coredns_after(self, node_group: Construct) -> eks.Addon:
        """coredns stays DEGRADED (and its stack update fails) until a node can run it."""
        coredns = eks.Addon(
            self,
            "CoreDns",
            addon_name="coredns",
            cluster=self.cluster,
            addon_version=self.addon_versions.get("coredns"),
        )
        coredns.node.add_dependency(node_group)
        self.addons["coredns"] = coredns
        return coredns


def addon_configuration(name: str, config: ClusterConfig) -> dict[str, str]:
    """An add-on's configurationValues: the VPC CNI's network policy agent when policies are on
    (enableNetworkPolicy: the agent container beside aws-node on every node, standard mode: a new pod
    is open for the seconds until its policies are in place, not refused until then)."""
    if name == "vpc-cni" and config.network_policies:
        return {"enableNetworkPolicy": "true"}
    return {}


def _addon_id(name: str) -> str:
    return "".join(part.title() for part in name.split("-"))
