"""The GCS store token's rotation as `make deploy` takes it (cli/store_token.py): ElastiCache's and Secrets
Manager's calls replayed with botocore's Stubber (every request and answer checked against botocore's
model of the API), and what kubectl says about the mounts and the RayClusters, replayed from recordings."""

from __future__ import annotations

import json

import boto3
import pytest
from botocore.stub import ANY, Stubber

from cli.store_token import TOKEN_LENGTH, mounts_hold, rotate, set_alone, with_token_mounts
from config.loader import parse_config
from config.schema import DeployedStoreToken, DeployFacts
from config.token_rotation import GENERATION_ANNOTATION, ROTATED_STAGE
from manifests.gcs_store import PROVIDER_CLASS
from tests.cdk_constructs.test_gcs_store import dev_ft_data
from tests.cli.test_deploy_guard import config_data, guard
from verify.kube import RecordedKube, slug

SECRET = "arn:aws:secretsmanager:us-east-2:111122223333:secret:EksGcsStoreAuthToken-Ab12Cd"
GROUP = "pd-dev-gcsstore-1a2b3c4d5e6f"
OLD_VERSION = "0d1c2b3a-4f5e-4d6c-8b7a-9f8e7d6c5b4a"
NEW_VERSION = "5e6f7a8b-9c0d-4e1f-a2b3-c4d5e6f7a8b9"
TOKEN = DeployedStoreToken(secret_arn=SECRET, replication_group=GROUP)


def clients():
    made = {
        name: boto3.client(
            name, region_name="us-east-2", aws_access_key_id="recorded", aws_secret_access_key="recorded"
        )
        for name in ("elasticache", "secretsmanager")
    }
    sent: list[tuple[str, dict]] = []
    for name, client in made.items():
        client.meta.events.register(
            f"provide-client-params.{name}.*",
            lambda params, model, **_: sent.append((model.name, dict(params))),
        )
    return made, {name: Stubber(client) for name, client in made.items()}, sent


def expect_modify(stub: Stubber, strategy: str) -> None:
    stub.add_response(
        "modify_replication_group",
        {"ReplicationGroup": {"ReplicationGroupId": GROUP, "Status": "modifying"}},
        {"ReplicationGroupId": GROUP, "AuthToken": ANY, "AuthTokenUpdateStrategy": strategy, "ApplyImmediately": True},
    )
    stub.add_response(
        "describe_replication_groups",
        {"ReplicationGroups": [{"ReplicationGroupId": GROUP, "Status": "available"}]},
        {"ReplicationGroupId": GROUP},
    )


def test_rotate_gives_elasticache_and_the_secret_the_same_new_token():
    made, stubs, sent = clients()
    expect_modify(stubs["elasticache"], "ROTATE")
    stubs["secretsmanager"].add_response(
        "put_secret_value",
        {"ARN": SECRET, "Name": "EksGcsStoreAuthToken", "VersionId": NEW_VERSION, "VersionStages": ["AWSCURRENT"]},
        {"SecretId": SECRET, "SecretString": ANY, "VersionStages": ["AWSCURRENT", ROTATED_STAGE]},
    )
    with stubs["elasticache"], stubs["secretsmanager"]:
        assert rotate(TOKEN, **made) == NEW_VERSION
    by_call = dict(sent)
    token = by_call["ModifyReplicationGroup"]["AuthToken"]
    assert by_call["PutSecretValue"]["SecretString"] == token
    assert len(token) == TOKEN_LENGTH and token.isalnum()
    # Before the group was available again, nothing touched the secret.
    assert [name for name, _ in sent] == ["ModifyReplicationGroup", "DescribeReplicationGroups", "PutSecretValue"]


def test_set_keeps_the_rotated_token_alone_and_drops_the_label():
    made, stubs, sent = clients()
    stubs["secretsmanager"].add_response(
        "get_secret_value",
        {"ARN": SECRET, "Name": "EksGcsStoreAuthToken", "VersionId": NEW_VERSION, "SecretString": "N3wT0ken" * 8},
        {"SecretId": SECRET, "VersionId": NEW_VERSION},
    )
    expect_modify(stubs["elasticache"], "SET")
    stubs["secretsmanager"].add_response(
        "update_secret_version_stage",
        {"ARN": SECRET, "Name": "EksGcsStoreAuthToken"},
        {"SecretId": SECRET, "VersionStage": ROTATED_STAGE, "RemoveFromVersionId": NEW_VERSION},
    )
    with stubs["elasticache"], stubs["secretsmanager"]:
        set_alone(TOKEN.model_copy(update={"rotated_version": NEW_VERSION}), **made)
    assert dict(sent)["ModifyReplicationGroup"]["AuthToken"] == "N3wT0ken" * 8


# --- kubectl: the mounts and the RayClusters ----------------------------------------------------------------


def podstatus(pod: str, version: str, provider: str = PROVIDER_CLASS) -> dict:
    return {
        "kind": "SecretProviderClassPodStatus",
        "metadata": {"name": f"{pod}-llm-{provider}"},
        "status": {
            "podName": pod,
            "secretProviderClassName": provider,
            "mounted": True,
            "objects": [{"id": SECRET, "version": version}],
        },
    }


def raycluster(name: str, generation: int | None) -> dict:
    annotations = {GENERATION_ANNOTATION: str(generation)} if generation else {}
    head = {"template": {"metadata": {"annotations": annotations}, "spec": {"containers": [{"name": "ray-head"}]}}}
    return {"kind": "RayCluster", "metadata": {"name": name}, "spec": {"headGroupSpec": head}}


def recorded(tmp_path, statuses: list[dict], clusters: list[dict]) -> RecordedKube:
    for args, items in (
        (["get", "secretproviderclasspodstatuses", "-n", "llm"], statuses),
        (["get", "rayclusters", "-n", "llm"], clusters),
    ):
        (tmp_path / f"{slug(args)}.json").write_text(json.dumps({"kind": "List", "items": items}))
    return RecordedKube(tmp_path)


@pytest.fixture
def config():
    data = dev_ft_data()
    data["ray_service"]["gcs_fault_tolerance"]["store"] = {"auth_token_generation": 2}
    return parse_config(data, source="dev.yaml")


def rotated(generation: int = 1) -> DeployFacts:
    return DeployFacts(store_token=TOKEN.model_copy(update={"rotated_version": NEW_VERSION, "generation": generation}))


def test_a_mount_still_on_the_old_version_holds_the_head_back(tmp_path, config):
    kube = recorded(
        tmp_path,
        [podstatus("pd-llm-a-head", NEW_VERSION), podstatus("pd-llm-a-cleanup", OLD_VERSION)],
        [raycluster("pd-llm-a", None)],
    )
    token = with_token_mounts(config, rotated(), kube).store_token
    assert token.mounts_synced is False and token.older_clusters == ["pd-llm-a"]


def test_every_mount_on_the_rotated_version_lets_the_head_move(tmp_path, config):
    # Another SecretProviderClass's mounts (an API key's) say nothing about this token.
    statuses = [podstatus("pd-llm-a-head", NEW_VERSION), podstatus("pd-llm-a-worker", OLD_VERSION, "api-keys")]
    kube = recorded(tmp_path, statuses, [raycluster("pd-llm-a", None), raycluster("pd-llm-b", 2)])
    token = with_token_mounts(config, rotated(), kube).store_token
    assert token.mounts_synced is True and token.older_clusters == ["pd-llm-a"]
    assert mounts_hold([], NEW_VERSION)  # nothing mounted: a new head reads the current version


@pytest.mark.parametrize("ask", ["offline", "kubectl fails"])
def test_a_cluster_that_cannot_be_asked_leaves_both_unknown(tmp_path, config, capsys, ask):
    kube = None if ask == "offline" else RecordedKube(tmp_path)  # no recordings: every read fails
    token = with_token_mounts(config, rotated(), kube).store_token
    assert token.mounts_synced is None and token.older_clusters is None
    assert capsys.readouterr().out.startswith("GCS store token: ")


# --- the guard ---------------------------------------------------------------------------------------------


def test_the_guard_reads_where_the_rotation_stands():
    verdict = guard("store-token-rotated", config_data())
    assert verdict.errors == [] and verdict.warnings == []
    assert verdict.facts.store_token == DeployedStoreToken(
        secret_arn=SECRET, replication_group=GROUP, rotated_version=NEW_VERSION
    )
