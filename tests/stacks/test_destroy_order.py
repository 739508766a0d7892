"""`make destroy` cannot hang on a finalizer: every finalizer's owner, and what it needs to act, is
deleted after each resource whose deletion waits on that finalizer (manifests/finalizers.py).

CloudFormation deletes a resource only after every resource that depends on it (DependsOn, Ref,
Fn::GetAtt) is gone. So "A is deleted strictly before B" is "B is among A's transitive dependencies".
The carriers of a finalizer are the resource that applies the object (or the object it is made from)
and the resource that applies its Namespace; the needs are read from the same templates: the owner's
chart, the node groups its pod may run on, the cluster add-ons a pod needs, and, for each pod the
owner starts, its nodes, service account and credentials, CSI volumes and their charts, the Secrets
its env reads and every stack resource its spec refers to (the store).
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from dataclasses import dataclass

import pytest

from manifests.finalizers import (
    CSI_DRIVER_CHARTS,
    FINALIZERS,
    POD_IDENTITY_AGENT_ADDON,
    POD_NETWORK_ADDONS,
    SECRETS_STORE_PROVIDER_CHARTS,
    Finalizer,
    chart_pod,
)
from tests.conftest import CONFIG_DIR, SHIPPED_ENVIRONMENTS, with_changes

KUBECTL_RESOURCE = "Custom::AWSCDK-EKS-KubernetesResource"
HELM_CHART = "Custom::AWSCDK-EKS-HelmChart"
REFERENCE = re.compile(r"@@([^@]*)@@")
IRSA_ROLE_ANNOTATION = "eks.amazonaws.com/role-arn"
CFN_TAINT_EFFECTS = {"NO_SCHEDULE": "NoSchedule", "NO_EXECUTE": "NoExecute", "PREFER_NO_SCHEDULE": "PreferNoSchedule"}


def _references(value) -> set[str]:
    """The logical ids a template value refers to (Ref, Fn::GetAtt, Fn::Sub's ${Id}), pseudo parameters left out."""
    found: set[str] = set()
    if isinstance(value, dict):
        for key, inner in value.items():
            if key == "Ref" and isinstance(inner, str):
                found.add(inner)
            elif key == "Fn::GetAtt":
                found.add(inner[0] if isinstance(inner, list) else inner.split(".")[0])
            elif key == "Fn::Sub":
                text = inner[0] if isinstance(inner, list) else inner
                found |= {m.split(".")[0] for m in re.findall(r"\$\{([^}!]+)\}", text)}
                if isinstance(inner, list):
                    found |= _references(inner[1])
            else:
                found |= _references(inner)
    elif isinstance(value, list):
        for inner in value:
            found |= _references(inner)
    return {ref for ref in found if not ref.startswith("AWS::")}


def _text(value) -> str:
    """A string-valued template expression as text, each reference in it as @@logical ids@@."""
    if isinstance(value, str):
        return value
    if isinstance(value, dict) and "Fn::Join" in value:
        separator, parts = value["Fn::Join"]
        return separator.join(_text(part) for part in parts)
    return "@@" + ",".join(sorted(_references(value))) + "@@"


def _referred(text: str) -> set[str]:
    return {ref for match in REFERENCE.findall(text) for ref in match.split(",") if ref}


class Template:
    """One synthesized template: its dependency graph and the Kubernetes objects its resources apply."""

    def __init__(self, template: dict):
        self.resources: dict[str, dict] = template["Resources"]
        self.edges = {
            logical_id: {*resource.get("DependsOn", []), *_references(resource.get("Properties", {}))}
            & set(self.resources)
            for logical_id, resource in self.resources.items()
        }
        self._closures: dict[str, set[str]] = {}
        # logical id -> the objects it applies (kubectl resources), references as @@ids@@
        self.objects = {
            logical_id: json.loads(_text(resource["Properties"]["Manifest"]))
            for logical_id, resource in self.resources.items()
            if resource["Type"] == KUBECTL_RESOURCE
        }

    def deleted_after(self, logical_id: str) -> set[str]:
        """Every resource CloudFormation deletes only once ``logical_id`` is gone."""
        if logical_id not in self._closures:
            seen: set[str] = set()
            stack = [logical_id]
            while stack:
                for dependency in self.edges[stack.pop()] - seen:
                    seen.add(dependency)
                    stack.append(dependency)
            self._closures[logical_id] = seen
        return self._closures[logical_id]

    def of_type(self, type_: str) -> dict[str, dict]:
        return {k: r for k, r in self.resources.items() if r["Type"] == type_}

    def applying(self, kind: str, namespace: str | None = None, name: str | None = None) -> Iterator[tuple[str, dict]]:
        for logical_id, objects in self.objects.items():
            for obj in objects:
                metadata = obj.get("metadata", {})
                if obj.get("kind") != kind:
                    continue
                if namespace is not None and metadata.get("namespace") != namespace:
                    continue
                if name is not None and metadata.get("name") != name:
                    continue
                yield logical_id, obj

    def charts(self, chart: str) -> dict[str, dict]:
        return {k: r for k, r in self.of_type(HELM_CHART).items() if r["Properties"]["Chart"] == chart}

    def addons(self, *names: str) -> set[str]:
        return {k for k, r in self.of_type("AWS::EKS::Addon").items() if r["Properties"]["AddonName"] in names}


@dataclass(frozen=True)
class Need:
    logical_id: str
    why: str
    namespace: str | None = None  # the namespace of the object it applies, for a kubectl resource


def _tolerated(taint: dict, tolerations: list[dict]) -> bool:
    effect = CFN_TAINT_EFFECTS.get(taint.get("Effect", ""), taint.get("Effect"))
    for toleration in tolerations:
        key_matches = (
            toleration.get("key") in (None, taint["Key"])
            if toleration.get("operator") == "Exists"
            else (toleration.get("key") == taint["Key"] and toleration.get("value") == taint.get("Value"))
        )
        if key_matches and toleration.get("effect") in (None, effect):
            return True
    return False


def _node_groups_for(template: Template, pod: dict) -> set[str]:
    selector = pod.get("nodeSelector") or {}
    tolerations = pod.get("tolerations") or []
    return {
        k
        for k, group in template.of_type("AWS::EKS::Nodegroup").items()
        if selector.items() <= (group["Properties"].get("Labels") or {}).items()
        and all(_tolerated(t, tolerations) for t in group["Properties"].get("Taints") or [])
    }


def _role_and_policies(template: Template, role_refs: set[str]) -> set[str]:
    roles = {r for r in role_refs if template.resources[r]["Type"] == "AWS::IAM::Role"}
    policies = {
        k
        for k, policy in template.of_type("AWS::IAM::Policy").items()
        if roles & _references(policy["Properties"].get("Roles", []))
    }
    return roles | policies


def _pod_needs(template: Template, pod: dict, namespace: str, whose: str) -> list[Need]:
    """What ``pod`` (a pod spec, in ``namespace``) needs from the stack to start and do its work."""
    needs: list[Need] = []
    groups = _node_groups_for(template, pod)
    assert groups, f"{whose}: no node group matches its nodeSelector and tolerates its taints"
    needs += [Need(g, f"a node for {whose}") for g in groups]
    needs += [Need(a, f"pod networking for {whose}") for a in template.addons(*POD_NETWORK_ADDONS)]

    account = pod.get("serviceAccountName", "default")
    for logical_id, obj in template.applying("ServiceAccount", namespace, account):
        needs.append(Need(logical_id, f"the service account of {whose}", namespace))
        role_refs = _referred(json.dumps(obj.get("metadata", {}).get("annotations", {}).get(IRSA_ROLE_ANNOTATION, "")))
        needs += [Need(r, f"the IAM role of {whose}") for r in _role_and_policies(template, role_refs)]
    for logical_id, association in template.of_type("AWS::EKS::PodIdentityAssociation").items():
        properties = association["Properties"]
        if (properties["Namespace"], properties["ServiceAccount"]) == (namespace, account):
            needs.append(Need(logical_id, f"the Pod Identity association of {whose}"))
            roles = _role_and_policies(template, _references(properties["RoleArn"]))
            needs += [Need(r, f"the IAM role of {whose}") for r in roles]
            needs += [Need(a, f"Pod Identity for {whose}") for a in template.addons(POD_IDENTITY_AGENT_ADDON)]

    synced_secrets: set[str] = set()
    for volume in pod.get("volumes") or []:
        csi = volume.get("csi")
        if not csi:
            continue
        needs += [Need(c, f"the CSI driver of {whose}") for c in template.charts(CSI_DRIVER_CHARTS[csi["driver"]])]
        provider_class = csi.get("volumeAttributes", {}).get("secretProviderClass")
        classes = list(template.applying("SecretProviderClass", namespace, provider_class))
        assert classes, f"{whose}: its volume {volume['name']} names {provider_class}, which the stack does not apply"
        for logical_id, spc in classes:
            needs.append(Need(logical_id, f"the SecretProviderClass {provider_class} of {whose}", namespace))
            needs += [Need(r, f"what {provider_class} reads") for r in _referred(json.dumps(spc))]
            provider_chart = SECRETS_STORE_PROVIDER_CHARTS[spc["spec"]["provider"]]
            needs += [Need(c, f"the Secrets Store provider of {whose}") for c in template.charts(provider_chart)]
            synced_secrets |= {s["secretName"] for s in spc["spec"].get("secretObjects") or []}
    for container in pod.get("containers") or []:
        for env in container.get("env") or []:
            secret = (env.get("valueFrom") or {}).get("secretKeyRef", {}).get("name")
            if secret and secret not in synced_secrets:
                applied = [k for k, _ in template.applying("Secret", namespace, secret)]
                assert applied, f"{whose}: env {env['name']} reads Secret {secret}, which nothing in the stack makes"
                needs += [Need(k, f"the Secret {secret} of {whose}", namespace) for k in applied]
    needs += [Need(r, f"what {whose} connects to") for r in _referred(json.dumps(pod))]
    return needs


def _owner_needs(template: Template, finalizer: Finalizer, applied: dict) -> list[Need]:
    owner = finalizer.owner
    if owner.chart is None:
        return [Need(k, owner.name) for k in template.of_type("AWS::EKS::Cluster")]
    charts = template.charts(owner.chart)
    assert charts, f"{finalizer.name}: the stack applies a {finalizer.applied_as} but installs no {owner.chart}"
    needs = [Need(k, f"{owner.name}'s chart") for k in charts]
    for chart in charts.values():
        values = json.loads(_text(chart["Properties"].get("Values", "{}")))
        needs += _pod_needs(template, chart_pod(values), chart["Properties"]["Namespace"], f"{owner.name}'s pod")
    namespace = applied.get("metadata", {}).get("namespace", "default")
    for pod in finalizer.acts_through(applied):
        needs += _pod_needs(template, pod, namespace, f"the pod {owner.name} starts to take {finalizer.name} off")
    return needs


def _carriers(template: Template, logical_id: str, applied: dict) -> dict[str, str | None]:
    """The resources whose deletion waits on a finalizer of ``applied``: the resource that applies it and
    the one that applies its Namespace (carrier -> the namespace it deletes, or None)."""
    carriers: dict[str, str | None] = {logical_id: None}
    namespace = applied.get("metadata", {}).get("namespace")
    if applied.get("kind") == "Namespace":
        carriers[logical_id] = applied["metadata"]["name"]
    elif namespace:
        carriers |= {k: namespace for k, _ in template.applying("Namespace", name=namespace)}
    return carriers


def destroy_order_violations(template_json: dict) -> tuple[set[str], list[str]]:
    """(the finalizers the stack's objects get, every need deleted with or before one of its carriers)."""
    template = Template(template_json)
    present: set[str] = set()
    violations: list[str] = []
    for finalizer in FINALIZERS:
        for logical_id, applied in template.applying(finalizer.applied_as):
            if not finalizer.put_when(applied):
                continue
            present.add(finalizer.name)
            needs = _owner_needs(template, finalizer, applied)
            for carrier, deletes_namespace in _carriers(template, logical_id, applied).items():
                after = template.deleted_after(carrier)
                for need in needs:
                    if need.namespace is not None and need.namespace == deletes_namespace:
                        continue  # the Namespace deletes it itself, and nothing new starts in it
                    if need.logical_id not in after:
                        violations.append(
                            f"{finalizer.name} on the {finalizer.carried_by} of {logical_id}: {carrier} is not "
                            f"deleted before {need.logical_id} ({need.why})"
                        )
    violations += admin_access_violations(template)
    return present, sorted(set(violations))


CLUSTER_ADMIN_POLICY = "AmazonEKSClusterAdminPolicy"


def admin_access_violations(template: Template) -> list[str]:
    """The people's cluster-admin access entries are deleted after every Kubernetes object the stack
    applies: a destroy that stalls on a finalizer leaves them kubectl to lift it with (prod creates its
    cluster without the creator's admin, so these entries are the only way in)."""
    admins = [
        logical_id
        for logical_id, entry in template.of_type("AWS::EKS::AccessEntry").items()
        if CLUSTER_ADMIN_POLICY in json.dumps(entry["Properties"].get("AccessPolicies", []))
    ]
    objects = [*template.of_type(KUBECTL_RESOURCE), *template.of_type(HELM_CHART)]
    return [
        f"the admin access entry {entry} is deleted before {obj} (a stuck delete would lock the admins out)"
        for obj in objects
        for entry in admins
        if entry not in template.deleted_after(obj)
    ]


def _yaml(env: str) -> dict:
    import yaml

    return yaml.safe_load((CONFIG_DIR / f"{env}.yaml").read_text())


def _every_stateful_toggle_on_prod() -> dict:
    """prod (GCS fault tolerance on) with an internal NLB, API keys and a gated model's token."""
    from tests.cdk_constructs.test_api_keys import SECRETS
    from tests.cdk_constructs.test_hf_token import GATED_MODEL, SECRET

    prod = _yaml("prod")
    return with_changes(
        prod,
        {
            "ray_service.endpoint": {
                "internal_nlb": True,
                "allowed_cidrs": [prod["network"]["vpc_cidr"]],
                # The pods read the keys in the stack's region.
                "api_key_secrets": [s.replace("us-east-2", prod["aws"]["region"]) for s in SECRETS],
            },
            "serving.model": {**GATED_MODEL, "hf_token_secret": SECRET},
        },
    )


def _variant_cases() -> dict:
    """name -> (config data, deploy facts): the variants other tests synthesize too (same names, same
    data, so the session synthesizes each once), and prod with every stateful toggle on."""
    from config.schema import DeployFacts
    from tests.cdk_constructs.test_api_keys import CUSTOMER_KEY, keyed_data
    from tests.cdk_constructs.test_gcs_store import dev_ft_data
    from tests.cdk_constructs.test_hf_token import gated_data
    from tests.stacks.test_template_policies import _variants

    policy_variants = _variants()
    return {
        "gcs-ft-dev": (dev_ft_data(), None),
        "internal-nlb": (policy_variants["internal-nlb"], None),
        "gated": (gated_data(), None),
        "api-keys": (keyed_data(), DeployFacts(api_key_kms_key_arns=[CUSTOMER_KEY])),
        "mirror-prod": (policy_variants["mirror-prod"], None),
        "prod-every-stateful-toggle": (_every_stateful_toggle_on_prod(), None),
    }


CASES = [*SHIPPED_ENVIRONMENTS, *_variant_cases()]


@pytest.mark.parametrize("case", CASES)
def test_every_finalizer_owner_and_its_needs_outlive_the_carriers(synthesized, variant, case):
    if case in SHIPPED_ENVIRONMENTS:
        config, _, template, _, _ = synthesized(case)
    else:
        data, facts = _variant_cases()[case]
        stack, template, _ = variant(case, data, facts)
        config = stack.config
    present, violations = destroy_order_violations(template.to_json())
    assert violations == [], "\n".join(violations)
    # The table's conditions saw the objects the config asks for (nothing passes for want of a carrier).
    assert ("ray.io/gcs-ft-redis-cleanup-finalizer" in present) == config.gcs_fault_tolerant
    assert ("service.k8s.aws/resources" in present) == config.ray_service.endpoint.internal_nlb
    assert {"ray.io/rayservice-finalizer", "kubernetes"} <= present


def test_the_redis_cleanup_job_needs_the_store_its_token_and_the_system_nodes(synthesized):
    """prod's cleanup Job, as KubeRay builds it from the head: the needs the check above derives for it
    include the store, the token's SecretProviderClass and its secret, and the system nodes."""
    _, _, template, _, _ = synthesized("prod")
    parsed = Template(template.to_json())
    ((logical_id, ray_service),) = parsed.applying("RayService")
    (gcs,) = [f for f in FINALIZERS if f.name == "ray.io/gcs-ft-redis-cleanup-finalizer"]
    (job,) = gcs.acts_through(ray_service)
    needs = {n.logical_id for n in _pod_needs(parsed, job, ray_service["metadata"]["namespace"], "the Job")}
    types = {parsed.resources[n]["Type"] for n in needs}
    assert {"AWS::ElastiCache::ReplicationGroup", "AWS::SecretsManager::Secret", "AWS::EKS::Nodegroup"} <= types
    assert {"AWS::EKS::PodIdentityAssociation", "AWS::IAM::Role", HELM_CHART} <= types
    (spc,) = [k for k, _ in parsed.applying("SecretProviderClass") if k in needs]
    assert spc in parsed.deleted_after(logical_id)
    assert {parsed.resources[g]["Properties"]["Labels"]["role"] for g in _node_groups_for(parsed, job)} == {"system"}
