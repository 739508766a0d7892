"""The VPC: private subnets for nodes, NAT per config, flow logs, and endpoints for image pulls."""

from __future__ import annotations

from aws_cdk import Tags
from aws_cdk import aws_ec2 as ec2
from constructs import Construct

from cdk_constructs.log_groups import EncryptedLogs
from cdk_constructs.policy import acknowledge_cloudformation_only_functions, cdk_provider
from config.schema import NetworkConfig

_INTERFACE_SERVICES = {
    "ecr.api": ec2.InterfaceVpcEndpointAwsService.ECR,
    "ecr.dkr": ec2.InterfaceVpcEndpointAwsService.ECR_DOCKER,
    "sts": ec2.InterfaceVpcEndpointAwsService.STS,
    "eks": ec2.InterfaceVpcEndpointAwsService.EKS,
    "eks-auth": ec2.InterfaceVpcEndpointAwsService.EKS_AUTH,
    "logs": ec2.InterfaceVpcEndpointAwsService.CLOUDWATCH_LOGS,
    "secretsmanager": ec2.InterfaceVpcEndpointAwsService.SECRETS_MANAGER,
}


class Network(Construct):
    """A VPC with public subnets (NAT, optional load balancers) and private subnets for nodes.

    Args:
        config: the network section of the environment's config.
        logs: the stack's encrypted log groups (flow logs go to one of them).
    """

    def __init__(self, scope: Construct, id_: str, *, config: NetworkConfig, logs: EncryptedLogs) -> None:
        super().__init__(scope, id_)
        self.vpc = ec2.Vpc(
            self,
            "Vpc",
            ip_addresses=ec2.IpAddresses.cidr(config.vpc_cidr),
            availability_zones=list(config.availability_zones),
            nat_gateways=config.nat_gateways,
            subnet_configuration=[
                # Only NAT gateways (Elastic IPs) and load balancers (addresses of their own) live in the
                # public subnets; an instance launched there by mistake gets no public address.
                ec2.SubnetConfiguration(
                    name="Public", subnet_type=ec2.SubnetType.PUBLIC, cidr_mask=24, map_public_ip_on_launch=False
                ),
                ec2.SubnetConfiguration(
                    name="Private",
                    subnet_type=(
                        ec2.SubnetType.PRIVATE_WITH_EGRESS if config.nat_gateways else ec2.SubnetType.PRIVATE_ISOLATED
                    ),
                    cidr_mask=20,
                ),
            ],
            restrict_default_security_group=True,
        )
        acknowledge_cloudformation_only_functions(
            cdk_provider(self, "Custom::VpcRestrictDefaultSGCustomResourceProvider"),
            outside_vpc="It calls only the EC2 API, once per stack operation, to empty the default security "
            "group; inside the VPC it would depend on the NAT or an EC2 endpoint of the VPC it configures.",
        )
        flow_log_group = logs.log_group(self, "FlowLogs", retention_days=config.flow_log_retention_days)
        self.vpc.add_flow_log(
            "FlowLog",
            destination=ec2.FlowLogDestination.to_cloud_watch_logs(flow_log_group),
            traffic_type=ec2.FlowLogTrafficType.ALL,
        )
        self.private_subnets = self.vpc.select_subnets(subnet_group_name="Private").subnets
        # The AWS Load Balancer Controller finds subnets for internal load balancers by this tag.
        for subnet in self.private_subnets:
            Tags.of(subnet).add("kubernetes.io/role/internal-elb", "1")
        for subnet in self.vpc.public_subnets:
            Tags.of(subnet).add("kubernetes.io/role/elb", "1")
        self.vpc.add_gateway_endpoint("S3", service=ec2.GatewayVpcEndpointAwsService.S3)
        for name in config.interface_endpoints:
            endpoint = self.vpc.add_interface_endpoint(
                name.replace(".", "-").title().replace("-", ""),
                service=_INTERFACE_SERVICES[name],
                subnets=ec2.SubnetSelection(subnet_group_name="Private"),
                private_dns_enabled=True,
                open=False,
            )
            # HTTPS from inside the VPC only, written as a literal CIDR rather than a token.
            endpoint.connections.allow_from(ec2.Peer.ipv4(config.vpc_cidr), ec2.Port.tcp(443), "HTTPS from the VPC")
        self.gpu_subnet = self._subnet_in(config.gpu_availability_zone)

    def _subnet_in(self, zone: str) -> ec2.ISubnet:
        for subnet in self.private_subnets:
            if subnet.availability_zone == zone:
                return subnet
        raise ValueError(f"network.gpu_availability_zone: no private subnet in {zone}")
