"""The day-two rehearsal derived from the schema: every edit of every field, on dev and on prod.

``derived_edits`` makes the edits from the config schema's types (a field added tomorrow is edited
without anyone listing it). Each valid edit is synthesized in process as `make deploy` would after
the base was deployed, compared with the base's template by CloudFormation's resource schemas
(``consumers.template_changes``), and read by the preview, which puts it in one class. The CDK CLI's
own diff stays the authority: one representative of each class is run through it and must agree.
An edit the schema refuses must say so in one line that names the field.

The whole rehearsal takes about as long as its synths: about 460 edits of dev and prod, in process,
3 to 3.5 minutes on 2 cores, plus one CDK CLI diff per class. It runs in the consumer tier (make
test-consumers, make test).
"""

from __future__ import annotations

import json
import shutil
import tempfile
from collections import Counter, defaultdict
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml

from tests.conftest import CONFIG_DIR
from tests.preview.derived_edits import Edit, apply, edits_of, leaf_fields

pytestmark = pytest.mark.consumer

BASES = ("dev", "prod")


@dataclass
class Outcome:
    env: str
    edit: Edit
    change_class: object  # preview.classes.ChangeClass
    refusal: str = ""  # the config's one-line refusal, for an edit the schema refuses
    crashed: str = ""  # a synth that failed on a config the schema accepted
    summary: object = None  # the preview
    new: dict | None = None
    assembly: Path | None = None
    config: object = None  # config.schema.AppConfig of the edited environment


def _base(env: str) -> dict:
    return yaml.safe_load((CONFIG_DIR / f"{env}.yaml").read_text())


@pytest.fixture(scope="module")
def rehearsed(variant):
    """Every generated edit of dev and prod, rehearsed: env -> [Outcome]."""
    from cli.deploy import facts_from_deployed, facts_with_replacements
    from cli.preview import PreviewRefused, check_same_environment
    from config.loader import ConfigError, parse_config
    from consumers.template_changes import changes
    from preview.classes import ChangeClass
    from preview.serving import summarize
    from tests.conftest import synth_variant
    from tests.preview.conftest import deployed_facts, next_kubernetes_minor

    work = Path(tempfile.mkdtemp(prefix="derived-rehearsal-"))
    results: dict[str, list[Outcome]] = {}
    # The next Kubernetes minor is an edit like any other: its tables, test-only where no release exists yet.
    with next_kubernetes_minor():
        for env in BASES:
            data = _base(env)
            stack, _, outdir = variant(f"{env}-deployed", data, deployed_facts(data))
            old = json.loads((Path(outdir) / f"{stack.config.stack_name}.template.json").read_text())
            facts = facts_from_deployed(deployed_facts(data), old)
            outcomes = []
            for index, edit in enumerate(edits_of(data)[0]):
                # An assembly holds its assets (about 50 MB): only one per class is kept, for the CLI's
                # diff below; a few hundred would fill a CI runner's disk.
                kept = {o.assembly for done in (*results.values(), outcomes) for o in done if o.assembly}
                for folder in work.glob("*-out"):
                    if folder not in kept:
                        shutil.rmtree(folder)
                after = apply(data, edit)
                try:
                    parse_config(after, source=f"{env}.yaml")
                except ConfigError as refused:
                    outcomes.append(Outcome(env, edit, ChangeClass.REFUSED, refusal=str(refused)))
                    continue
                name = f"{env}-{index}"
                try:
                    new_stack, template = synth_variant(work, after, name, facts)
                except ConfigError as refused:  # the checks that need the synth (the model's fit, its files)
                    outcomes.append(Outcome(env, edit, ChangeClass.REFUSED, refusal=str(refused)))
                    continue
                except Exception as error:  # reported by the test below, edit by edit
                    outcomes.append(Outcome(env, edit, ChangeClass.REFUSED, crashed=f"{type(error).__name__}: {error}"))
                    continue
                new = template.to_json()
                try:
                    check_same_environment(old, new, source=f"the deployed {env}", stack=new_stack.config.stack_name)
                except PreviewRefused as refused:
                    outcomes.append(Outcome(env, edit, ChangeClass.REFUSED, refusal=str(refused)))
                    continue
                found = changes(old, new)
                summary = summarize(old, new, found, config=new_stack.config)
                again = facts_with_replacements(facts, new, summary.changes)
                if again is not None:
                    new_stack, template = synth_variant(work, after, f"{name}-replacing", again)
                    new = template.to_json()
                    summary = summarize(old, new, changes(old, new), config=new_stack.config)
                assembly = None
                if summary.changes and summary.change_class not in {o.change_class for o in outcomes if o.assembly}:
                    assembly = work / f"{name}-out"
                outcomes.append(
                    Outcome(
                        env,
                        edit,
                        summary.change_class,
                        summary=summary,
                        new=new,
                        assembly=assembly,
                        config=new_stack.config,
                    )
                )
            results[env] = outcomes
    report = Counter((o.env, o.change_class.label) for outcomes in results.values() for o in outcomes)
    print("\nderived rehearsal, edits per class:", dict(sorted(report.items())))
    yield results
    shutil.rmtree(work)


def test_every_field_of_the_schema_is_edited_on_each_base():
    fields = {path for path, _, _ in leaf_fields()}
    assert len(fields) > 100  # the walk reaches the nested sections
    for env in BASES:
        edits, unreachable = edits_of(_base(env))
        assert unreachable == [], f"{env}: no rule or value makes an edit of {unreachable}: add it to VALUES"
        edited = {e.field for e in edits}
        single_valued = {"serving.kv_transfer.connector"}  # Literal of one value: nothing to edit
        assert fields - edited == single_valued, fields - edited - single_valued


def test_every_edit_the_schema_accepts_synthesizes(rehearsed):
    crashed = [
        f"{o.env} {o.edit.field} ({o.edit.what}): {o.crashed}" for v in rehearsed.values() for o in v if o.crashed
    ]
    assert crashed == [], "\n".join(crashed)


def test_a_refused_edit_says_so_in_one_line_that_names_the_field(rehearsed):
    from preview.classes import ChangeClass

    refused = [o for outcomes in rehearsed.values() for o in outcomes if o.refusal and not o.crashed]
    assert refused
    for outcome in refused:
        assert outcome.change_class is ChangeClass.REFUSED
        # One line per problem: an edit that breaks both phases (the model no longer fits on either)
        # is two problems, each a line that names the field.
        leaf = outcome.edit.field.rsplit(".", 1)[-1]
        for line in outcome.refusal.strip().splitlines():
            named = leaf in line or leaf.replace("_", " ") in line
            assert named or outcome.edit.field == "name", (outcome.edit, line)


def test_nothing_that_holds_state_is_replaced_or_removed_without_asking(rehearsed):
    """Every type CloudFormation's specification marks stateful, and the ones the preview adds (the
    cluster, node groups, the Prometheus workspace), replaced or removed: the deploy asks first (or
    refuses), whatever the edit."""
    from preview.classes import ChangeClass
    from preview.serving import stateful_loss

    silent = []
    for outcomes in rehearsed.values():
        for outcome in outcomes:
            if outcome.summary is None:
                continue
            for change in outcome.summary.changes:
                lost = change.op == "-" or change.replaced or change.may_be_replaced
                if lost and stateful_loss(change.type) is not None:
                    if outcome.change_class < ChangeClass.STATEFUL_REPLACEMENT:
                        silent.append(f"{outcome.env} {outcome.edit.field} ({outcome.edit.what}): {change.type}")
    assert silent == [], "\n".join(silent)


def test_every_edited_stack_can_be_destroyed_and_keeps_only_what_the_docs_name(rehearsed):
    """Destroy, derived like the edits: in every template an accepted edit makes, each finalizer's owner
    and what it needs outlive the objects that carry it (``tests/stacks/test_destroy_order.py``'s check,
    from KubeRay's and the controllers' sources), and nothing outlives the stack but the model mirror
    that docs/operations.md ("Destroying") names as kept."""
    from tests.stacks.test_destroy_order import destroy_order_violations

    problems = []
    for outcomes in rehearsed.values():
        for outcome in outcomes:
            if outcome.new is None:
                continue
            where = f"{outcome.env} {outcome.edit.field} ({outcome.edit.what})"
            _, violations = destroy_order_violations(outcome.new)
            problems += [f"{where}: {v}" for v in violations]
            kept = {
                r["Type"]
                for r in outcome.new["Resources"].values()
                if r.get("DeletionPolicy") in ("Retain", "RetainExceptOnCreate", "Snapshot")
            }
            mirror_kept = outcome.config.model_mirror.enabled and outcome.config.mirror_kept_on_destroy
            expected = {"AWS::S3::Bucket"} if mirror_kept else set()
            if kept != expected:
                problems.append(f"{where}: a destroy keeps {sorted(kept)}, the docs name {sorted(expected)}")
    assert problems == [], "\n".join(problems)


def test_make_deploy_never_attempts_an_update_cloudformation_would_roll_back(rehearsed, capsys):
    """What `make deploy` does with each class: an update CloudFormation would refuse half-way stops
    with exit 2 even with ALLOW_REPLACEMENT=1; a stateful replacement stops with exit 3 without it;
    the rest deploy."""
    from cli.preview import NEEDS_CONFIRMATION, REFUSED, print_summary
    from preview.classes import ChangeClass

    for outcomes in rehearsed.values():
        for outcome in outcomes:
            if outcome.summary is None:
                continue
            config = type("Config", (), {"stack_name": f"{outcome.env}-stack"})
            allowed = print_summary(config, "", outcome.summary, summary_only=True, allow=True)
            asked = print_summary(config, "", outcome.summary, summary_only=True, allow=False)
            if outcome.change_class >= ChangeClass.TWO_DEPLOYS:
                assert allowed == asked == REFUSED, outcome.edit
            elif outcome.change_class is ChangeClass.STATEFUL_REPLACEMENT:
                assert (allowed, asked) == (0, NEEDS_CONFIRMATION), outcome.edit
            else:
                assert allowed == asked == 0, outcome.edit
    capsys.readouterr()


def test_each_class_is_what_the_cdk_clis_own_diff_says(rehearsed, variant):
    """One edit of each class per base, through `cdk diff`: the replaced, added and removed resources
    the schemas found are the ones the CLI finds."""
    from preview import cdk_diff
    from tests.preview.conftest import deployed_facts

    checked = defaultdict(list)
    for env, outcomes in rehearsed.items():
        data = _base(env)
        stack, _, outdir = variant(f"{env}-deployed", data, deployed_facts(data))
        old_file = Path(outdir) / f"{stack.config.stack_name}.template.json"
        representatives = {}
        for outcome in outcomes:
            if outcome.assembly is not None:
                representatives.setdefault(outcome.change_class, outcome)
        for change_class, outcome in representatives.items():
            cli = cdk_diff.parse(cdk_diff.run(outcome.assembly, old_file, stack=stack.config.stack_name))

            def shape(found):
                return {
                    "added": sorted(c.logical_id for c in found if c.op == "+"),
                    "removed": sorted(c.logical_id for c in found if c.op == "-"),
                    "replaced": sorted(c.logical_id for c in found if c.op == "~" and "replace" in c.impact),
                }

            ours = shape([c for c in outcome.summary.changes if "nested" not in c.impact])
            assert shape(cli) == ours, (env, outcome.edit, shape(cli), ours)
            checked[env].append(change_class.label)
    assert all(len(labels) >= 3 for labels in checked.values()), dict(checked)
