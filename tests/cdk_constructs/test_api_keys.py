"""The endpoint's API keys reach the keyed ingress by reference: Secrets Manager secrets, mounted
on the GPU workers by the CSI driver and read there with the Ray pods' Pod Identity role, and named
in the Serve config only by the directory they are mounted at."""

from __future__ import annotations

import json

import pytest
import yaml

from manifests import api_keys
from tests.conftest import CONFIG_DIR

SECRETS = ["pd-serving/api-key-1", "arn:aws:secretsmanager:us-east-2:000000000000:secret:pd-serving/api-key-2-Zx9cVb"]
CUSTOMER_KEY = "arn:aws:kms:us-east-2:000000000000:key/1234abcd-12ab-34cd-56ef-1234567890ab"


def keyed_data() -> dict:
    data = yaml.safe_load((CONFIG_DIR / "dev.yaml").read_text())
    data["ray_service"].setdefault("endpoint", {})["api_key_secrets"] = list(SECRETS)
    return data


@pytest.fixture(scope="module")
def keyed(variant):
    from config.schema import DeployFacts

    stack, template, _ = variant("api-keys", keyed_data(), DeployFacts(api_key_kms_key_arns=[CUSTOMER_KEY]))
    return stack, template


def test_the_gpu_workers_mount_each_key_and_the_head_none(keyed):
    stack, _ = keyed
    cluster = stack.serving.manifest_body["spec"]["rayClusterConfig"]
    head = cluster["headGroupSpec"]["template"]["spec"]
    assert all(v["name"] != api_keys.VOLUME for v in head.get("volumes", []))
    for group in cluster["workerGroupSpecs"]:
        pod = group["template"]["spec"]
        (volume,) = [v for v in pod["volumes"] if v["name"] == api_keys.VOLUME]
        assert volume["csi"]["volumeAttributes"] == {"secretProviderClass": api_keys.PROVIDER_CLASS}
        assert {"name": api_keys.VOLUME, "mountPath": api_keys.MOUNT_PATH, "readOnly": True} in pod["containers"][0][
            "volumeMounts"
        ]


def test_the_provider_class_names_each_secret_as_its_own_file(keyed):
    stack, template = keyed
    body = stack.serving.api_keys_provider_class_body
    assert body["metadata"] == {"name": api_keys.PROVIDER_CLASS, "namespace": "llm"}
    objects = yaml.safe_load(body["spec"]["parameters"]["objects"])
    assert objects == [
        {"objectName": SECRETS[0], "objectType": "secretsmanager", "objectAlias": "key-0"},
        {"objectName": SECRETS[1], "objectType": "secretsmanager", "objectAlias": "key-1"},
    ]
    assert body["spec"]["parameters"]["usePodIdentity"] == "true"
    # Applied before the RayService, whose workers mount it.
    depends_on = {d.node.path for d in stack.serving.manifest.node.dependencies}
    assert stack.serving.api_keys_provider_class.node.path in depends_on


def test_the_serve_config_names_the_directory_and_never_a_key(keyed):
    stack, _ = keyed
    application = yaml.safe_load(stack.serving.serve_config_v2)["applications"][0]
    assert application["args"]["api_key_dir"] == api_keys.MOUNT_PATH
    from serve_app.spec import ServingSpec

    _, builder_args = ServingSpec.model_validate(application["args"]).builder_args()
    assert builder_args["ingress_cls_config"] == {
        "ingress_cls": "serve_app.ingress:KeyedOpenAiIngress",
        "ingress_extra_kwargs": {"api_key_dir": api_keys.MOUNT_PATH, "cache_salt_file": api_keys.SALT_PATH},
    }


def test_the_ray_pods_may_read_exactly_those_secrets_and_decrypt_with_the_customer_key(keyed):
    _, template = keyed
    statements = [
        s
        for policy in template.find_resources("AWS::IAM::Policy").values()
        for s in policy["Properties"]["PolicyDocument"]["Statement"]
    ]
    reads = [s for s in statements if "secretsmanager:GetSecretValue" in json.dumps(s["Action"])]
    text = json.dumps(reads)
    assert "secret:pd-serving/api-key-1-??????" in text and SECRETS[1] in text
    (decrypt,) = [s for s in statements if s["Action"] == "kms:Decrypt"]
    assert decrypt["Resource"] == CUSTOMER_KEY
    assert decrypt["Condition"] == {"StringEquals": {"kms:ViaService": "secretsmanager.us-east-2.amazonaws.com"}}


def test_each_key_gets_a_cache_of_its_own_under_a_secret_the_stack_generates(keyed):
    stack, template = keyed
    (salt_id,) = [
        rid
        for rid, secret in template.find_resources("AWS::SecretsManager::Secret").items()
        if "Cache-salt" in secret["Properties"]["Description"]
    ]
    secret = template.to_json()["Resources"][salt_id]
    assert secret["Properties"]["GenerateSecretString"]["PasswordLength"] == 64
    assert secret["DeletionPolicy"] == "Delete"
    # Mounted apart from the keys (every file there is a key), on the GPU workers only.
    cluster = stack.serving.manifest_body["spec"]["rayClusterConfig"]
    assert all(
        v["name"] != api_keys.SALT_VOLUME for v in cluster["headGroupSpec"]["template"]["spec"].get("volumes", [])
    )
    for group in cluster["workerGroupSpecs"]:
        pod = group["template"]["spec"]
        (volume,) = [v for v in pod["volumes"] if v["name"] == api_keys.SALT_VOLUME]
        assert volume["csi"]["volumeAttributes"] == {"secretProviderClass": api_keys.SALT_PROVIDER_CLASS}
        mounts = {m["mountPath"] for m in pod["containers"][0]["volumeMounts"]}
        assert api_keys.SALT_MOUNT_PATH in mounts and not api_keys.SALT_PATH.startswith(api_keys.MOUNT_PATH + "/")
    depends_on = {d.node.path for d in stack.serving.manifest.node.dependencies}
    assert stack.serving.cache_salt_provider_class.node.path in depends_on
    # Only the workers' role reads it.
    reads = [
        s
        for policy in template.find_resources("AWS::IAM::Policy").values()
        for s in policy["Properties"]["PolicyDocument"]["Statement"]
        if salt_id in json.dumps(s.get("Resource"))
    ]
    assert reads and all("secretsmanager:GetSecretValue" in json.dumps(s["Action"]) for s in reads)


def test_keys_of_one_tenant_may_share_the_cache(variant):
    from config.loader import parse_config
    from tests.conftest import rendered_ray_service

    data = keyed_data()
    data["ray_service"]["endpoint"]["cache_isolation"] = "shared"
    manifest = rendered_ray_service(parse_config(data))
    for group in manifest["spec"]["rayClusterConfig"]["workerGroupSpecs"]:
        assert all(v["name"] != api_keys.SALT_VOLUME for v in group["template"]["spec"]["volumes"])


def test_without_keys_nothing_is_mounted_and_the_ingress_is_rays(variant):
    from config.loader import parse_config
    from tests.conftest import rendered_ray_service

    config = parse_config(yaml.safe_load((CONFIG_DIR / "dev.yaml").read_text()))
    manifest = rendered_ray_service(config)
    for group in manifest["spec"]["rayClusterConfig"]["workerGroupSpecs"]:
        assert all(v["name"] != api_keys.VOLUME for v in group["template"]["spec"].get("volumes", []))
    assert config.serving.api_key_dir is None


def test_the_synth_summary_says_whether_the_endpoint_asks_for_a_key(variant, synthesized):
    """`make synth`'s summary reads the key from the template it synthesized (the Serve config's
    serving spec names a key directory), for a keyed endpoint, a cluster-internal one without a key, and an NLB
    opened to the VPC without one."""
    from cli.summary import openai_endpoint, summarize
    from config.loader import parse_config
    from config.schema import DeployFacts

    _, _, outdir = variant("api-keys", keyed_data(), DeployFacts(api_key_kms_key_arns=[CUSTOMER_KEY]))
    keyed_summary = summarize(str(outdir.parent / "api-keys.yaml"), str(outdir))
    assert "  OpenAI endpoint inside the cluster only (kubectl port-forward); asks for an API key (2 secret(s)" in (
        keyed_summary
    )
    config, _, _, _, dev_out = synthesized("dev")
    assert "  OpenAI endpoint inside the cluster only (kubectl port-forward); asks for no key" in summarize(
        str(CONFIG_DIR / "dev.yaml"), str(dev_out)
    )
    data = yaml.safe_load((CONFIG_DIR / "dev.yaml").read_text())
    data["ray_service"]["endpoint"] = {
        "internal_nlb": True,
        "allowed_cidrs": ["10.0.0.0/8"],
        "open_to_vpc_without_key": True,
    }
    open_nlb = parse_config(data)
    keyless_template = (dev_out / f"{config.stack_name}.template.json").read_text()
    assert openai_endpoint(open_nlb, keyless_template) == (
        "internal NLB for 10.0.0.0/8, Serve's port open to the whole VPC; asks for NO key: any pod in the VPC may "
        "call it (open_to_vpc_without_key)"
    )
