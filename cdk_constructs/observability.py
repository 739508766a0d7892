"""Scraping Ray's and vLLM's Prometheus metrics per phase, into CloudWatch or Amazon Managed Prometheus.

The scrape configuration and the agent's values are data (``manifests.observability``); this
construct installs the backend, its IAM and log groups, and the per-phase dashboard.
"""

from __future__ import annotations

import json
from collections.abc import Sequence

import yaml
from aws_cdk import Stack
from aws_cdk import aws_aps as aps
from aws_cdk import aws_cloudwatch as cloudwatch
from aws_cdk import aws_ec2 as ec2
from aws_cdk import aws_eks_v2 as eks
from aws_cdk import aws_iam as iam
from aws_cdk import aws_logs as logs
from constructs import Construct

from cdk_constructs.log_groups import EncryptedLogs
from cdk_constructs.policy import acknowledge, managed_policy_finding
from config.schema import ObservabilityConfig
from manifests import dashboards
from manifests.observability import (
    CLOUDWATCH_ADDON,
    CLOUDWATCH_SERVICE_ACCOUNT,
    CONTAINER_INSIGHTS_LOG_GROUPS,
    EMF_NAMESPACE,
    cloudwatch_addon_values,
    container_insights_log_group,
    scrape_config,
    scraper_log_group,
    scraper_rbac,
)


class Observability(Construct):
    """Collects the Ray pods' metrics into the configured backend and adds the per-phase dashboard.

    Args:
        cluster: the EKS cluster (Pod Identity agent created through it).
        config: the observability section of the environment's config.
        namespace: namespace of the RayService whose pods are scraped.
        dashboard_name: name of the CloudWatch dashboard (backend cloudwatch).
        subnets: subnets for the AMP scraper's network interfaces (backend amp); they must reach
            the pods.
        logs: the stack's encrypted log groups (the backend's own log group is one of them).
        cluster_name: the cluster's name, which the Container Insights groups are named after.
        adopted_log_groups: Container Insights groups that exist outside the deployed stack (the running
            add-on made them; ``DeployFacts.adopted_log_groups``): this deploy imports them as they are.
    """

    def __init__(
        self,
        scope: Construct,
        id_: str,
        *,
        cluster: eks.Cluster,
        config: ObservabilityConfig,
        namespace: str,
        dashboard_name: str,
        logs: EncryptedLogs,
        cluster_name: str,
        subnets: Sequence[ec2.ISubnet] = (),
        adopted_log_groups: Sequence[str] = (),
    ) -> None:
        super().__init__(scope, id_)
        self.config = config
        self.logs = logs
        self.scrape_config = scrape_config(namespace=namespace, interval_seconds=config.scrape_interval_seconds)
        self.addon: eks.CfnAddon | None = None
        self.dashboard: cloudwatch.CfnDashboard | None = None
        self.workspace_arn: str | None = None
        self.scraper: aps.CfnScraper | None = None
        self.grafana_dashboard_file = dashboards.GRAFANA_FILE if config.backend == "amp" else None
        if config.backend == "cloudwatch":
            self._cloudwatch(cluster, dashboard_name, cluster_name=cluster_name, adopted=adopted_log_groups)
        elif config.backend == "amp":
            if not subnets:
                raise ValueError(
                    "observability.backend amp needs subnets for the scraper; pass the cluster's private subnets"
                )
            self._amp(cluster, subnets)

    def _log_group(self, name: str) -> logs.LogGroup:
        return self.logs.log_group(self, "LogGroup", name=name, retention_days=self.config.log_retention_days)

    def _container_insights_group(self, name: str, *, cluster_name: str, adopted: Sequence[str]) -> logs.LogGroup:
        # Named literally (the add-on writes to the cluster's name): an import needs a fixed name.
        full_name = container_insights_log_group(cluster_name, name)
        if full_name in adopted:
            return self.logs.adopted_log_group(self, f"{name.title()}LogGroup", name=full_name)
        return self.logs.log_group(
            self, f"{name.title()}LogGroup", name=full_name, retention_days=self.config.log_retention_days
        )

    def _cloudwatch(
        self, cluster: eks.Cluster, dashboard_name: str, *, cluster_name: str, adopted: Sequence[str]
    ) -> None:
        # Created here, with a retention, before the agent would create it without one.
        log_group = self._log_group(container_insights_log_group(cluster.cluster_name, "prometheus"))
        # The add-on's CloudWatch agent (performance) and Fluent Bit (application, host, dataplane)
        # write to these fixed names and create any that is missing: unencrypted, never expiring,
        # and left behind by destroy (AWS Knowledge Center, "enable Container Insights metrics on an
        # EKS cluster"; CloudWatch user guide, "Container Insights performance log reference" and
        # "Set up Fluent Bit as a DaemonSet to send logs to CloudWatch Logs"). Made by the stack
        # before the add-on, they are the stack's: encrypted, expiring, deleted on destroy. One the
        # running add-on made before the stack owned it is imported (its agents recreate a deleted
        # group within seconds, so it cannot be deleted first).
        container_insights = [
            self._container_insights_group(name, cluster_name=cluster_name, adopted=adopted)
            for name in CONTAINER_INSIGHTS_LOG_GROUPS
        ]
        self.agent_role = iam.Role(
            self,
            "AgentRole",
            assumed_by=iam.SessionTagsPrincipal(iam.ServicePrincipal("pods.eks.amazonaws.com")),
            managed_policies=[iam.ManagedPolicy.from_aws_managed_policy_name("CloudWatchAgentServerPolicy")],
        )
        acknowledge(
            self.agent_role,
            managed_policy_finding("CloudWatchAgentServerPolicy"),
            "AWS's managed policy for the CloudWatch agent: it writes metrics and logs to names that "
            "Container Insights chooses at runtime; AWS keeps it current with the agent.",
        )
        values = cloudwatch_addon_values(
            cluster_name=cluster.cluster_name, log_group_name=log_group.log_group_name, scrape=self.scrape_config
        )
        self.addon = eks.CfnAddon(
            self,
            "Addon",
            addon_name=CLOUDWATCH_ADDON,
            cluster_name=cluster.cluster_name,
            addon_version=self.config.cloudwatch_addon_version,
            configuration_values=json.dumps(values, sort_keys=True),
            pod_identity_associations=[
                eks.CfnAddon.PodIdentityAssociationProperty(
                    role_arn=self.agent_role.role_arn, service_account=CLOUDWATCH_SERVICE_ACCOUNT
                )
            ],
            resolve_conflicts="OVERWRITE",
        )
        self.addon.node.add_dependency(cluster.eks_pod_identity_agent, log_group, *container_insights)
        stack = Stack.of(self)
        self.dashboard = cloudwatch.CfnDashboard(
            self,
            "Dashboard",
            dashboard_name=dashboard_name,
            dashboard_body=stack.to_json_string(
                dashboards.cloudwatch_body(
                    region=stack.region,
                    cluster_name=cluster.cluster_name,
                    namespace=EMF_NAMESPACE,
                    scrape_interval_seconds=self.config.scrape_interval_seconds,
                )
            ),
        )

    def _amp(self, cluster: eks.Cluster, subnets: Sequence[ec2.ISubnet]) -> None:
        if self.config.amp_workspace_arn:
            self.workspace_arn = self.config.amp_workspace_arn
        else:
            workspace = aps.CfnWorkspace(self, "Workspace", alias=f"{cluster.cluster_name}-pd-serving")
            self.workspace_arn = workspace.attr_arn
        log_group = self._log_group(scraper_log_group(cluster.cluster_name))
        self.scraper = aps.CfnScraper(
            self,
            "Scraper",
            alias=f"{cluster.cluster_name}-ray",
            source=aps.CfnScraper.SourceProperty(
                eks_configuration=aps.CfnScraper.EksConfigurationProperty(
                    cluster_arn=cluster.cluster_arn,
                    subnet_ids=[s.subnet_id for s in subnets],
                    # Nodes and pods share the cluster security group, which admits its own members.
                    security_group_ids=[cluster.cluster_security_group_id],
                )
            ),
            destination=aps.CfnScraper.DestinationProperty(
                amp_configuration=aps.CfnScraper.AmpConfigurationProperty(workspace_arn=self.workspace_arn)
            ),
            scrape_configuration=aps.CfnScraper.ScrapeConfigurationProperty(
                configuration_blob=yaml.safe_dump(self.scrape_config, sort_keys=False)
            ),
            scraper_logging_configuration=aps.CfnScraper.ScraperLoggingConfigurationProperty(
                logging_destination=aps.CfnScraper.ScraperLoggingDestinationProperty(
                    cloud_watch_logs=aps.CfnScraper.CloudWatchLogDestinationProperty(
                        log_group_arn=log_group.log_group_arn
                    )
                ),
                scraper_components=[
                    aps.CfnScraper.ScraperComponentProperty(type=t)
                    for t in ("SERVICE_DISCOVERY", "COLLECTOR", "EXPORTER")
                ],
            ),
        )
        # With access entries, AMP creates the scraper role's access entry itself (username
        # aps-collector-user) when the scraper is created; a second AWS::EKS::AccessEntry for that role
        # fails with ResourceInUseException (AMP user guide, "Configure Amazon EKS for scraper access
        # with access entries"). What AMP does not grant is the RBAC that lets that user read pods.
        rbac = cluster.add_manifest("ScraperRbac", *scraper_rbac())
        rbac.node.add_dependency(self.scraper)
