"""Two deploys in a row, offline: a config before and after an edit, both synthesized, and the CDK
CLI's own diff of one against the other, read by the preview."""

from __future__ import annotations

import copy
import json
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml

from tests.conftest import CONFIG_DIR


def dev() -> dict:
    return yaml.safe_load((CONFIG_DIR / "dev.yaml").read_text())


def edited(data: dict, edit) -> dict:
    data = copy.deepcopy(data)
    edit(data)
    return data


@dataclass
class Rehearsal:
    before_config: object
    after_config: object
    before: dict
    after: dict
    diff: str
    changes: list
    preview: object

    def changed(self, kind: str) -> list:
        return [c for c in self.changes if c.type == kind]


def deployed_facts(data: dict):
    """The deploy facts of a stack already deployed from ``data``: each node group exists, at the size
    the config started it with (no autoscaling since)."""
    from config.loader import parse_config
    from config.schema import DeployFacts

    config = parse_config(data, source="rehearsal")
    groups = config.cluster.gpu_node_groups
    sizes = {"system": config.cluster.system_node_group.desired_size}
    sizes.update({phase: getattr(groups, phase).desired_size for phase in ("prefill", "decode")})
    return DeployFacts.model_validate({"node_group_sizes": sizes})


@pytest.fixture(scope="session")
def rehearse(variant):
    """Two deploys in a row, as `make deploy` makes them. ``before`` (a named variant; data None: the
    shipped dev config) is synthesized as the stack stands after its deploy, its node groups existing;
    ``after`` with the facts the guard would read from that stack (the node groups' sizes), and once
    more when the diff replaces a node group. Returns the preview of ``after`` over ``before``, as
    `make preview TEMPLATE=` prints it."""
    from cli.deploy import facts_from_deployed, facts_with_replacements
    from cli.preview import preview

    def build(name: str, data: dict, facts):
        stack, _, outdir = variant(name, data, facts)
        return stack.config, Path(outdir)

    def template(config, folder: Path) -> dict:
        return json.loads((folder / f"{config.stack_name}.template.json").read_text())

    def run(before: tuple[str, dict | None], after: tuple[str, dict | None] | tuple[object, Path]) -> Rehearsal:
        before_name, before_data = before[0], before[1] if before[1] is not None else dev()
        before_config, before_dir = build(f"{before_name}-deployed", before_data, deployed_facts(before_data))
        old = template(before_config, before_dir)
        facts = facts_from_deployed(deployed_facts(before_data), old)
        if isinstance(after[1], Path):
            after_config, after_dir = after
        else:
            after_config, after_dir = build(f"{after[0]}-redeploy", after[1], facts)
        diff, summary = preview(after_config, assembly=after_dir, old=old, source="the template before the edit")
        again = facts_with_replacements(facts, template(after_config, after_dir), summary.changes)
        if again is not None and not isinstance(after[1], Path):
            after_config, after_dir = build(f"{after[0]}-redeploy-replacing", after[1], again)
            diff, summary = preview(after_config, assembly=after_dir, old=old, source="the template before the edit")
        new = template(after_config, after_dir)
        return Rehearsal(before_config, after_config, old, new, diff, summary.changes, summary)

    return run


# The minor after the newest config/versions.py pins, for the rehearsals: its kubectl layer is the real
# package (requirements-dev.txt); its Cluster Autoscaler tag is this test's until the release exists.
NEXT_MINOR = "1.37"
NEXT_MINOR_AUTOSCALER_TAG = "v1.37.0"
# A real release (https://github.com/awslabs/amazon-eks-ami/releases/tag/v20261119); the add-on builds are
# this table's own, as no published one could be read for 1.37.
NEXT_MINOR_AMI_RELEASE = "1.37.1-20261119"
NEXT_MINOR_ADDONS = {"kube-proxy": "v1.37.0-eksbuild.1", "coredns": "v1.14.3-eksbuild.3"}


@contextmanager
def next_kubernetes_minor():
    """config/versions.py's tables with the next minor in them, for as long as the block runs."""
    from config import versions

    minor = int(NEXT_MINOR.split(".")[1])
    release = versions.KubernetesRelease(
        version=NEXT_MINOR,
        layer_module=f"aws_cdk.lambda_layer_kubectl_v{minor}",
        layer_class=f"KubectlV{minor}Layer",
        layer_package=f"aws-cdk.lambda-layer-kubectl-v{minor}",
        end_of_extended_support=None,
    )
    with pytest.MonkeyPatch.context() as patch:
        patch.setitem(versions.KUBERNETES_RELEASES, NEXT_MINOR, release)
        patch.setitem(versions.CLUSTER_AUTOSCALER_RELEASES, NEXT_MINOR, NEXT_MINOR_AUTOSCALER_TAG)
        patch.setitem(
            versions.NODE_AMI_RELEASES,
            NEXT_MINOR,
            versions.ReleasePin(
                NEXT_MINOR_AMI_RELEASE, "https://github.com/awslabs/amazon-eks-ami/releases/tag/v20261119"
            ),
        )
        patch.setitem(
            versions.EKS_ADDON_RELEASES,
            NEXT_MINOR,
            {
                name: versions.ReleasePin(version, "tests/preview/conftest.py")
                for name, version in NEXT_MINOR_ADDONS.items()
            },
        )
        yield
