"""The GCS store token rotated by a config edit, rehearsed as the deploys `make deploy` makes: the guard's and
the clusters' answers recorded, the CDK CLI synthesizing for real, its `deploy` (which would reach AWS)
writing its arguments down, ElastiCache's and Secrets Manager's calls replayed with botocore's Stubber.

ROTATE (both tokens accepted, the head unchanged), the head's move to the new generation once every
mount holds the rotated version (a NewCluster upgrade, the old cluster serving meanwhile), then SET once
the old RayCluster is gone."""

from __future__ import annotations

import json
import shutil

import boto3
import pytest
import yaml
from botocore.stub import ANY, Stubber

from cli import deploy as cli_deploy
from config.token_rotation import GENERATION_ANNOTATION, ROTATED_STAGE
from preview.serving import RAY_SERVICE
from tests.cli import test_deploy_guard
from tests.cli.test_store_token import GROUP, NEW_VERSION, OLD_VERSION, SECRET, podstatus, raycluster
from tests.conftest import ROOT, synth_variant
from verify.kube import RecordedKube, slug

# Seconds per deploy (the CDK CLI synthesizes and diffs): make test-unit leaves this to make test-consumers.
pytestmark = pytest.mark.consumer

STACK = "pd-dev-pd-serving"
RECORDED = test_deploy_guard.RECORDINGS / "store-token-rotated.json"


def data(generation: int) -> dict:
    config = test_deploy_guard.config_data()
    config["ray_service"]["gcs_fault_tolerance"] = {"enabled": True, "store": {"auth_token_generation": generation}}
    return config


def recordings(tmp_path, stages: dict[str, list[str]]):
    """The guard's answers of a deployed stack with a GCS store whose token versions carry ``stages``."""
    recording = json.loads(RECORDED.read_text())
    for call in recording["calls"]:
        if call["operation"] == "describe_secret":
            call["response"]["VersionIdsToStages"] = stages
    folder = tmp_path / "aws"
    folder.mkdir(exist_ok=True)
    (folder / "store-token.json").write_text(json.dumps(recording))
    return folder


def cluster_answers(tmp_path, name: str, statuses: list[dict], clusters: list[dict]) -> RecordedKube:
    folder = tmp_path / name
    shutil.copytree(ROOT / "tests" / "fixtures" / "verify" / "serving-grown", folder)
    for args, items in (
        (["get", "secretproviderclasspodstatuses", "-n", "llm"], statuses),
        (["get", "rayclusters", "-n", "llm"], clusters),
    ):
        (folder / f"{slug(args)}.json").write_text(json.dumps({"kind": "List", "items": items}))
    return RecordedKube(folder)


def head_annotation(template: dict) -> str | None:
    from consumers.template import manifests

    for _, item in manifests(template):
        if item.get("kind") == RAY_SERVICE:
            head = item["spec"]["rayClusterConfig"]["headGroupSpec"]["template"]
            return (head.get("metadata") or {}).get("annotations", {}).get(GENERATION_ANNOTATION)
    raise AssertionError("no RayService in the template")


class Deployer:
    """`make deploy` of a config over a deployed template, its AWS answers recorded."""

    def __init__(self, tmp_path, monkeypatch):
        self.tmp_path = tmp_path
        self.monkeypatch = monkeypatch
        self.deployed_args = tmp_path / "deploy-args"
        self.cdk = tmp_path / "cdk"
        self.cdk.write_text(
            f'#!/bin/sh\nif [ "$1" = deploy ]; then printf "%s\\n" "$@" > {self.deployed_args}; exit 0; fi\n'
            f'exec {cli_deploy.DEFAULT_CDK} "$@"\n'
        )
        self.cdk.chmod(0o755)

    def deploy(self, name, config: dict, deployed: dict, *, stages, kube, secretsmanager=(), elasticache=()):
        path = self.tmp_path / f"{name}.yaml"
        path.write_text(yaml.safe_dump(config))
        outdir = self.tmp_path / f"{name}.out"
        self.monkeypatch.setattr(test_deploy_guard, "RECORDINGS", recordings(self.tmp_path, stages))
        get_template = {
            "service": "cloudformation",
            "operation": "get_template",
            "expected": {"StackName": STACK, "TemplateStage": "Original"},
            "response": {"TemplateBody": json.dumps(deployed)},
        }
        cache = boto3.client(
            "elasticache", region_name="us-east-2", aws_access_key_id="recorded", aws_secret_access_key="recorded"
        )
        stub = Stubber(cache)
        for operation, response, expected in elasticache:
            stub.add_response(operation, response, expected)
        with (
            test_deploy_guard.checkip_server("93.184.216.34\n") as url,
            test_deploy_guard.recorded_aws("store-token", then=[get_template, *secretsmanager]) as clients,
            stub,
        ):
            argv = [str(path), "--outdir", str(outdir), "--cdk", str(self.cdk), "--summary-only", "--checkip-url", url]
            code = cli_deploy.main(argv, clients={**clients, "elasticache": cache}, kube=kube)
            stub.assert_no_pending_responses()
        return code, json.loads((outdir / f"{STACK}.template.json").read_text())


def modify(strategy: str) -> list[tuple]:
    return [
        (
            "modify_replication_group",
            {"ReplicationGroup": {"ReplicationGroupId": GROUP, "Status": "modifying"}},
            {
                "ReplicationGroupId": GROUP,
                "AuthToken": ANY,
                "AuthTokenUpdateStrategy": strategy,
                "ApplyImmediately": True,
            },
        ),
        (
            "describe_replication_groups",
            {"ReplicationGroups": [{"ReplicationGroupId": GROUP, "Status": "available"}]},
            {"ReplicationGroupId": GROUP},
        ),
    ]


def secrets_call(operation: str, response: dict, expected: dict) -> dict:
    return {"service": "secretsmanager", "operation": operation, "expected": expected, "response": response}


def test_a_new_token_generation_rotates_restarts_the_head_then_sets(tmp_path, monkeypatch, capsys):
    _, template = synth_variant(tmp_path, data(1), "deployed", None)
    deployed = template.to_json()
    assert head_annotation(deployed) is None
    deployer = Deployer(tmp_path, monkeypatch)
    current = {OLD_VERSION: ["AWSCURRENT"]}
    rotated = {OLD_VERSION: ["AWSPREVIOUS"], NEW_VERSION: ["AWSCURRENT", ROTATED_STAGE]}
    old_cluster = [raycluster("pd-llm-old", None)]

    # 1. ROTATE: ElastiCache takes the new token beside the old one before CloudFormation runs; the head stays.
    put = secrets_call(
        "put_secret_value",
        {"ARN": SECRET, "Name": "EksGcsStoreAuthToken", "VersionId": NEW_VERSION, "VersionStages": ["AWSCURRENT"]},
        {"SecretId": SECRET, "SecretString": ANY, "VersionStages": ["AWSCURRENT", ROTATED_STAGE]},
    )
    kube = cluster_answers(tmp_path, "k1", [podstatus("pd-llm-old-head", OLD_VERSION)], old_cluster)
    code, first = deployer.deploy(
        "rotate", data(2), deployed, stages=current, kube=kube, secretsmanager=[put], elasticache=modify("ROTATE")
    )
    out = capsys.readouterr().out
    assert code == 0, out
    assert "GCS store token: this deploy rotates the GCS store's AUTH token (ElastiCache ROTATE" in out
    assert f"GCS store token rotated: version {NEW_VERSION} is current, the old token still accepted" in out
    assert head_annotation(first) is None and deployer.deployed_args.exists()

    # 2. A mount still on the old version: the head waits (a deploy that changes nothing of it).
    kube = cluster_answers(tmp_path, "k2", [podstatus("pd-llm-old-head", OLD_VERSION)], old_cluster)
    code, waiting = deployer.deploy("wait", data(2), first, stages=rotated, kube=kube)
    assert code == 0 and head_annotation(waiting) is None
    assert (
        "waits for the Secrets Store CSI driver's rotation poll (not every mount holds it yet)"
        in capsys.readouterr().out
    )

    # 3. Every mount holds it: the head moves to generation 2, a NewCluster upgrade.
    kube = cluster_answers(tmp_path, "k3", [podstatus("pd-llm-old-head", NEW_VERSION)], old_cluster)
    code, moved = deployer.deploy("restart", data(2), first, stages=rotated, kube=kube)
    out = capsys.readouterr().out
    assert code == 0, out
    assert head_annotation(moved) == "2"
    assert "the head moves to token generation 2" in out
    assert "Class of change: new Ray cluster" in out, out

    # 4. The old cluster still listed: the old token stays accepted.
    kube = cluster_answers(tmp_path, "k4", [], [*old_cluster, raycluster("pd-llm-new", 2)])
    code, _ = deployer.deploy("hold", data(2), moved, stages=rotated, kube=kube)
    assert code == 0 and "pd-llm-old still runs" in capsys.readouterr().out

    # 5. It is gone: SET after the deploy, and the label goes.
    get = secrets_call(
        "get_secret_value",
        {"ARN": SECRET, "Name": "EksGcsStoreAuthToken", "VersionId": NEW_VERSION, "SecretString": "N3wT0ken" * 8},
        {"SecretId": SECRET, "VersionId": NEW_VERSION},
    )
    unlabel = secrets_call(
        "update_secret_version_stage",
        {"ARN": SECRET, "Name": "EksGcsStoreAuthToken"},
        {"SecretId": SECRET, "VersionStage": ROTATED_STAGE, "RemoveFromVersionId": NEW_VERSION},
    )
    kube = cluster_answers(tmp_path, "k5", [], [raycluster("pd-llm-new", 2)])
    code, last = deployer.deploy(
        "set", data(2), moved, stages=rotated, kube=kube, secretsmanager=[get, unlabel], elasticache=modify("SET")
    )
    out = capsys.readouterr().out
    assert code == 0, out
    assert "GCS store token set: the old token is refused from now" in out
    assert head_annotation(last) == "2"
