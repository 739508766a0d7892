"""The GCS fault-tolerance store in the template: ElastiCache for Valkey in the private subnets, TLS
and at-rest encryption, an AUTH token by reference, reachable from the cluster security group only;
and the token's path to the head (the CSI driver's Secret sync), never as a value."""

from __future__ import annotations

import json

import pytest
import yaml

from config import versions
from manifests import gcs_store
from tests.conftest import CONFIG_DIR, with_changes

RG = "AWS::ElastiCache::ReplicationGroup"


def dev_ft_data() -> dict:
    data = yaml.safe_load((CONFIG_DIR / "dev.yaml").read_text())
    return with_changes(data, {"ray_service.gcs_fault_tolerance": {"enabled": True}})


@pytest.fixture(scope="module")
def prod(synthesized):
    _, stack, template, _, _ = synthesized("prod")
    return stack, template


@pytest.fixture(scope="module")
def dev_ft(variant):
    stack, template, _ = variant("gcs-ft-dev", dev_ft_data())
    return stack, template


def only(template, resource_type: str) -> tuple[str, dict]:
    (found,) = template.find_resources(resource_type).items()
    return found


def store_token(template) -> tuple[str, dict]:
    """The store's AUTH token among the stack's secrets (every stack has a cache-salt secret too)."""
    (found,) = [
        item
        for item in template.find_resources("AWS::SecretsManager::Secret").items()
        if "GCS store" in item[1]["Properties"]["Description"]
    ]
    return found


def test_prod_store_is_valkey_with_a_replica_tls_auth_and_at_rest_encryption(prod):
    stack, template = prod
    logical_id, rg = only(template, RG)
    props = rg["Properties"]
    assert props["Engine"] == versions.GCS_STORE_ENGINE == "valkey"
    assert props["EngineVersion"] == versions.GCS_STORE_ENGINE_VERSION
    assert props["CacheNodeType"] == "cache.t4g.small"
    assert props["NumCacheClusters"] == 2
    assert props["MultiAZEnabled"] is True and props["AutomaticFailoverEnabled"] is True
    assert props["TransitEncryptionEnabled"] is True and props["TransitEncryptionMode"] == "required"
    assert props["AtRestEncryptionEnabled"] is True
    assert props["Port"] == gcs_store.STORE_PORT
    assert rg["DeletionPolicy"] == "Delete"
    # The AUTH token is a dynamic reference to the stack's secret, resolved by CloudFormation.
    secret_id, secret = store_token(template)
    token = json.dumps(props["AuthToken"])
    assert "{{resolve:secretsmanager:" in token and secret_id in token
    assert secret["DeletionPolicy"] == "Delete"
    generated = secret["Properties"]["GenerateSecretString"]
    assert generated["ExcludePunctuation"] is True and generated["PasswordLength"] >= 16


def test_store_sits_in_its_own_subnet_group_of_the_private_subnets(prod):
    stack, template = prod
    _, rg = only(template, RG)
    subnet_group_id, subnet_group = only(template, "AWS::ElastiCache::SubnetGroup")
    assert rg["Properties"]["CacheSubnetGroupName"] == {"Ref": subnet_group_id}
    private = {stack.resolve(s.subnet_id)["Ref"] for s in stack.network.private_subnets}
    assert {s["Ref"] for s in subnet_group["Properties"]["SubnetIds"]} == private


def test_only_the_cluster_security_group_reaches_the_store_and_only_on_6379(prod):
    stack, template = prod
    _, rg = only(template, RG)
    (sg_ref,) = rg["Properties"]["SecurityGroupIds"]
    sg_id = sg_ref["Fn::GetAtt"][0]
    sg = template.to_json()["Resources"][sg_id]["Properties"]
    (rule,) = sg["SecurityGroupIngress"]
    assert (rule["IpProtocol"], rule["FromPort"], rule["ToPort"]) == ("tcp", 6379, 6379)
    assert rule["SourceSecurityGroupId"] == stack.resolve(stack.cluster.cluster_security_group_id)
    assert "CidrIp" not in rule
    # No egress: CDK's placeholder rule that matches no traffic.
    (egress,) = sg["SecurityGroupEgress"]
    assert egress["CidrIp"] == "255.255.255.255/32"


def test_dev_store_is_a_single_node(dev_ft):
    _, template = dev_ft
    _, rg = only(template, RG)
    assert rg["Properties"]["NumCacheClusters"] == 1
    assert rg["Properties"]["MultiAZEnabled"] is False


def test_dev_without_fault_tolerance_has_no_store(synthesized):
    _, stack, template, _, _ = synthesized("dev")
    assert not template.find_resources(RG)
    assert stack.gcs_store is None
    assert "gcsFaultToleranceOptions" not in stack.serving.manifest_body["spec"]["rayClusterConfig"]


def test_the_rayservice_gets_the_primary_endpoint_and_the_secret_by_name(prod):
    stack, template = prod
    rg_id, _ = only(template, RG)
    options = stack.resolve(stack.serving.manifest_body["spec"]["rayClusterConfig"]["gcsFaultToleranceOptions"])
    assert options["redisPassword"] == {
        "valueFrom": {"secretKeyRef": {"name": gcs_store.SECRET_NAME, "key": gcs_store.SECRET_KEY}}
    }
    assert options["redisAddress"] == {
        "Fn::Join": ["", ["rediss://", {"Fn::GetAtt": [rg_id, "PrimaryEndPoint.Address"]}, ":6379"]]
    }


def test_the_token_reaches_the_head_by_reference_only(prod):
    """The SecretProviderClass names the secret by ARN and syncs it into the Secret that
    redisPassword references; the CSI driver may sync Secrets; the head's role may read this secret."""
    stack, template = prod
    secret_id, _ = store_token(template)
    spc = stack.resolve(stack.serving.gcs_provider_class_body)
    assert spc["spec"]["secretObjects"] == [
        {
            "secretName": gcs_store.SECRET_NAME,
            "type": "Opaque",
            "data": [{"objectName": gcs_store.FILE_NAME, "key": gcs_store.SECRET_KEY}],
        }
    ]
    assert secret_id in json.dumps(spc["spec"]["parameters"]["objects"])
    charts = {r["Properties"]["Chart"]: r for r in template.find_resources("Custom::AWSCDK-EKS-HelmChart").values()}
    assert json.loads(charts["secrets-store-csi-driver"]["Properties"]["Values"])["syncSecret"] == {"enabled": True}
    policies = json.dumps(template.find_resources("AWS::IAM::Policy"))
    assert "secretsmanager:GetSecretValue" in policies and secret_id in policies
    # Nowhere but the replication group's AuthToken does the template resolve the secret's value.
    resolved = [
        rid for rid, r in template.to_json()["Resources"].items() if "{{resolve:secretsmanager:" in json.dumps(r)
    ]
    (rg_id, _) = only(template, RG)
    assert resolved == [rg_id]


def test_teardown_keeps_the_store_until_the_namespace_is_gone(prod):
    """KubeRay's Redis cleanup Job (the RayCluster's finalizer) runs while the namespace is deleted;
    the namespace depends on the store, so CloudFormation deletes the store after it."""
    stack, template = prod
    namespace_id = stack.resolve(stack.serving.namespace.node.default_child.logical_id)
    depends = template.to_json()["Resources"][namespace_id].get("DependsOn", [])
    rg_id, _ = only(template, RG)
    assert rg_id in depends


def test_without_fault_tolerance_the_driver_syncs_no_secrets(variant):
    """A gated model alone mounts its token as a file: the driver gets no RBAC for Secrets."""
    from tests.cdk_constructs.test_hf_token import gated_data

    _, template, _ = variant("gated", gated_data())
    charts = {r["Properties"]["Chart"]: r for r in template.find_resources("Custom::AWSCDK-EKS-HelmChart").values()}
    assert "syncSecret" not in json.loads(charts["secrets-store-csi-driver"]["Properties"]["Values"])


def ray_reads_from_env(name: str, value: str) -> str:
    """What Ray's own system config (``ray._raylet.Config``) holds for ``name`` with the environment
    variable the manifest sets: proof that Ray reads that variable, not a name copied by hand."""
    import os
    import subprocess
    import sys

    key = name.removeprefix("RAY_")
    script = f"from ray._raylet import Config; Config.initialize(''); print(Config.{key}().decode())"
    env = {**os.environ, name: value}
    return subprocess.run(
        [sys.executable, "-c", script], env=env, capture_output=True, text=True, check=True
    ).stdout.strip()


@pytest.mark.serving  # asks Ray's own config reader (requirements-serve.txt)
def test_the_head_trusts_the_images_ca_bundle_for_the_stores_tls(prod):
    """A rediss:// store: the head (and so KubeRay's cleanup Job, built from its template) names the
    image's CA bundle in the variable Ray's GCS reads its CA file from; no worker gets it."""
    stack, _ = prod
    cluster = stack.resolve(stack.serving.manifest_body["spec"]["rayClusterConfig"])
    assert json.dumps(cluster["gcsFaultToleranceOptions"]["redisAddress"]).startswith('{"Fn::Join": ["", ["rediss://')
    head_env = cluster["headGroupSpec"]["template"]["spec"]["containers"][0]["env"]
    (name,) = [e["name"] for e in head_env if e.get("value") == versions.SERVING_IMAGE_CA_BUNDLE]
    assert versions.SERVING_IMAGE_CA_BUNDLE == "/etc/pki/tls/certs/ca-bundle.crt"  # Amazon Linux 2023's
    assert ray_reads_from_env(name, versions.SERVING_IMAGE_CA_BUNDLE) == versions.SERVING_IMAGE_CA_BUNDLE
    for group in cluster["workerGroupSpecs"]:
        assert name not in {e["name"] for e in group["template"]["spec"]["containers"][0].get("env", [])}


def test_a_store_without_tls_gets_no_ca_the_local_servers_loopback_redis():
    """`make local HA=1` runs the GCS on a loopback Redis without TLS: its address has no rediss://
    scheme, so no CA file is named for it."""
    from local.ray_internals import gcs_fault_tolerance_env

    local = gcs_fault_tolerance_env("127.0.0.1:6380", namespace="run")
    assert gcs_store.tls_env(local["RAY_REDIS_ADDRESS"]) == []
    assert not any(name.endswith("CA_CERT") for name in local)
    assert gcs_store.tls_env(gcs_store.redis_address("store.example")) != []
