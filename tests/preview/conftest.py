"""Two deploys in a row, offline: a config before and after an edit, both synthesized, and the CDK
CLI's own diff of one against the other, read by the preview."""

from __future__ import annotations

import copy
import json
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


@pytest.fixture(scope="session")
def rehearse(synthesized, variant):
    """Synthesizes ``before`` and ``after`` (named variants; "dev" is the shipped config) and previews
    the deploy of ``after`` over ``before``, as `make preview TEMPLATE=` does."""
    from cli.preview import preview
    from preview import cdk_diff

    def build(name: str, data: dict | None):
        if data is None:
            config, stack, _, _, outdir = synthesized(name)
            return config, Path(outdir)
        stack, _, outdir = variant(name, data)
        return stack.config, Path(outdir)

    def run(before: tuple[str, dict | None], after: tuple[str, dict | None] | tuple[object, Path]) -> Rehearsal:
        before_config, before_dir = build(*before)
        after_config, after_dir = after if isinstance(after[1], Path) else build(*after)
        old = json.loads((before_dir / f"{before_config.stack_name}.template.json").read_text())
        new = json.loads((after_dir / f"{after_config.stack_name}.template.json").read_text())
        diff, summary = preview(after_config, assembly=after_dir, old=old, source="the template before the edit")
        return Rehearsal(before_config, after_config, old, new, diff, cdk_diff.parse(diff), summary)

    return run
