"""`make destroy` leaves nothing behind and cannot hang: deletion order and policies, as synthesized."""

from __future__ import annotations

import json

import pytest

from tests.conftest import SHIPPED_ENVIRONMENTS


def _rayservice_id(resources: dict) -> str:
    (found,) = [
        k
        for k, r in resources.items()
        if r["Type"] == "Custom::AWSCDK-EKS-KubernetesResource"
        and '"kind":"RayService"'
        in json.dumps(r["Properties"]["Manifest"]).replace(" ", "").replace("\\\\", "").replace('\\"', '"')
    ]
    return found


@pytest.mark.parametrize("env", SHIPPED_ENVIRONMENTS)
def test_nothing_is_retained(synthesized, env):
    _, _, template, _, _ = synthesized(env)
    for logical_id, resource in template.to_json()["Resources"].items():
        assert resource.get("DeletionPolicy", "Delete") == "Delete", logical_id
        assert resource.get("UpdateReplacePolicy", "Delete") == "Delete", logical_id


@pytest.mark.parametrize("env", SHIPPED_ENVIRONMENTS)
def test_rayservice_is_deleted_before_nodes_and_operator(synthesized, env):
    _, _, template, _, _ = synthesized(env)
    resources = template.to_json()["Resources"]
    depends = set(resources[_rayservice_id(resources)]["DependsOn"])
    nodegroups = {k for k, r in resources.items() if r["Type"] == "AWS::EKS::Nodegroup"}
    assert nodegroups <= depends
    kuberay = {
        k
        for k, r in resources.items()
        if r["Type"] == "Custom::AWSCDK-EKS-HelmChart" and r["Properties"]["Chart"] == "kuberay-operator"
    }
    assert kuberay <= depends


def _manifest_items(resource: dict) -> list[dict]:
    manifest = resource["Properties"]["Manifest"]
    return json.loads(manifest) if isinstance(manifest, str) else []


def test_load_balancer_is_removed_by_its_controller_before_the_vpc(variant):
    """CloudFormation deletes in reverse dependency order: RayService, then the NLB's Service
    (`kubectl delete` waits for its load-balancer finalizer), then the controller and the nodes."""
    from tests.stacks.test_template_policies import _variants

    stack, template, _ = variant("internal-nlb", _variants()["internal-nlb"])
    resources = template.to_json()["Resources"]
    (service_id,) = [
        k
        for k, r in resources.items()
        if r["Type"] == "Custom::AWSCDK-EKS-KubernetesResource"
        and any(item.get("kind") == "Service" for item in _manifest_items(r))
    ]
    (service,) = _manifest_items(resources[service_id])
    assert service["metadata"]["name"] == "pd-llm-serve-svc" and service["spec"]["type"] == "LoadBalancer"
    # No selector of its own: KubeRay points it at the serving RayCluster (and does not adopt it).
    assert "selector" not in service["spec"]
    assert stack.serving.manifest_body["spec"]["serveService"]["metadata"]["name"] == "pd-llm-serve-svc"

    rayservice_depends = set(resources[_rayservice_id(resources)]["DependsOn"])
    assert service_id in rayservice_depends
    controller = {
        k
        for k, r in resources.items()
        if r["Type"] == "Custom::AWSCDK-EKS-HelmChart" and r["Properties"]["Chart"] == "aws-load-balancer-controller"
    }
    nodegroups = {k for k, r in resources.items() if r["Type"] == "AWS::EKS::Nodegroup"}
    service_depends = set(resources[service_id]["DependsOn"])
    assert controller and controller <= service_depends
    assert nodegroups <= service_depends


def test_kms_key_is_scheduled_for_deletion(synthesized):
    _, _, template, _, _ = synthesized("dev")
    template.has_resource(
        "AWS::KMS::Key",
        {"DeletionPolicy": "Delete", "Properties": {"PendingWindowInDays": 7, "EnableKeyRotation": True}},
    )


@pytest.mark.parametrize("env", SHIPPED_ENVIRONMENTS)
def test_every_log_group_is_the_stacks_own_encrypted_and_expiring(synthesized, env):
    """Nothing a service would create on first write (and keep after destroy) is left to it."""
    config, _, template, _, _ = synthesized(env)
    resources = template.to_json()["Resources"]
    groups = {k: r for k, r in resources.items() if r["Type"] == "AWS::Logs::LogGroup"}
    for logical_id, group in groups.items():
        assert group["DeletionPolicy"] == "Delete", logical_id
        assert "RetentionInDays" in group["Properties"], logical_id
        assert "KmsKeyId" in group["Properties"], logical_id
    # EKS writes control-plane logs to this name; the cluster comes after the group, and goes first.
    (control_plane,) = [
        k for k, g in groups.items() if g["Properties"].get("LogGroupName") == f"/aws/eks/{config.cluster_name}/cluster"
    ]
    (cluster_id,) = template.find_resources("AWS::EKS::Cluster")
    assert control_plane in resources[cluster_id]["DependsOn"]
    # Every Lambda function (kubectl handler, provider framework, CDK's custom-resource providers)
    # logs to one of those groups instead of an /aws/lambda/<name> group Lambda would create.
    functions = {k: r for k, r in resources.items() if r["Type"] == "AWS::Lambda::Function"}
    assert len(functions) >= 3
    for logical_id, function in functions.items():
        target = function["Properties"]["LoggingConfig"]["LogGroup"]
        assert target["Ref"] in groups, logical_id


@pytest.mark.parametrize("env", SHIPPED_ENVIRONMENTS)
def test_cloudwatch_logs_may_use_the_log_key_for_this_accounts_groups_only(synthesized, env):
    config, _, template, _, _ = synthesized(env)
    groups = template.find_resources("AWS::Logs::LogGroup").values()
    (key_ref,) = {json.dumps(g["Properties"]["KmsKeyId"]) for g in groups}
    key_id = json.loads(key_ref)["Fn::GetAtt"][0]
    key = template.to_json()["Resources"][key_id]
    assert key["Properties"]["EnableKeyRotation"] is True and key["DeletionPolicy"] == "Delete"
    (logs_statement,) = [
        s
        for s in key["Properties"]["KeyPolicy"]["Statement"]
        if s.get("Principal", {}).get("Service") == f"logs.{config.aws.region}.amazonaws.com"
    ]
    assert "kms:EncryptionContext:aws:logs:arn" in json.dumps(logs_statement["Condition"]["ArnLike"])


def _fixed_name(value, cluster_logical_id: str, cluster_name: str) -> str | None:
    """A name as it is at deploy time when it is fixed: a string, or a join of strings and the cluster's
    name (its Ref); None for a name CloudFormation or another resource makes up."""
    if isinstance(value, str):
        return value
    if isinstance(value, dict) and "Fn::Join" in value:
        separator, parts = value["Fn::Join"]
        resolved = [
            part if isinstance(part, str) else cluster_name if part == {"Ref": cluster_logical_id} else None
            for part in parts
        ]
        return None if None in resolved else separator.join(resolved)
    return None


REDEPLOY_CASES = [*SHIPPED_ENVIRONMENTS, "mirror-prod", "mirror-dev", "cloudwatch"]


@pytest.mark.parametrize("case", REDEPLOY_CASES)
def test_what_a_destroy_leaves_is_taken_back_or_found_before_the_next_create(synthesized, variant, case):
    """Destroy, then deploy again: a resource that outlives the stack under a fixed name fails the next
    create. The only one the stack keeps is the model mirror, which CloudFormation can import (its name
    is a plain string, its DeletionPolicy Retain) and the guard finds; every log group created under a
    name a service also writes to is one the guard checks before CloudFormation starts."""
    from manifests.observability import fixed_log_groups
    from tests.stacks.test_template_policies import _variants

    if case in SHIPPED_ENVIRONMENTS:
        config, _, template, _, _ = synthesized(case)
    else:
        stack, template, _ = variant(case, _variants()[case])
        config = stack.config
    resources = template.to_json()["Resources"]
    (cluster_id,) = [k for k, r in resources.items() if r["Type"] == "AWS::EKS::Cluster"]

    kept = {k: r for k, r in resources.items() if r.get("DeletionPolicy") in ("Retain", "RetainExceptOnCreate")}
    if config.model_mirror.enabled and config.mirror_kept_on_destroy:
        (bucket,) = kept.values()
        assert bucket["Type"] == "AWS::S3::Bucket" and bucket["DeletionPolicy"] == "Retain"
        assert bucket["Properties"]["BucketName"] == config.mirror_bucket  # static: importable
    else:
        assert kept == {}

    named_log_groups = {
        _fixed_name(r["Properties"].get("LogGroupName"), cluster_id, config.cluster_name)
        for r in resources.values()
        if r["Type"] == "AWS::Logs::LogGroup"
    } - {None}
    assert named_log_groups == set(fixed_log_groups(config.cluster_name, config.observability.backend))


def test_the_kept_mirror_is_found_and_imported_by_the_next_deploy():
    """The guard's answer for a destroyed prod stack whose mirror was kept (recorded S3 answer), and
    what `make deploy` does with it."""
    from pathlib import Path

    import boto3
    from botocore.stub import Stubber

    from cli import deploy as cli_deploy
    from cli import deploy_guard
    from config.loader import parse_config
    from tests.stacks.test_template_policies import _variants

    config = parse_config(_variants()["mirror-prod"], source="prod.yaml")
    credentials = {"aws_access_key_id": "recorded", "aws_secret_access_key": "recorded"}
    s3 = boto3.client("s3", region_name=config.aws.region, **credentials)
    logs = boto3.client("logs", region_name=config.aws.region, **credentials)
    with Stubber(s3) as s3_answers, Stubber(logs) as logs_answers:
        s3_answers.add_response(
            "head_bucket", {}, {"Bucket": config.mirror_bucket, "ExpectedBucketOwner": config.aws.account}
        )
        for name in ("/aws/eks/pd-prod/cluster", "/aws/vendedlogs/prometheus/pd-prod/scraper"):
            logs_answers.add_response("describe_log_groups", {"logGroups": []}, {"logGroupNamePrefix": name})
        errors, warnings, to_import = deploy_guard.left_behind_findings(config, "prod.yaml", s3=s3, logs=logs)
    assert errors == [] and warnings == []
    assert to_import == [
        f"the model mirror bucket {config.mirror_bucket} (kept by the last destroy): imported with its objects"
    ]
    assert "--import-existing-resources" in cli_deploy.deploy_command(Path("cdk.out"), import_existing=bool(to_import))
