"""Each Pod Identity role reads exactly what the pods that run as its service account use: the
secrets their CSI volumes mount (and the customer-managed keys those are encrypted with), and, for
the Ray pods, the S3 objects they fetch. The pods are taken from what the stack applies (the
Kubernetes manifests in the synthesized template), with KubeRay's Redis cleanup Job as KubeRay 1.7.0
builds it from the head (``kuberay.oracle.redis_cleanup_pod``) and the mirror Job as `make
mirror-model` renders it; the grants from the synthesized IAM policies."""

from __future__ import annotations

import json
import shlex
from dataclasses import dataclass, field
from fnmatch import fnmatchcase
from typing import Any

import pytest
import yaml

from config.schema import DeployFacts
from kuberay.oracle import ray_start_resources, redis_cleanup_pod
from manifests import api_keys
from manifests.hf_token import CSI_DRIVER
from manifests.ray_service import streamer_wheels_location
from tests.conftest import CONFIG_DIR

HF_SECRET = "pd-serving/hf-token"
API_KEY_SECRETS = [
    "pd-serving/api-key-1",
    "arn:aws:secretsmanager:us-west-2:000000000000:secret:pd-serving/api-key-2-Zx9cVb",
]
FACTS = DeployFacts(
    hf_token_kms_key_arn="arn:aws:kms:us-west-2:000000000000:key/11111111-2222-3333-4444-555555555555",
    api_key_kms_key_arns=["arn:aws:kms:us-west-2:000000000000:key/66666666-7777-8888-9999-000000000000"],
)
# A secret named without its ARN is found by name; Secrets Manager's ARN ends in "-" and six characters.
SECRET_ARN_SUFFIX = "-a1B2c3"
SECRET_READS = {"secretsmanager:GetSecretValue", "secretsmanager:DescribeSecret"}
READ_ACTIONS = {*SECRET_READS, "kms:Decrypt", "s3:GetObject", "s3:ListBucket"}


def everything_data() -> dict:
    """prod (GCS fault tolerance on) with a gated model streamed from the stack's mirror (its wheels
    too) and two API keys, one named, one by ARN."""
    data = yaml.safe_load((CONFIG_DIR / "prod.yaml").read_text())
    aws = data["aws"]
    mirror = f"{data['name']}-models-{aws['account']}-{aws['region']}"
    data["model_mirror"] = {"enabled": True}
    data["serving"]["model"] = {
        "model_id": "llama-3.1-8b",
        "source": f"s3://{mirror}/llama-3.1-8b",
        "hub_id": "meta-llama/Llama-3.1-8B-Instruct",
        "gated": True,
        "hf_token_secret": HF_SECRET,
    }
    data["ray_service"].setdefault("endpoint", {})["api_key_secrets"] = list(API_KEY_SECRETS)
    return data


CASES = ["dev", "prod", "everything"]


@pytest.fixture(scope="module", params=CASES)
def case(request, synthesized, variant):
    if request.param == "everything":
        stack, template, _ = variant("pod-identities-everything", everything_data(), FACTS)
        return stack.config, stack, template.to_json(), FACTS
    config, stack, template, _, _ = synthesized(request.param)
    return config, stack, template.to_json(), DeployFacts()


# --- the template as CloudFormation would resolve it ------------------------------------------------


def resolved(value: Any, stack) -> Any:
    """A value with the intrinsics this stack's Kubernetes manifests and IAM policies use resolved as
    far as synth knows them: pseudo parameters to the stack's environment, a resource's Ref or GetAtt
    to a stand-in that names it (equal wherever the same resource is named)."""
    if isinstance(value, list):
        return [resolved(v, stack) for v in value]
    if not isinstance(value, dict):
        return value
    if "Ref" in value:
        pseudo = {"AWS::Partition": "aws", "AWS::Region": stack.region, "AWS::AccountId": stack.account}
        return pseudo.get(value["Ref"], f"ref:{value['Ref']}")
    if "Fn::GetAtt" in value:
        return "getatt:" + ".".join(value["Fn::GetAtt"])
    if "Fn::Join" in value:
        separator, parts = value["Fn::Join"]
        return separator.join(resolved(p, stack) for p in parts)
    return {k: resolved(v, stack) for k, v in value.items()}


def applied_objects(template: dict, stack) -> list[dict]:
    objects = []
    for resource in template["Resources"].values():
        if resource["Type"] == "Custom::AWSCDK-EKS-KubernetesResource":
            objects.extend(json.loads(resolved(resource["Properties"]["Manifest"], stack)))
    return objects


@dataclass
class Grants:
    secrets: set[str] = field(default_factory=set)
    keys: set[str] = field(default_factory=set)
    objects: set[str] = field(default_factory=set)
    buckets: set[str] = field(default_factory=set)
    actions: set[str] = field(default_factory=set)


def role_of(template: dict, namespace: str, service_account: str) -> str:
    (role,) = [
        r["Properties"]["RoleArn"]["Fn::GetAtt"][0]
        for r in template["Resources"].values()
        if r["Type"] == "AWS::EKS::PodIdentityAssociation"
        and (r["Properties"]["Namespace"], r["Properties"]["ServiceAccount"]) == (namespace, service_account)
    ]
    return role


def grants_of(template: dict, stack, role: str) -> Grants:
    resources = template["Resources"]
    assert not {"Policies", "ManagedPolicyArns"} & set(resources[role]["Properties"]), role
    grants = Grants()
    for resource in resources.values():
        if resource["Type"] != "AWS::IAM::Policy" or {"Ref": role} not in resource["Properties"]["Roles"]:
            continue
        for statement in resolved(resource["Properties"]["PolicyDocument"]["Statement"], stack):
            actions = set(statement["Action"]) if isinstance(statement["Action"], list) else {statement["Action"]}
            targets = statement["Resource"] if isinstance(statement["Resource"], list) else [statement["Resource"]]
            assert statement["Effect"] == "Allow", statement
            grants.actions.update(actions)
            if actions & SECRET_READS:
                grants.secrets.update(targets)
            if "kms:Decrypt" in actions:
                grants.keys.update(targets)
            if "s3:GetObject" in actions:
                grants.objects.update(targets)
            if "s3:ListBucket" in actions:
                grants.buckets.update(targets)
    return grants


def unmet_and_unneeded(needs: set[str], granted: set[str]) -> tuple[set[str], set[str]]:
    """(what is needed but no grant covers, what is granted but covers no need): IAM's wildcards
    (``*``, ``?``) are fnmatch's."""
    unmet = {n for n in needs if not any(fnmatchcase(n, g) for g in granted)}
    unneeded = {g for g in granted if not any(fnmatchcase(n, g) for n in needs)}
    return unmet, unneeded


# --- what each pod uses, from its spec ----------------------------------------------------------------


@dataclass
class Pod:
    name: str
    namespace: str
    spec: dict
    group: dict | None = None  # the Ray group the pod belongs to


def pods(config, objects: list[dict]) -> list[Pod]:
    """Every pod the stack's objects make run with a Pod Identity: the RayService's head and worker
    groups, the Redis cleanup Job KubeRay runs when GCS fault tolerance is on, the mirror Job."""
    (service,) = [o for o in objects if o["kind"] == "RayService"]
    namespace = service["metadata"]["namespace"]
    cluster = service["spec"]["rayClusterConfig"]
    found = [Pod("head", namespace, cluster["headGroupSpec"]["template"]["spec"], cluster["headGroupSpec"])]
    found += [Pod(g["groupName"], namespace, g["template"]["spec"], g) for g in cluster["workerGroupSpecs"]]
    if cluster.get("gcsFaultToleranceOptions") is not None:  # KubeRay's cleanup finalizer, and its Job
        found.append(
            Pod("redis-cleanup-job", namespace, redis_cleanup_pod(cluster, cluster_name=service["metadata"]["name"]))
        )
    if config.model_mirror.enabled:
        from manifests.mirror_job import manifests

        model = config.serving.model
        (job,) = [o for o in manifests(config, repo=model.hub_repo, prefix=model.model_id) if o["kind"] == "Job"]
        found.append(Pod("mirror-job", job["metadata"]["namespace"], job["spec"]["template"]["spec"]))
    return found


def secret_arn(name_or_arn: str, stack) -> str:
    if name_or_arn.startswith(("arn:", "ref:")):
        return name_or_arn
    return f"arn:aws:secretsmanager:{stack.region}:{stack.account}:secret:{name_or_arn}{SECRET_ARN_SUFFIX}"


def mounted_secrets(pod: Pod, objects: list[dict], stack) -> set[str]:
    classes = {
        o["metadata"]["name"]: [entry["objectName"] for entry in yaml.safe_load(o["spec"]["parameters"]["objects"])]
        for o in objects
        if o["kind"] == "SecretProviderClass" and o["metadata"]["namespace"] == pod.namespace
    }
    found = set()
    for volume in pod.spec.get("volumes", []):
        if volume.get("csi", {}).get("driver") == CSI_DRIVER:
            found.update(
                secret_arn(s, stack) for s in classes[volume["csi"]["volumeAttributes"]["secretProviderClass"]]
            )
    return found


def keys_of(secrets: set[str], config, facts: DeployFacts, stack) -> set[str]:
    """The customer-managed keys of those secrets, as `make deploy`'s guard found them."""
    keys = set()
    hf_token_secret = config.serving.model.hf_token_secret
    if hf_token_secret and secret_arn(hf_token_secret, stack) in secrets and facts.hf_token_kms_key_arn:
        keys.add(facts.hf_token_kms_key_arn)
    if any(secret_arn(s, stack) in secrets for s in config.ray_service.endpoint.api_key_secrets):
        keys.update(facts.api_key_kms_key_arns)
    return keys


def s3_arn(uri: str) -> str:
    return "arn:aws:s3:::" + uri.removeprefix("s3://")


def fetched_objects(pod: Pod, service: dict) -> tuple[set[str], set[str]]:
    """(the S3 objects, the buckets listed) a Ray pod reads: the Serve apps' working_dir on every Ray
    node (Serve's controller runs on the head and builds each app in a zero-CPU task there:
    ``build_serve_application``, ray/serve/_private/application_state.py); the model on the nodes
    with GPUs, where the engines run; the wheels its init containers fetch."""
    applications = yaml.safe_load(service["spec"]["serveConfigV2"])["applications"]
    objects = {s3_arn(app["runtime_env"]["working_dir"]) for app in applications}
    buckets = set()
    if ray_start_resources(pod.group)["num-gpus"]:
        for app in applications:
            source = app["args"]["model"]["source"]
            if source.startswith("s3://"):
                objects.add(s3_arn(source.rstrip("/")) + "/*")
                buckets.add(s3_arn(source.removeprefix("s3://").split("/")[0]))
    for init in pod.spec.get("initContainers", []):
        # The fetch's argv: bucket, prefix, directory, file names (manifests.ray_service._FETCH_WHEELS).
        words = shlex.split(init["command"][-1])
        for at, word in enumerate(words[:-1]):
            if word == "-c" and "boto3" in words[at + 1]:
                bucket, prefix, _, *rest = words[at + 2 :]
                names = rest[: rest.index("&&")] if "&&" in rest else rest
                objects.update(f"arn:aws:s3:::{bucket}/{prefix}/{name}" for name in names)
    return objects, buckets


# --- the checks -----------------------------------------------------------------------------------


def test_each_pods_role_reads_exactly_the_secrets_it_mounts(case):
    config, stack, template, facts = case
    objects = applied_objects(template, stack)
    problems = {}
    for pod in pods(config, objects):
        secrets = mounted_secrets(pod, objects, stack)
        grants = grants_of(template, stack, role_of(template, pod.namespace, pod.spec["serviceAccountName"]))
        for what, needs, granted in (
            ("secrets", secrets, grants.secrets),
            ("kms keys", keys_of(secrets, config, facts, stack), grants.keys),
        ):
            unmet, unneeded = unmet_and_unneeded(needs, granted)
            if unmet or unneeded:
                problems[f"{pod.name} ({pod.spec['serviceAccountName']}): {what}"] = {
                    "cannot read": sorted(unmet),
                    "may read unmounted": sorted(unneeded),
                }
    assert not problems, json.dumps(problems, indent=1)


def test_each_ray_pods_role_reads_exactly_the_s3_objects_it_fetches(case):
    config, stack, template, _ = case
    objects = applied_objects(template, stack)
    (service,) = [o for o in objects if o["kind"] == "RayService"]
    problems = {}
    for pod in pods(config, objects):
        if pod.group is None:
            continue
        needed_objects, needed_buckets = fetched_objects(pod, service)
        grants = grants_of(template, stack, role_of(template, pod.namespace, pod.spec["serviceAccountName"]))
        assert grants.actions <= READ_ACTIONS, (pod.name, grants.actions - READ_ACTIONS)
        for what, needs, granted in (
            ("s3:GetObject", needed_objects, grants.objects),
            ("s3:ListBucket", needed_buckets, grants.buckets),
        ):
            unmet, unneeded = unmet_and_unneeded(needs, granted)
            if unmet or unneeded:
                problems[f"{pod.name} ({pod.spec['serviceAccountName']}): {what}"] = {
                    "cannot read": sorted(unmet),
                    "may read unused": sorted(unneeded),
                }
    assert not problems, json.dumps(problems, indent=1)


def test_the_cases_cover_every_secret_and_s3_read(case):
    """What the two checks above compare is there: with fault tolerance on, KubeRay's cleanup Job runs
    as the head's account and mounts the store's token; the GPU workers mount a gated model's token and
    the API keys, and fetch a model in S3 (and, from the stack's mirror, the streamer's wheels)."""
    config, stack, template, _ = case
    objects = applied_objects(template, stack)
    found = {pod.name: pod for pod in pods(config, objects)}
    head = found["head"]
    if config.gcs_fault_tolerant:
        cleanup = found["redis-cleanup-job"]
        assert cleanup.spec["serviceAccountName"] == head.spec["serviceAccountName"]
        (store_token,) = mounted_secrets(cleanup, objects, stack)
        assert store_token.startswith("ref:") and mounted_secrets(head, objects, stack) == {store_token}
    (service,) = [o for o in objects if o["kind"] == "RayService"]
    wheels = streamer_wheels_location(config)
    workers = [pod for pod in found.values() if pod.group is not None and pod is not head]
    assert workers
    for worker in workers:
        expected = {secret_arn(s, stack) for s in config.ray_service.endpoint.api_key_secrets}
        if config.ray_service.endpoint.api_key_secrets and config.ray_service.endpoint.cache_isolation == "per_key":
            # The stack's own cache-salt secret, as its provider class names it.
            (salt,) = [
                yaml.safe_load(o["spec"]["parameters"]["objects"])[0]["objectName"]
                for o in objects
                if o["kind"] == "SecretProviderClass" and o["metadata"]["name"] == api_keys.SALT_PROVIDER_CLASS
            ]
            expected.add(secret_arn(salt, stack))
        if config.serving.model.hf_token_secret:
            expected.add(secret_arn(config.serving.model.hf_token_secret, stack))
        assert mounted_secrets(worker, objects, stack) == expected
        fetched, listed = fetched_objects(worker, service)
        assert bool(listed) == config.serving.model.is_s3
        if wheels:
            assert any(o.startswith(s3_arn("/".join(wheels)) + "/") for o in fetched), fetched
