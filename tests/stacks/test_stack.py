"""The composed stack of each shipped environment, and offline synth end to end."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from aws_cdk.assertions import Match

from tests.conftest import CONFIG_DIR, ROOT, SHIPPED_ENVIRONMENTS

# Renaming these would replace the VPC or the cluster (and everything in it) on the next deploy.
STABLE_LOGICAL_IDS = {
    "AWS::EC2::VPC": "NetworkVpc7FB7348F",
    "AWS::EKS::Cluster": "EksClusterB2BDED5B",
}


@pytest.mark.parametrize("env", SHIPPED_ENVIRONMENTS)
def test_every_shipped_environment_synthesizes(synthesized, env):
    config, _, template, _, _ = synthesized(env)
    template.resource_count_is("AWS::EKS::Cluster", 1)
    template.resource_count_is("AWS::EKS::Nodegroup", 3)
    template.has_resource_properties("AWS::EKS::Cluster", {"Name": config.cluster_name})


@pytest.mark.parametrize("env", SHIPPED_ENVIRONMENTS)
def test_stateful_logical_ids_are_stable(synthesized, env):
    _, _, template, _, _ = synthesized(env)
    for resource_type, logical_id in STABLE_LOGICAL_IDS.items():
        assert list(template.find_resources(resource_type)) == [logical_id]


@pytest.mark.parametrize("env", SHIPPED_ENVIRONMENTS)
def test_no_placeholder_availability_zone_reaches_a_template(synthesized, env):
    config, _, template, _, _ = synthesized(env)
    text = json.dumps(template.to_json())
    assert "dummy1" not in text
    zones = {r["Properties"]["AvailabilityZone"] for r in template.find_resources("AWS::EC2::Subnet").values()}
    assert zones == set(config.network.availability_zones)


@pytest.mark.parametrize("env", SHIPPED_ENVIRONMENTS)
def test_both_gpu_groups_share_one_subnet_and_one_placement_group(synthesized, env):
    config, _, template, _, _ = synthesized(env)
    gpu_groups = [
        r["Properties"]
        for r in template.find_resources("AWS::EKS::Nodegroup").values()
        if r["Properties"]["AmiType"] == "AL2023_x86_64_NVIDIA"
    ]
    assert sorted(g["Labels"]["pd-serving/phase"] for g in gpu_groups) == ["decode", "prefill"]
    assert len({json.dumps(g["Subnets"]) for g in gpu_groups}) == 1
    (subnet_ref,) = gpu_groups[0]["Subnets"]
    subnet = template.to_json()["Resources"][subnet_ref["Ref"]]
    assert subnet["Properties"]["AvailabilityZone"] == config.network.gpu_availability_zone
    template.resource_count_is("AWS::EC2::PlacementGroup", 1)
    placements = {
        json.dumps(r["Properties"]["LaunchTemplateData"]["Placement"])
        for r in template.find_resources("AWS::EC2::LaunchTemplate").values()
        if "Placement" in r["Properties"]["LaunchTemplateData"]
    }
    assert len(placements) == 1


def test_prod_uses_private_endpoint_and_nat_per_zone(synthesized):
    config, _, template, _, _ = synthesized("prod")
    template.has_resource_properties(
        "AWS::EKS::Cluster",
        {"ResourcesVpcConfig": Match.object_like({"EndpointPublicAccess": False, "EndpointPrivateAccess": True})},
    )
    template.resource_count_is("AWS::EC2::NatGateway", 3)
    template.has_resource_properties(
        "AWS::EKS::Nodegroup",
        {
            "Labels": {"role": "gpu", "pd-serving/phase": "decode"},
            "ScalingConfig": {"MinSize": 1, "DesiredSize": 2, "MaxSize": 6},
        },
    )


def test_outputs_a_user_needs(synthesized):
    _, _, template, _, _ = synthesized("dev")
    outputs = template.to_json()["Outputs"]
    for name in ("ClusterName", "UpdateKubeconfigCommand", "SystemNodeGroup", "PrefillNodeGroup", "DecodeNodeGroup"):
        assert name in outputs
    assert "aws eks update-kubeconfig --region us-east-2 --name" in json.dumps(outputs["UpdateKubeconfigCommand"])


def test_tags_from_config_reach_resources(synthesized):
    _, _, template, _, _ = synthesized("dev")
    template.has_resource_properties(
        "AWS::EC2::VPC",
        {"Tags": Match.array_with([{"Key": "environment", "Value": "dev"}])},
    )


@pytest.mark.parametrize("env", SHIPPED_ENVIRONMENTS)
def test_no_tag_edit_replaces_a_resource(synthesized, env):
    """A resource whose Tags cannot change in place (CloudFormation's resource specification, the CDK
    CLI's copy) carries no stack tag, so a cost-tag edit never replaces one."""
    from app import TAGS_REPLACE
    from preview.spec import _spec

    properties_of, _ = _spec()
    _, _, template, _, _ = synthesized(env)
    resources = template.to_json()["Resources"]
    replaced_by_tags = {
        r["Type"]
        for r in resources.values()
        if (properties_of.get(r["Type"], {}).get("Tags") or {}).get("causesReplacement")
    }
    assert replaced_by_tags <= set(TAGS_REPLACE)
    assert "AWS::EC2::PlacementGroup" in replaced_by_tags
    assert all("Tags" not in r.get("Properties", {}) for r in resources.values() if r["Type"] in TAGS_REPLACE)


def _clean_env(tmp_path) -> dict[str, str]:
    """The environment of a machine with no AWS credentials or config at all."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")}
    env.update(
        HOME=str(tmp_path),
        AWS_CONFIG_FILE=str(tmp_path / "no-config"),
        AWS_SHARED_CREDENTIALS_FILE=str(tmp_path / "no-credentials"),
        AWS_EC2_METADATA_DISABLED="true",
        JSII_SILENCE_WARNING_END_OF_LIFE_NODE_VERSION="20",
        CDK_DISABLE_CLI_TELEMETRY="true",
    )
    return env


@pytest.mark.consumer  # the CDK CLI runs app.py
def test_cdk_cli_synthesizes_without_credentials_or_lookups(tmp_path):
    cdk = ROOT / "node_modules" / ".bin" / "cdk"
    outdir = tmp_path / "out"
    result = subprocess.run(
        [
            str(cdk),
            "synth",
            "--app",
            f"{sys.executable} app.py",
            "-c",
            f"config={CONFIG_DIR / 'dev.yaml'}",
            "--no-notices",
            "--no-version-reporting",
            "--quiet",
            "--output",
            str(outdir),
        ],
        cwd=ROOT,
        env=_clean_env(tmp_path),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr
    # The planner's warning is shown as the user's own, with no frame of jsii's JavaScript above it.
    output = result.stdout + result.stderr
    assert "no GPUDirect RDMA" in output
    assert "program.js" not in output, output
    manifest = json.loads((outdir / "manifest.json").read_text())
    assert "missing" not in manifest, "synth asked for context that would need an AWS lookup"
    assert (outdir / "pd-dev-pd-serving.template.json").is_file()
    assert not (ROOT / "cdk.context.json").exists() or json.loads((ROOT / "cdk.context.json").read_text()) == {}


@pytest.mark.consumer  # app.py in a new interpreter
def test_bad_config_exits_with_a_message_not_a_trace(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text((CONFIG_DIR / "dev.yaml").read_text().replace("g6.8xlarge", "g6.xlarge", 1))
    env = _clean_env(tmp_path) | {"CDK_CONTEXT_JSON": json.dumps({"config": str(bad)})}
    result = subprocess.run([sys.executable, "app.py"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    assert result.returncode == 2
    assert "cluster.gpu_node_groups.prefill.instance_type: g6.xlarge does not support EFA" in result.stderr
    assert "Traceback" not in result.stderr


def test_summary_names_node_groups_and_version(synthesized):
    from cli.summary import summarize

    _, _, _, _, outdir = synthesized("dev")
    summary = summarize(str(CONFIG_DIR / "dev.yaml"), str(outdir))
    assert "kubernetes      1.36" in summary
    assert "prefill   g6.8xlarge    1/1/2" in summary
    assert "AL2023_x86_64_NVIDIA" in summary
    assert "API endpoint    public to your address (make deploy); private (inside the VPC)" in summary
    assert "cluster admins  you (make deploy)" in summary
