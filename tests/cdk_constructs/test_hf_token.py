"""A gated model's Hugging Face token reaches the pods by reference (Secrets Store CSI + ASCP, Pod
Identity) and never travels as a value: not in the template, the Serve config, a runtime_env or an
environment variable Ray copies."""

from __future__ import annotations

import json

import pytest
import yaml

from config import versions
from config.loader import ConfigError, parse_config
from manifests import hf_token
from manifests.contract import RAY_HEAD_SERVICE_ACCOUNT, RAY_WORKER_SERVICE_ACCOUNT
from tests.conftest import CONFIG_DIR, synth_variant
from tests.secret_scan import find_secrets

SECRET = "pd-serving/hf-token"
GATED_MODEL = {
    "model_id": "llama-3.1-8b",
    "source": "meta-llama/Llama-3.1-8B-Instruct",
    "gated": True,
    "hf_token_secret": SECRET,
}


def gated_data(secret: str = SECRET) -> dict:
    data = yaml.safe_load((CONFIG_DIR / "dev.yaml").read_text())
    data["serving"]["model"] = {**GATED_MODEL, "hf_token_secret": secret}
    return data


@pytest.fixture(scope="module")
def gated(variant):
    stack, template, _ = variant("gated", gated_data())
    return stack, template


def charts(template) -> dict[str, dict]:
    return {r["Properties"]["Chart"]: r for r in template.find_resources("Custom::AWSCDK-EKS-HelmChart").values()}


def test_each_gpu_worker_mounts_the_secret_through_the_csi_driver_and_the_head_does_not(gated):
    """Only the engine replicas read the token; on the head a missing secret would stop the cluster."""
    stack, _ = gated
    cluster = stack.serving.manifest_body["spec"]["rayClusterConfig"]
    head = cluster["headGroupSpec"]["template"]["spec"]
    assert all(v["name"] != hf_token.VOLUME for v in head.get("volumes", []))
    assert "HF_TOKEN_PATH" not in {e["name"] for e in head["containers"][0].get("env", [])}
    for group in cluster["workerGroupSpecs"]:
        pod = group["template"]["spec"]
        (volume,) = [v for v in pod["volumes"] if v["name"] == hf_token.VOLUME]
        assert volume["csi"] == {
            "driver": "secrets-store.csi.k8s.io",
            "readOnly": True,
            "volumeAttributes": {"secretProviderClass": hf_token.PROVIDER_CLASS},
        }
        (container,) = pod["containers"]
        assert {"name": hf_token.VOLUME, "mountPath": hf_token.MOUNT_PATH, "readOnly": True} in container[
            "volumeMounts"
        ]
        env = {e["name"]: e for e in container["env"]}
        assert env["HF_TOKEN_PATH"]["value"] == f"{hf_token.MOUNT_PATH}/{hf_token.FILE_NAME}"
        assert "HF_TOKEN" not in env and "HUGGING_FACE_HUB_TOKEN" not in env


def test_the_provider_class_names_exactly_the_configured_secret(gated):
    stack, template = gated
    spc = stack.serving.hf_token.manifest_body
    assert spc["kind"] == "SecretProviderClass" and spc["metadata"]["namespace"] == "llm"
    params = spc["spec"]["parameters"]
    assert params["usePodIdentity"] == "true" and params["region"] == "us-east-2"
    assert yaml.safe_load(params["objects"]) == [
        {"objectName": SECRET, "objectType": "secretsmanager", "objectAlias": hf_token.FILE_NAME}
    ]
    manifests = json.dumps(template.find_resources("Custom::AWSCDK-EKS-KubernetesResource"))
    assert "SecretProviderClass" in manifests


def test_only_the_gpu_workers_role_may_read_that_one_secret(gated):
    _, template = gated
    readers = []
    for logical_id, policy in template.find_resources("AWS::IAM::Policy").items():
        for statement in policy["Properties"]["PolicyDocument"]["Statement"]:
            actions = statement["Action"] if isinstance(statement["Action"], list) else [statement["Action"]]
            if any(a.startswith("secretsmanager:") for a in actions):
                readers.append((logical_id, statement))
    ((logical_id, statement),) = readers
    # The policy is the GPU workers' role's: the role of their service account's Pod Identity association.
    (association,) = [
        r["Properties"]
        for r in template.find_resources("AWS::EKS::PodIdentityAssociation").values()
        if r["Properties"]["ServiceAccount"] == RAY_WORKER_SERVICE_ACCOUNT
    ]
    ray_role = association["RoleArn"]["Fn::GetAtt"][0]
    policy = template.to_json()["Resources"][logical_id]
    assert policy["Properties"]["Roles"] == [{"Ref": ray_role}]
    assert set(statement["Action"]) == {"secretsmanager:GetSecretValue", "secretsmanager:DescribeSecret"}
    resource = json.dumps(statement["Resource"])
    assert f"secret:{SECRET}-??????" in resource
    assert "secret:*" not in resource


def test_driver_and_provider_are_pinned_run_everywhere_and_have_no_aws_role(gated):
    _, template = gated
    found = charts(template)
    driver = found["secrets-store-csi-driver"]["Properties"]
    provider = found["secrets-store-csi-driver-provider-aws"]["Properties"]
    assert driver["Version"] == versions.SECRETS_STORE_CSI_DRIVER.version
    assert provider["Version"] == versions.SECRETS_STORE_CSI_PROVIDER_AWS.version
    driver_values, provider_values = json.loads(driver["Values"]), json.loads(provider["Values"])
    assert driver_values["linux"]["tolerations"] == [{"operator": "Exists"}]
    assert {"audience": "pods.eks.amazonaws.com"} in driver_values["tokenRequests"]
    assert provider_values["tolerations"] == [{"operator": "Exists"}]
    assert provider_values["secrets-store-csi-driver"] == {"install": False}
    associations = [
        r["Properties"]["ServiceAccount"] for r in template.find_resources("AWS::EKS::PodIdentityAssociation").values()
    ]
    assert not any("secrets-store" in sa for sa in associations)


def test_nothing_of_it_without_a_token_secret(synthesized):
    _, stack, template, _, _ = synthesized("dev")
    assert not {"secrets-store-csi-driver", "secrets-store-csi-driver-provider-aws"} & set(charts(template))
    assert "SecretProviderClass" not in json.dumps(template.find_resources("Custom::AWSCDK-EKS-KubernetesResource"))
    assert "HF_TOKEN_PATH" not in json.dumps(stack.serving.manifest_body)


def test_secret_scan_covers_the_new_manifests(gated, tmp_path):
    stack, template = gated
    texts = [
        json.dumps(template.to_json()),
        json.dumps(stack.serving.manifest_body),
        json.dumps(stack.serving.hf_token.manifest_body),
        stack.serving.serve_config_v2,
    ]
    for text in texts:
        assert find_secrets(text) == []
    planted = json.dumps(stack.serving.hf_token.manifest_body).replace(SECRET, "hf_" + "b" * 34)
    assert find_secrets(planted)


@pytest.mark.parametrize(
    ("secret", "fix"),
    [
        ("", "1-512 characters"),
        ("my secret", "letters, digits and /_+=.@-"),
        ("x" * 513, "1-512 characters"),
        ("arn:aws:secretsmanager:us-east-2:000000000000:secret:hf-token", "complete Secrets Manager ARN"),
        ("arn:aws:secretsmanager:eu-west-1:000000000000:secret:hf-token-AbC123", "in us-east-2"),
    ],
)
def test_a_secret_name_secrets_manager_would_refuse_is_a_config_error(secret, fix):
    with pytest.raises(ConfigError) as caught:
        parse_config(gated_data(secret), source="dev.yaml")
    (line,) = caught.value.problems
    assert "hf_token_secret" in line and fix in line


def test_gated_model_without_a_secret_is_still_refused():
    data = gated_data()
    del data["serving"]["model"]["hf_token_secret"]
    with pytest.raises(ConfigError, match="is gated but hf_token_secret is not set"):
        parse_config(data)


def test_a_complete_arn_in_the_region_is_accepted(tmp_path):
    arn = "arn:aws:secretsmanager:us-east-2:000000000000:secret:pd-serving/hf-token-AbC123"
    stack, template = synth_variant(tmp_path, gated_data(arn), "gated-arn")
    assert yaml.safe_load(stack.serving.hf_token.manifest_body["spec"]["parameters"]["objects"])[0]["objectName"] == arn
    assert arn in json.dumps(template.find_resources("AWS::IAM::Policy"))


def _depends_on(resource: dict) -> set[str]:
    found = resource.get("DependsOn", [])
    return {found} if isinstance(found, str) else set(found)


def test_the_driver_installs_after_the_nodes_and_outlives_the_namespace(gated):
    """Install: the driver chart's pre-install hook Job needs a node within Helm's timeout.
    Destroy runs in reverse: the llm namespace, and with it every pod that mounts through the
    driver, is gone before the driver."""
    _, template = gated
    resources = template.to_json()["Resources"]
    (driver_id,) = [
        k
        for k, r in resources.items()
        if r["Type"] == "Custom::AWSCDK-EKS-HelmChart" and r["Properties"]["Chart"] == "secrets-store-csi-driver"
    ]
    nodegroups = {k for k, r in resources.items() if r["Type"] == "AWS::EKS::Nodegroup"}
    assert len(nodegroups) == 3 and nodegroups <= _depends_on(resources[driver_id])
    manifests = {
        k: json.dumps(r["Properties"]["Manifest"])
        for k, r in resources.items()
        if r["Type"] == "Custom::AWSCDK-EKS-KubernetesResource"
    }
    (namespace_id,) = [k for k, m in manifests.items() if '\\"kind\\":\\"Namespace\\"' in m and '\\"llm\\"' in m]
    assert driver_id in _depends_on(resources[namespace_id])
    (provider_class_id,) = [k for k, m in manifests.items() if "SecretProviderClass" in m]
    assert {driver_id, namespace_id} <= _depends_on(resources[provider_class_id])


def test_the_template_has_no_dependency_cycle(gated):
    _, template = gated
    resources = template.to_json()["Resources"]

    def references(value) -> set[str]:
        if isinstance(value, dict):
            if "Ref" in value:
                return {value["Ref"]}
            if "Fn::GetAtt" in value:
                return {value["Fn::GetAtt"][0]}
            return set().union(*(references(v) for v in value.values()))
        if isinstance(value, list):
            return set().union(*(references(v) for v in value))
        return set()

    graph = {k: (_depends_on(r) | references(r.get("Properties", {}))) & set(resources) for k, r in resources.items()}
    state: dict[str, str] = {}

    def visit(node: str, path: list[str]) -> None:
        if state.get(node) == "done":
            return
        assert state.get(node) != "open", f"dependency cycle: {' -> '.join([*path, node])}"
        state[node] = "open"
        for needed in graph.get(node, ()):
            visit(needed, [*path, node])
        state[node] = "done"

    for node in graph:
        visit(node, [])


# --- a token secret encrypted with a customer-managed KMS key -------------------------------------

TOKEN_KEY = "arn:aws:kms:us-east-2:000000000000:key/1234abcd-12ab-34cd-56ef-1234567890ab"
DECRYPT_THROUGH_SECRETS_MANAGER = {
    "Action": "kms:Decrypt",
    "Effect": "Allow",
    "Resource": TOKEN_KEY,
    "Condition": {"StringEquals": {"kms:ViaService": "secretsmanager.us-east-2.amazonaws.com"}},
}


def gated_mirror_data() -> dict:
    data = gated_data()
    data["model_mirror"] = {"enabled": True}
    return data


def decrypt_statements(template, service_account: str) -> list[dict]:
    """The kms:Decrypt statements of the role a service account's Pod Identity association names."""
    (association,) = [
        r["Properties"]
        for r in template.find_resources("AWS::EKS::PodIdentityAssociation").values()
        if r["Properties"]["ServiceAccount"] == service_account
    ]
    role = association["RoleArn"]["Fn::GetAtt"][0]
    found = []
    for policy in template.find_resources("AWS::IAM::Policy").values():
        if {"Ref": role} not in policy["Properties"]["Roles"]:
            continue
        for statement in policy["Properties"]["PolicyDocument"]["Statement"]:
            actions = statement["Action"] if isinstance(statement["Action"], list) else [statement["Action"]]
            if any(a.startswith("kms:") for a in actions):
                found.append(statement)
    return found


def test_a_customer_managed_token_key_may_be_used_through_secrets_manager_only(tmp_path):
    from aws_cdk.assertions import Template

    from app import build_app

    config_path = tmp_path / "gated-key.yaml"
    config_path.write_text(yaml.safe_dump(gated_mirror_data()))
    facts = tmp_path / "facts.json"
    facts.write_text(json.dumps({"hf_token_kms_key_arn": TOKEN_KEY}))
    stack = build_app(str(config_path), outdir=str(tmp_path / "out"), deploy_facts=str(facts)).node.children[0]
    template = Template.from_stack(stack)
    # The GPU workers mount the token; the mirror Job mounts it too, with its own role; the head does not.
    assert decrypt_statements(template, RAY_WORKER_SERVICE_ACCOUNT) == [DECRYPT_THROUGH_SECRETS_MANAGER]
    assert decrypt_statements(template, RAY_HEAD_SERVICE_ACCOUNT) == []
    assert decrypt_statements(template, "model-mirror") == [DECRYPT_THROUGH_SECRETS_MANAGER]


def test_no_key_grant_without_a_customer_managed_key(variant):
    _, template, _ = variant("gated-mirror", gated_mirror_data())
    assert decrypt_statements(template, RAY_WORKER_SERVICE_ACCOUNT) == []
    assert decrypt_statements(template, "model-mirror") == []
