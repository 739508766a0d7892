"""A stack an earlier release deployed, deployed again with today's code: `make deploy` reads what the
deployed template says (each principal's entry, how the cluster was created, the groups' sizes) and
the upgrade replaces nothing; without those facts it would replace the cluster and roll back."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.conftest import ROOT
from tests.preview.catalog import ADMIN_A, ADMIN_B
from tests.preview.conftest import dev, edited

# Seconds per test (the upgrade runs the CDK CLI's diff):
# make test-unit leaves this file to make test-consumers and make test.
pytestmark = pytest.mark.consumer

DEPLOYED = ROOT / "tests" / "fixtures" / "deployed" / "pd-dev-two-admins-2b5a230.template.json"


def two_admins() -> dict:
    def admins(data: dict) -> None:
        data["cluster"]["admin_principals"] = [ADMIN_A, ADMIN_B]

    return edited(dev(), admins)


@pytest.fixture(scope="module")
def deployed() -> dict:
    return json.loads(DEPLOYED.read_text())


def upgrade(variant, name: str, old: dict, facts):
    from cli.preview import preview

    stack, _, outdir = variant(name, two_admins(), facts)
    diff, summary = preview(stack.config, assembly=Path(outdir), old=old, source="the deployed stack")
    return summary.changes, summary, diff


def test_the_upgrade_keeps_the_cluster_the_entries_and_the_sizes(variant, deployed):
    from cli.deploy import facts_from_deployed
    from tests.preview.conftest import deployed_facts

    facts = facts_from_deployed(deployed_facts(two_admins()), deployed)
    assert facts.cluster_has_bootstrap_admin
    assert facts.access_entry_ids == {ADMIN_A: "EksClusterAdmin06BF8452E", ADMIN_B: "EksClusterAdmin1E23D5C9A"}
    changes, summary, diff = upgrade(variant, "two-admins-upgrade", deployed, facts)
    assert not summary.needs_confirmation, summary.stateful
    touched = {c.type for c in changes}
    assert "AWS::EKS::Cluster" not in touched and "AWS::EKS::AccessEntry" not in touched, diff
    assert not [c for c in changes if c.replaced or c.may_be_replaced], diff
    # The creator's entry stays (create-only), and the preview says how to remove it.
    (creator,) = [w for w in summary.warnings if "CloudFormation's execution role" in w]
    assert "aws eks delete-access-entry --cluster-name pd-dev --region us-east-2" in creator
    assert "cdk-hnb659fds-cfn-exec-role-000000000000-us-east-2" in creator
    stopped = [line for line in summary.nodes if "the template stops setting DesiredSize" in line]
    assert len(stopped) == 3, summary.nodes


def test_without_the_deployed_facts_the_cluster_would_be_replaced_and_the_entries_moved(variant, deployed):
    """What the facts prevent, found by the preview: the CLI's diff shows the AccessConfig change as
    an update, CloudFormation's specification (the CLI's own copy) says it replaces the cluster."""
    changes, summary, _ = upgrade(variant, "two-admins", deployed, None)
    (cluster,) = [c for c in changes if c.type == "AWS::EKS::Cluster"]
    assert cluster.replaced and "AccessConfig.BootstrapClusterCreatorAdminPermissions" in cluster.impact
    assert any(line.startswith("REPLACED: AWS::EKS::Cluster") for line in summary.stateful), summary.stateful
    # The cluster is named: CloudFormation cannot replace it, so no ALLOW_REPLACEMENT lets the deploy run.
    from preview.classes import ChangeClass

    (refused,) = summary.refused
    assert refused.startswith("AWS::EKS::Cluster EksClusterB2BDED5B would be replaced") and "pd-dev" in refused
    assert summary.change_class is ChangeClass.REFUSED
    moved = [w for w in summary.warnings if "moves from" in w]
    assert len(moved) == 2, summary.warnings
