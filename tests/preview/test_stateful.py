"""What holds state, derived: every resource of the shipped stacks whose type CloudFormation's resource
specification marks stateful (the CDK CLI's copy) is loud when it goes, and what the serving cluster
still uses says how to remove it in two deploys. The GCS store's replica and failover change one at a
time, as ElastiCache accepts them.

In process (no CDK CLI): the old template is a shipped stack as synthesized, the new one the same
stack with a resource gone or the store's shape changed; the changes are the resources one has and
the other lacks, as the CLI's diff lists them.
"""

from __future__ import annotations

import copy
import itertools

import pytest

from cdk_constructs.gcs_store import replication_step
from cli.preview import NEEDS_CONFIRMATION, REFUSED, print_summary
from config.schema import DeployedGcsStore
from preview.cdk_diff import ResourceChange
from preview.serving import IN_USE, REPLICATION_GROUP, summarize, used_by_serving
from preview.spec import stateful_types


def removed(old: dict, new: dict) -> list[ResourceChange]:
    """The CLI's diff lines for the resources ``new`` no longer has."""
    return [
        ResourceChange(op="-", type=resource["Type"], path="", logical_id=logical_id, impact="destroy")
        for logical_id, resource in old["Resources"].items()
        if logical_id not in new["Resources"]
    ]


def without(template: dict, *logical_ids: str) -> dict:
    new = copy.deepcopy(template)
    for logical_id in logical_ids:
        del new["Resources"][logical_id]
    return new


def with_store(template: dict, nodes: int, failover: bool) -> dict:
    new = copy.deepcopy(template)
    for resource in new["Resources"].values():
        if resource["Type"] == REPLICATION_GROUP:
            resource["Properties"].update(
                NumCacheClusters=nodes, AutomaticFailoverEnabled=failover, MultiAZEnabled=failover
            )
    return new


@pytest.fixture(scope="module")
def prod(synthesized):
    config, _, template, _, _ = synthesized("prod")
    return config, template.to_json()


@pytest.mark.parametrize("env", ["dev", "prod"])
def test_every_resource_of_a_stateful_type_is_loud_when_removed(synthesized, env):
    config, _, template, _, _ = synthesized(env)
    old = template.to_json()
    stateful = {
        logical_id
        for logical_id, resource in old["Resources"].items()
        if resource["Type"] in stateful_types() and resource.get("DeletionPolicy", "Delete") != "Retain"
    }
    assert stateful, "the specification marks nothing of the stack stateful"
    for logical_id in sorted(stateful):
        new = without(old, logical_id)
        summary = summarize(old, new, removed(old, new), config=config)
        assert summary.needs_confirmation, f"{old['Resources'][logical_id]['Type']} {logical_id} goes silently"
        (line,) = [line for line in summary.stateful if logical_id in line]
        assert line.startswith(f"REMOVED: {old['Resources'][logical_id]['Type']} {logical_id}")


def test_the_store_and_its_token_are_what_the_serving_cluster_uses(prod):
    """Derived from the template: the RayService names the store's endpoint, and the SecretProviderClass
    its head mounts names the token's secret."""
    _, old = prod
    used = used_by_serving(old)
    types = {old["Resources"][logical_id]["Type"] for logical_id in used if logical_id in old["Resources"]}
    assert {REPLICATION_GROUP, "AWS::SecretsManager::Secret"} <= types


def test_removing_the_store_the_cluster_serves_from_is_refused_and_says_how_in_two_deploys(prod, capsys):
    config, old = prod
    store = [k for k, r in old["Resources"].items() if r["Type"].startswith("AWS::ElastiCache::")]
    secret = [
        k
        for k, r in old["Resources"].items()
        if r["Type"] == "AWS::SecretsManager::Secret" and "GCS store" in r["Properties"]["Description"]
    ]
    new = without(old, *store, *secret)
    summary = summarize(old, new, removed(old, new), config=config)
    for logical_id in (*[k for k in store if old["Resources"][k]["Type"] == REPLICATION_GROUP], *secret):
        (line,) = [line for line in summary.stateful if logical_id in line]
        assert line.startswith("REMOVED: ") and line.endswith(IN_USE)
    assert print_summary(config, "", summary, summary_only=True, allow=False) == NEEDS_CONFIRMATION
    assert "ALLOW_REPLACEMENT=1" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("before", "after"),
    [((1, False), (2, True)), ((2, True), (1, False)), ((2, True), (1, True))],
    ids=["second-zone-on", "second-zone-off", "replica-removed-under-failover"],
)
def test_a_replica_and_failover_in_one_update_are_refused_with_the_step_between(prod, before, after, capsys):
    config, template = prod
    old, new = with_store(template, *before), with_store(template, *after)
    summary = summarize(old, new, [], config=config)
    (line,) = summary.two_deploys
    assert line.startswith(f"GCS store: NumCacheClusters {before[0]} -> {after[0]}")
    assert "deploy first with NumCacheClusters 2, failover off" in line
    assert print_summary(config, "", summary, summary_only=True, allow=True) == REFUSED
    assert "\n" not in capsys.readouterr().err.strip()


def test_each_step_towards_the_store_s_shape_is_one_elasticache_accepts_and_two_reach_it():
    """Every deployed shape (a single node, two without failover, two with it) and both targets: each
    step neither turns failover on without a replica already there nor drops the last replica while
    failover is on, and the target is reached within two deploys."""
    shapes = [(1, False), (2, False), (2, True)]
    for (nodes, failover), multi_az in itertools.product(shapes, (False, True)):
        shape, deploys = (nodes, failover), 0
        target = (2, True) if multi_az else (1, False)
        while shape != target:
            deployed = DeployedGcsStore(node_type="cache.t4g.small", nodes=shape[0], failover=shape[1], in_use=True)
            step = replication_step(multi_az=multi_az, deployed=deployed)
            assert not (step[1] and not shape[1] and shape[0] < 2), f"{shape} -> {step}: failover before a replica"
            assert not (shape[1] and step[0] < 2), f"{shape} -> {step}: last replica removed under failover"
            shape, deploys = step, deploys + 1
            assert deploys <= 2, f"{(nodes, failover)} does not reach {target} in two deploys"


def test_uninstalling_the_csi_driver_the_serving_pods_mount_through_is_refused(synthesized, variant, capsys):
    """The API keys removed from dev (no other secret to mount): the CSI driver's charts would go while
    the serving workers' key volumes are mounted through them. Without the deployed facts (a bare
    `cdk synth`), the preview refuses it and says how in two deploys."""
    from config.schema import DeployFacts
    from tests.cdk_constructs.test_api_keys import CUSTOMER_KEY, keyed_data

    _, keyed, _ = variant("api-keys", keyed_data(), DeployFacts(api_key_kms_key_arns=[CUSTOMER_KEY]))
    config, _, plain, _, _ = synthesized("dev")
    old, new = keyed.to_json(), plain.to_json()
    summary = summarize(old, new, removed(old, new), config=config)
    charts = [line for line in summary.stateful if "chart" in line]
    assert len(charts) == 2, summary.stateful
    for line in charts:
        assert "the serving RayCluster's pods mount secrets through it" in line
        assert "in two deploys: `make deploy` keeps it while the deployed RayService mounts through it" in line
    assert print_summary(config, "", summary, summary_only=True, allow=False) == NEEDS_CONFIRMATION
    capsys.readouterr()
