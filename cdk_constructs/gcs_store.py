"""The Ray GCS's fault-tolerance store: Amazon ElastiCache for Valkey in the VPC's private subnets.

TLS in transit (required, not preferred), encryption at rest, and an AUTH token that the stack
generates in Secrets Manager and hands to ElastiCache as a CloudFormation dynamic reference
(``{{resolve:secretsmanager:…}}``): the value is in no template. The head pod reads the same secret
through the Secrets Store CSI driver (``manifests.gcs_store``). Only the cluster security group (every
node's, so the head's pod IP) reaches port 6379.

Ray's GCS verifies the server's certificate (hiredis ``redisCreateSSLContext``, ``SSL_VERIFY_PEER``)
against the CA file ``RAY_REDIS_CA_CERT`` names; without one it falls back to the default paths of
the BoringSSL linked into ``gcs_server`` (``/etc/ssl/cert.pem``), which are not the image's. So the
head names the image's CA bundle (``manifests.gcs_store.tls_env``, the path the image's facts give:
``config.versions.SERVING_IMAGES``, or the config's ``ray_service.image_ca_bundle``); ElastiCache's in-transit certificates chain to
Amazon's public root CAs, which it holds.

What the store holds is the GCS's metadata of one RayCluster (under a key prefix named by the
RayCluster's UID), not user data: it is deleted with the stack, keeps no snapshots, and a single
node outside production is enough (a store outage then stops the head until the node is back).
"""

from __future__ import annotations

import aws_cdk as cdk
from aws_cdk import aws_ec2 as ec2
from aws_cdk import aws_elasticache as elasticache
from aws_cdk import aws_secretsmanager as secretsmanager
from constructs import Construct

from cdk_constructs.policy import acknowledge, acknowledge_checkov
from config.schema import DeployedGcsStore, GcsStoreConfig
from config.versions import GCS_STORE_ENGINE, GCS_STORE_ENGINE_VERSION
from manifests.gcs_store import STORE_PORT

SECRET = "AWS::SecretsManager::Secret"


def replication_step(*, multi_az: bool, deployed: DeployedGcsStore | None) -> tuple[int, bool]:
    """(NumCacheClusters, AutomaticFailoverEnabled) for this deploy: the config's shape, or the step
    towards it that ElastiCache accepts from the deployed one.

    ElastiCache refuses to turn automatic failover on in the update that adds its replica
    (ModifyReplicationGroup, InvalidParameterCombination: "must have at least one read replica to
    enable autofailover"; CloudFormation applies both in one call, cloudformation-coverage-roadmap
    #383), and to take the last replica away while failover is on ("When using automatic failover,
    there must be at least 2 cache clusters in the replication group"). So both ways pass through two
    nodes without failover: one deploy adds the replica (or turns failover off), the next turns
    failover on (or removes the replica).
    """
    target = (2, True) if multi_az else (1, False)
    if deployed is None:
        return target
    if target == (2, True) and deployed.nodes < 2:
        return 2, False
    if target == (1, False) and deployed.failover:
        return 2, False
    return target


class GcsStore(Construct):
    """An ElastiCache (Valkey) replication group for the GCS, its subnet group, security group and AUTH token.

    Args:
        config: the store's section (``ray_service.gcs_fault_tolerance.store``).
        multi_az: a replica in a second zone with automatic failover (``AppConfig.gcs_store_multi_az``).
        deployed: the replication group as the deployed template holds it (``DeployFacts.gcs_store``);
            a change of ``multi_az`` then takes the step ElastiCache accepts (``replication_step``).
        vpc: the VPC.
        subnets: the private subnets (one per availability zone) the nodes may be placed in.
        cluster_security_group_id: the EKS cluster security group, which every node carries.

    ``host`` is the primary endpoint's address (a CloudFormation token), ``auth_token`` the secret.
    Whoever wires the stack makes the RayService's namespace depend on this construct, so that the
    store outlives KubeRay's Redis cleanup Job on teardown.
    """

    def __init__(
        self,
        scope: Construct,
        id_: str,
        *,
        config: GcsStoreConfig,
        multi_az: bool,
        vpc: ec2.IVpc,
        subnets: list[ec2.ISubnet],
        cluster_security_group_id: str,
        deployed: DeployedGcsStore | None = None,
    ) -> None:
        super().__init__(scope, id_)
        stack = cdk.Stack.of(self)
        self.auth_token = secretsmanager.Secret(
            self,
            "AuthToken",
            description=f"AUTH token of {stack.stack_name}'s GCS store (ElastiCache); the Ray head reads it",
            # ElastiCache takes 16-128 printable characters without spaces, '"', '/' or '@'.
            generate_secret_string=secretsmanager.SecretStringGenerator(
                password_length=64, exclude_punctuation=True, include_space=False
            ),
            removal_policy=cdk.RemovalPolicy.DESTROY,
        )
        self.subnet_group = elasticache.CfnSubnetGroup(
            self,
            "SubnetGroup",
            description=f"Private subnets of {stack.stack_name}'s GCS store",
            subnet_ids=[subnet.subnet_id for subnet in subnets],
        )
        self.security_group = ec2.SecurityGroup(
            self,
            "SecurityGroup",
            vpc=vpc,
            description="GCS store: Valkey over TLS from the cluster nodes only",
            allow_all_outbound=False,
        )
        self.security_group.add_ingress_rule(
            ec2.Peer.security_group_id(cluster_security_group_id),
            ec2.Port.tcp(STORE_PORT),
            "Ray GCS on the head pod (cluster security group) to Valkey over TLS",
        )
        nodes, failover = replication_step(multi_az=multi_az, deployed=deployed)
        self.replication_group = elasticache.CfnReplicationGroup(
            self,
            "ReplicationGroup",
            replication_group_description=f"Ray GCS fault tolerance of {stack.stack_name}",
            engine=GCS_STORE_ENGINE,
            engine_version=GCS_STORE_ENGINE_VERSION,
            cache_node_type=config.node_type,
            # Cluster mode disabled: one shard, a primary and (multi-AZ) one replica.
            num_cache_clusters=nodes,
            automatic_failover_enabled=failover,
            multi_az_enabled=failover,
            port=STORE_PORT,
            cache_subnet_group_name=self.subnet_group.ref,
            security_group_ids=[self.security_group.security_group_id],
            transit_encryption_enabled=True,
            transit_encryption_mode="required",
            at_rest_encryption_enabled=True,
            # A dynamic reference that CloudFormation resolves; the template holds no value.
            auth_token=self.auth_token.secret_value.unsafe_unwrap(),
            auto_minor_version_upgrade=True,
            snapshot_retention_limit=0,
        )
        self.replication_group.apply_removal_policy(cdk.RemovalPolicy.DESTROY)
        self.host: str = self.replication_group.attr_primary_end_point_address
        self._acknowledge(failover)

    def _acknowledge(self, multi_az: bool) -> None:
        if not multi_az:
            acknowledge(
                self.replication_group,
                "AwsSolutions-AEC4",
                "Outside production the store is one node (gcs_fault_tolerance.store.multi_az): losing it stops "
                "the head until ElastiCache replaces the node; set multi_az: true for a replica with failover.",
            )
        rotation = (
            "ElastiCache reads the token at deploy time only; rotating it needs ModifyReplicationGroup "
            "(AuthTokenUpdateStrategy ROTATE, then SET) around a head restart, which a Secrets Manager rotation "
            "Lambda cannot do: `make deploy` takes those steps when store.auth_token_generation is raised "
            "(config/token_rotation.py)."
        )
        acknowledge(self.auth_token, "AwsSolutions-SMG4", rotation)
        acknowledge_checkov(
            self,
            "CKV_AWS_149",
            "Only the head's Pod Identity role (through the CSI provider) and CloudFormation read it; the "
            "AWS-managed key needs no key policy or kms grant for that role.",
            resource_type=SECRET,
        )
