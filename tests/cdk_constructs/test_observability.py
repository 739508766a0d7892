"""Observability on a bare stack: per backend, the scrape config, the dashboards and the policy checks."""

from __future__ import annotations

import json

import aws_cdk as cdk
import pytest
import yaml
from aws_cdk.assertions import Match, Template
from pydantic import ValidationError

from cdk_constructs.observability import Observability
from cdk_constructs.policy import attach_policy_checks
from config.loader import load_config
from config.schema import ObservabilityConfig
from manifests import dashboards
from manifests.observability import KNOWN_METRICS, scrape_config
from tests.conftest import network_and_cluster

ENV = cdk.Environment(account="111111111111", region="us-east-2")
WORKSPACE = "arn:aws:aps:us-east-2:111111111111:workspace/ws-0123abcd-4567-89ef-0123-456789abcdef"


@pytest.fixture(scope="module")
def app_config():
    from tests.conftest import CONFIG_DIR

    return load_config(CONFIG_DIR / "dev.yaml")


# The cluster's name as network_and_cluster gives it.
CLUSTER = "unit"


def synth(app_config, config: ObservabilityConfig, outdir=None, adopted: tuple[str, ...] = ()):
    """Synthesizes once (with the policy checks attached when ``outdir`` is given)."""
    app = cdk.App(
        outdir=str(outdir) if outdir else None,
        context={
            "availability-zones:account=111111111111:region=us-east-2": list(app_config.network.availability_zones)
        },
    )
    stack = cdk.Stack(app, "Bare", env=ENV)
    network, eks_cluster = network_and_cluster(stack, app_config)
    construct = Observability(
        stack,
        "Observability",
        cluster=eks_cluster.cluster,
        config=config,
        namespace="llm",
        dashboard_name="unit-pd-serving",
        subnets=network.private_subnets,
        logs=stack.node.find_child("Logs"),
        cluster_name=CLUSTER,
        adopted_log_groups=adopted,
    )
    if outdir:
        attach_policy_checks(app)
    return app, construct, Template.from_stack(stack)


@pytest.fixture(scope="module")
def cloudwatch(app_config):
    return synth(app_config, ObservabilityConfig(backend="cloudwatch", log_retention_days=14))


@pytest.fixture(scope="module")
def amp(app_config):
    return synth(app_config, ObservabilityConfig(backend="amp"))


def test_scrape_config_keeps_metrics_port_and_labels_phase():
    config = scrape_config(namespace="llm", interval_seconds=30)
    assert config["global"]["scrape_interval"] == "30s"
    (job,) = config["scrape_configs"]
    assert job["kubernetes_sd_configs"] == [{"role": "pod", "namespaces": {"names": ["llm"]}}]
    rules = job["relabel_configs"]
    assert {
        "source_labels": ["__meta_kubernetes_pod_container_port_name"],
        "action": "keep",
        "regex": "metrics",
    } in rules
    phase = next(r for r in rules if r.get("target_label") == "phase")
    assert phase["source_labels"] == ["__meta_kubernetes_pod_label_ray_io_group"]
    assert phase["regex"] == "(prefill|decode)-gpu" and phase["replacement"] == "$1"


def test_cloudwatch_addon_with_pod_identity_and_prometheus_scrape(cloudwatch):
    _, construct, template = cloudwatch
    template.has_resource_properties(
        "AWS::EKS::Addon",
        {
            "AddonName": "amazon-cloudwatch-observability",
            "PodIdentityAssociations": [{"RoleArn": Match.any_value(), "ServiceAccount": "cloudwatch-agent"}],
        },
    )
    template.has_resource_properties(
        "AWS::IAM::Role",
        {
            "AssumeRolePolicyDocument": {
                "Statement": [
                    Match.object_like(
                        {
                            "Action": ["sts:AssumeRole", "sts:TagSession"],
                            "Principal": {"Service": "pods.eks.amazonaws.com"},
                        }
                    )
                ]
            },
            "ManagedPolicyArns": [
                Match.object_like(
                    {"Fn::Join": ["", Match.array_with([Match.string_like_regexp("CloudWatchAgentServerPolicy")])]}
                )
            ],
        },
    )
    template.has_resource_properties("AWS::Logs::LogGroup", {"RetentionInDays": 14})
    values = json.loads(construct.addon.configuration_values)
    assert values["agent"]["prometheus"]["config"] == construct.scrape_config
    prometheus = values["agent"]["config"]["logs"]["metrics_collected"]["prometheus"]
    declared = {s.strip("^$") for d in prometheus["emf_processor"]["metric_declaration"] for s in d["metric_selectors"]}
    assert "ray_vllm_kv_cache_usage_perc" in declared
    assert all("phase" in d["dimensions"][0] for d in prometheus["emf_processor"]["metric_declaration"])
    assert values["agent"]["config"]["logs"]["metrics_collected"]["kubernetes"] == {"enhanced_container_insights": True}
    template.resource_count_is("AWS::APS::Scraper", 0)


def test_cloudwatch_dashboard_per_phase(cloudwatch):
    _, _, template = cloudwatch
    (dashboard,) = template.find_resources("AWS::CloudWatch::Dashboard").values()
    assert dashboard["Properties"]["DashboardName"] == "unit-pd-serving"
    body = json.dumps(dashboard["Properties"]["DashboardBody"])
    for phase in dashboards.PHASES:
        assert f"{phase}: Requests running / waiting" in body
        assert f"{phase}: KV cache usage" in body
    assert "backend: amp" in body  # says where the histograms are


def test_amp_workspace_scraper_access_and_rbac(amp):
    _, construct, template = amp
    template.resource_count_is("AWS::APS::Workspace", 1)
    template.resource_count_is("AWS::EKS::Addon", 3)  # only the cluster's own add-ons
    (scraper,) = template.find_resources("AWS::APS::Scraper").values()
    props = scraper["Properties"]
    assert yaml.safe_load(props["ScrapeConfiguration"]["ConfigurationBlob"]) == construct.scrape_config
    workspace_arn = props["Destination"]["AmpConfiguration"]["WorkspaceArn"]["Fn::GetAtt"]
    assert workspace_arn[1] == "Arn" and "Workspace" in workspace_arn[0]
    assert len(props["Source"]["EksConfiguration"]["SubnetIds"]) == 2
    # AMP creates the scraper role's access entry itself; a second one from the stack would fail
    # the deploy with ResourceInUseException. Only the RBAC for its user is the stack's.
    scraper_role = {"Fn::GetAtt": [next(iter(template.find_resources("AWS::APS::Scraper"))), "RoleArn"]}
    entries = template.find_resources("AWS::EKS::AccessEntry")
    assert not [e for e in entries.values() if e["Properties"]["PrincipalArn"] == scraper_role]
    rbac = {
        k: r
        for k, r in template.find_resources("Custom::AWSCDK-EKS-KubernetesResource").items()
        if "aps-collector-user" in json.dumps(r["Properties"]["Manifest"])
    }
    ((rbac_id, rbac_resource),) = rbac.items()
    assert "ClusterRoleBinding" in json.dumps(rbac_resource["Properties"]["Manifest"])
    assert next(iter(template.find_resources("AWS::APS::Scraper"))) in rbac_resource["DependsOn"]
    assert construct.grafana_dashboard_file == dashboards.GRAFANA_FILE


def test_amp_existing_workspace_creates_none(app_config):
    _, _, template = synth(app_config, ObservabilityConfig(backend="amp", amp_workspace_arn=WORKSPACE))
    template.resource_count_is("AWS::APS::Workspace", 0)
    template.has_resource_properties(
        "AWS::APS::Scraper", {"Destination": {"AmpConfiguration": {"WorkspaceArn": WORKSPACE}}}
    )


def test_backend_none_creates_nothing(app_config):
    _, construct, template = synth(app_config, ObservabilityConfig(backend="none"))
    assert construct.node.children == []
    resources = template.to_json()["Resources"]
    assert not [name for name in resources if name.startswith("Observability")]
    template.resource_count_is("AWS::EKS::Addon", 3)


def test_every_dashboard_metric_is_known():
    assert dashboards.referenced_metrics() <= set(KNOWN_METRICS)
    grafana = json.dumps(dashboards.grafana_dashboard())
    assert set(dashboards.METRIC_NAME.findall(grafana)) <= set(KNOWN_METRICS)


def test_checked_in_grafana_dashboard_is_current():
    assert dashboards.GRAFANA_FILE.read_text() == dashboards.grafana_json(), (
        "run `python -m cli.dashboards` to regenerate the Grafana dashboard"
    )


def test_grafana_dashboard_has_every_panel_per_phase():
    titles = {p["title"] for p in dashboards.grafana_dashboard()["panels"]}
    for phase in dashboards.PHASES:
        for needed in (
            "Time to first token",
            "Time per output token",
            "NIXL KV transfer time",
            "NIXL KV bytes transferred",
            "Errors",
            "KV cache usage",
        ):
            assert f"{phase}: {needed}" in titles


@pytest.mark.parametrize(
    ("data", "message"),
    [
        ({"scrape_interval_seconds": 45}, "scrape_interval_seconds=45 does not divide a CloudWatch minute"),
        ({"backend": "amp", "amp_workspace_arn": "ws-123"}, "is not a workspace ARN"),
        (
            {"backend": "cloudwatch", "amp_workspace_arn": WORKSPACE},
            "amp_workspace_arn is set but backend is cloudwatch; set backend: amp",
        ),
        ({"cloudwatch_addon_version": "latest"}, "is not an EKS add-on version such as v4.5.0-eksbuild.1"),
        ({"backend": "prometheus"}, "Input should be 'none', 'cloudwatch' or 'amp'"),
        ({"extra": 1}, "Extra inputs are not permitted"),
    ],
)
def test_config_errors_name_the_fix(data, message):
    with pytest.raises(ValidationError, match=message):
        ObservabilityConfig(**data)


def test_every_field_is_described():
    assert all(f.description for f in ObservabilityConfig.model_fields.values())


@pytest.mark.parametrize("backend", ["cloudwatch", "amp"])
def test_no_unacknowledged_aws_solutions_findings(app_config, tmp_path, backend):
    synth(app_config, ObservabilityConfig(backend=backend), outdir=tmp_path)
    report = json.loads((tmp_path / "validation-report.json").read_text())
    (nag,) = [p for p in report["pluginReports"] if p["pluginName"] == "AwsSolutions"]
    assert nag["violations"] == []
    if backend == "cloudwatch":
        assert any("CloudWatchAgentServerPolicy" in f["ruleName"] + json.dumps(f) for f in nag["suppressedViolations"])
    for finding in nag["suppressedViolations"]:
        assert len(finding["reason"]) >= 20, finding["ruleName"]


CONTAINER_INSIGHTS_STREAMS = ("performance", "application", "host", "dataplane", "prometheus")


def container_insights_groups(template) -> dict[str, tuple[str, dict]]:
    """Each Container Insights log group by its name (the cluster's as <cluster>): (logical id, resource)."""
    resources = template.to_json()["Resources"]
    (cluster_id,) = [k for k, r in resources.items() if r["Type"] == "AWS::EKS::Cluster"]

    def name_of(group: dict) -> str:
        name = group["Properties"].get("LogGroupName", "")
        if isinstance(name, dict):
            separator, parts = name["Fn::Join"]
            name = separator.join("<cluster>" if part == {"Ref": cluster_id} else part for part in parts)
        return name.replace(f"/{CLUSTER}/", "/<cluster>/")

    return {
        name_of(r): (logical_id, r)
        for logical_id, r in resources.items()
        if r["Type"] == "AWS::Logs::LogGroup" and "/aws/containerinsights/" in name_of(r)
    }


def test_cloudwatch_container_insights_log_groups_are_the_stacks_before_the_agent_writes(cloudwatch):
    """The agent and Fluent Bit write to these names and would create them unencrypted, never
    expiring and outliving the stack; the stack creates them first, so destroy removes them."""
    _, _, template = cloudwatch
    resources = template.to_json()["Resources"]
    groups = container_insights_groups(template)
    assert set(groups) == {f"/aws/containerinsights/<cluster>/{name}" for name in CONTAINER_INSIGHTS_STREAMS}
    (key_id,) = [k for k, r in resources.items() if r["Type"] == "AWS::KMS::Key" and k.startswith("Logs")]
    (addon,) = [
        r
        for r in resources.values()
        if r["Type"] == "AWS::EKS::Addon" and r["Properties"]["AddonName"] == "amazon-cloudwatch-observability"
    ]
    for logical_id, group in groups.values():
        assert group["Properties"]["RetentionInDays"] == 14
        assert group["Properties"]["KmsKeyId"] == {"Fn::GetAtt": [key_id, "Arn"]}
        assert group["DeletionPolicy"] == group["UpdateReplacePolicy"] == "Delete"
        assert logical_id in addon["DependsOn"]


def test_container_insights_groups_the_running_add_on_made_are_imported_as_they_are(app_config, tmp_path):
    """A deployed stack whose add-on made two of the groups before the stack owned them: those two are
    imported (CloudFormation imports only a resource whose name the template fixes and whose
    DeletionPolicy is Retain, and applies no property, so the template says what the agents made);
    the others stay the stack's. AWS Solutions finds nothing unacknowledged in that deploy."""
    adopted = tuple(f"/aws/containerinsights/{CLUSTER}/{name}" for name in ("performance", "application"))
    synth(app_config, ObservabilityConfig(backend="cloudwatch"), outdir=tmp_path, adopted=adopted)
    report = json.loads((tmp_path / "validation-report.json").read_text())
    (nag,) = [p for p in report["pluginReports"] if p["pluginName"] == "AwsSolutions"]
    assert nag["violations"] == []
    _, _, template = synth(app_config, ObservabilityConfig(backend="cloudwatch"), adopted=adopted)
    for name, (_, group) in container_insights_groups(template).items():
        if name.removeprefix("/aws/containerinsights/<cluster>/") in ("performance", "application"):
            assert group["Properties"]["LogGroupName"] == name.replace("<cluster>", CLUSTER)
            assert "KmsKeyId" not in group["Properties"] and "RetentionInDays" not in group["Properties"]
            assert group["DeletionPolicy"] == "Retain"
        else:
            assert "KmsKeyId" in group["Properties"] and group["DeletionPolicy"] == "Delete"


def test_decode_recomputing_the_prompt_is_drawn_as_an_alarm_in_both_dashboards():
    """With P/D decode computes no prompt token: above zero, KV pulls fail (a stale NIXL peer after
    a prefill restart, hidden by load_failure_policy recompute), and both dashboards show it red."""
    from manifests.dashboards import cloudwatch_body, grafana_dashboard

    titles = [p["title"] for p in grafana_dashboard()["panels"] if "recomputed" in p.get("title", "")]
    assert titles == ["decode: Prompt tokens recomputed (a failed KV pull; 0 when P/D works)"]
    (panel,) = [p for p in grafana_dashboard()["panels"] if p.get("title") == titles[0]]
    assert panel["fieldConfig"]["defaults"]["thresholds"]["steps"][1] == {"color": "red", "value": 0}
    assert 'source="local_compute"' in panel["targets"][0]["expr"] and 'phase="decode"' in panel["targets"][0]["expr"]
    body = cloudwatch_body(
        region="us-east-2", cluster_name="pd-dev", namespace="ContainerInsights/Prometheus", scrape_interval_seconds=30
    )
    (widget,) = [w for w in body["widgets"] if "recomputed" in w.get("properties", {}).get("title", "")]
    assert widget["properties"]["title"].startswith("decode: ")
    assert widget["properties"]["annotations"]["horizontal"] == [{"label": "alarm", "value": 0}]


@pytest.mark.serving  # the counter names, read from vLLM itself
def test_each_phase_draws_its_prefix_cache_hit_rate_from_counters_vllm_exports():
    """A panel per phase divides the prefix-cache hits by the queries; every metric the dashboard
    reads is one the installed vLLM declares (read from its source), as Ray exports it."""
    from tests.vllm_exports import declared, ray_exported

    grafana = dashboards.grafana_dashboard()
    hit_rate = {
        p["title"].split(": ")[0]: p
        for p in grafana["panels"]
        if p.get("title", "").endswith(": Prefix cache hit rate")
    }
    assert set(hit_rate) == set(dashboards.PHASES)
    for phase, panel in hit_rate.items():
        (target,) = panel["targets"]
        hits, queries = target["expr"].split(" / ")
        assert "ray_vllm_prefix_cache_hits_total" in hits and "ray_vllm_prefix_cache_queries_total" in queries
        assert f'phase="{phase}"' in hits and f'phase="{phase}"' in queries
        assert panel["fieldConfig"]["defaults"]["unit"] == "percentunit"
    assert {"vllm:prefix_cache_hits", "vllm:prefix_cache_queries"} <= set(declared())
    vllm_names = {n for n in dashboards.METRIC_NAME.findall(json.dumps(grafana)) if n.startswith("ray_vllm_")}
    assert vllm_names <= ray_exported(), vllm_names - ray_exported()
