"""A synthesized assembly against the template the environment runs now, in serving terms.

    python -m cli.preview CONFIG --assembly DIR [--template FILE] [--allow-replacement]

`make preview` and `make deploy` run this through `cli/deploy.py`, which synthesizes the assembly
as the deploy does. The CDK CLI's own diff of the assembly against the
template the environment runs now: read from CloudFormation (`cloudformation:GetTemplate`, with
your credentials), or, offline, from --template. Then what the diff cannot say: what holds state
and would be replaced, which phase loses its nodes, which RayService rollout happens, who gains or
loses cluster admin, and the node groups' cost per hour before and after. Exits 2 when CloudFormation
would refuse the update and roll it back (a change that needs a step between, such as the GCS store's
replica before its failover, or one no deploy can make, such as replacing a resource that keeps its
custom name), whatever --allow-replacement says; 3 when something that holds
state would be replaced or removed, unless --allow-replacement (make deploy ALLOW_REPLACEMENT=1)
says that is intended.
"""

from __future__ import annotations

import json
import re
import sys
import tempfile
from pathlib import Path
from typing import Any

from cmdline import ArgumentParser
from config.loader import load_config_or_exit
from preview import cdk_diff
from preview.serving import summarize

# CloudFormation would refuse the update half-way and roll back: never attempted, whatever ALLOW_REPLACEMENT says.
REFUSED = 2
NEEDS_CONFIRMATION = 3


class PreviewRefused(Exception):
    """One line: the preview cannot compare these two templates."""


class NoDeployYet(PreviewRefused):
    pass


def cluster_name_of(template: dict) -> str | None:
    for resource in template.get("Resources", {}).values():
        if resource.get("Type") == "AWS::EKS::Cluster":
            name = resource.get("Properties", {}).get("Name")
            return name if isinstance(name, str) else None
    return None


# The CDK's default synthesizer stages a stack's assets (its Lambda code) in the bootstrap bucket of the
# stack's own account and region: cdk-<qualifier>-assets-<account>-<region>.
ASSET_BUCKET = re.compile(r"^cdk-[a-z0-9]+-assets-(\d{12})-([a-z0-9-]+)$")


def environment_of(template: dict) -> tuple[str, str] | None:
    """(account, region) a template was synthesized for, read from its assets' bootstrap bucket."""
    for resource in template.get("Resources", {}).values():
        bucket = (resource.get("Properties", {}).get("Code") or {}).get("S3Bucket")
        if isinstance(bucket, str) and (found := ASSET_BUCKET.match(bucket)):
            return found.group(1), found.group(2)
    return None


def check_same_environment(old: dict, new: dict, *, source: str, stack: str) -> None:
    old_name, new_name = cluster_name_of(old), cluster_name_of(new)
    if old_name is None:
        raise PreviewRefused(f"{source} is not a template of this project's stack (it has no EKS cluster)")
    if old_name != new_name:
        raise PreviewRefused(
            f"{source} is the template of cluster {old_name}, not {new_name} ({stack}): pass the template of "
            "this environment, or pick its config with ENV=/CONFIG="
        )
    before, after = environment_of(old), environment_of(new)
    if before and after and before != after:
        moved = [
            f"aws.{field} is {now} but {source} runs in {then}"
            for field, then, now in zip(("account", "region"), before, after, strict=True)
            if then != now
        ]
        raise PreviewRefused(
            f"{'; '.join(moved)}: another account or region is a new environment, not an update of this one; "
            f"deploy it with a config of its own (the old stack keeps running until `make destroy` with the old config)"
        )


def template_from_cloudformation(stack: str, region: str, client: Any = None) -> dict:
    """The template the stack runs now, as CloudFormation holds it."""
    if client is None:
        import boto3

        client = boto3.client("cloudformation", region_name=region)
    from botocore.exceptions import ClientError

    try:
        body = client.get_template(StackName=stack, TemplateStage="Original")["TemplateBody"]
    except ClientError as error:
        message = error.response.get("Error", {}).get("Message", "")
        if "does not exist" in message:
            raise NoDeployYet(
                f"no deploy of {stack} yet in {region}: there is nothing to compare with; `make deploy` creates it"
            ) from None
        raise PreviewRefused(f"cannot read the template of {stack} in {region}: {message}") from None
    return body if isinstance(body, dict) else json.loads(body)


def stack_template(assembly: Path, stack: str) -> dict:
    path = assembly / f"{stack}.template.json"
    if not path.is_file():
        raise PreviewRefused(f"{assembly} holds no synthesized {stack}: run `make synth` (make preview does) first")
    return json.loads(path.read_text())


def preview(config, *, assembly: Path, old: dict, source: str) -> tuple[str, Any]:
    """(the CDK CLI's diff, the serving summary) of the assembly against the ``old`` template."""
    new = stack_template(assembly, config.stack_name)
    check_same_environment(old, new, source=source, stack=config.stack_name)
    with tempfile.TemporaryDirectory(prefix="preview-") as work:
        old_file = Path(work) / "deployed.template.json"
        old_file.write_text(json.dumps(old))
        diff = cdk_diff.run(assembly, old_file, stack=config.stack_name)
    return diff, summarize(old, new, cdk_diff.parse(diff), config=config)


def read_template_file(path: Path) -> dict:
    if not path.is_file():
        raise PreviewRefused(f"--template {path}: no such file")
    try:
        return json.loads(path.read_text())
    except json.JSONDecodeError as error:
        raise PreviewRefused(f"--template {path} is not a JSON template: {error}") from None


def print_summary(config, diff: str, summary: Any, *, summary_only: bool, allow: bool) -> int:
    """Prints the diff (unless ``summary_only``) and the serving summary; the exit status it calls for."""
    if not summary_only:
        print(diff.rstrip())
        print()
    print(f"What `make deploy` would do to {config.stack_name}:")
    for line in summary.lines():
        print(f"  {line}")
    if summary.refused or summary.two_deploys:
        how = "deploy the step between first" if not summary.refused else "no deploy can make this change"
        print(
            f"\n{config.stack_name}: not deployed, CloudFormation would roll this update back (above): {how}.",
            file=sys.stderr,
        )
        return REFUSED
    if summary.needs_confirmation and not allow:
        print(
            "\nThis deploy replaces or removes something that holds state (above). If that is intended, deploy "
            "with ALLOW_REPLACEMENT=1.",
            file=sys.stderr,
        )
        return NEEDS_CONFIRMATION
    return 0


def main(argv: list[str] | None = None, *, cloudformation: Any = None) -> int:
    parser = ArgumentParser(prog="python -m cli.preview", description=__doc__.splitlines()[0])
    parser.add_argument("config", help="the environment's config, e.g. config/dev.yaml")
    parser.add_argument("--assembly", type=Path, required=True, help="the synthesized cloud assembly (cdk.out)")
    parser.add_argument(
        "--template", type=Path, help="the template the environment runs now, from a file (offline); default: read it"
    )
    parser.add_argument(
        "--allow-replacement", action="store_true", help="exit 0 even when something that holds state is replaced"
    )
    parser.add_argument("--summary-only", action="store_true", help="print the serving summary without the CDK diff")
    args = parser.parse_args(argv)
    config = load_config_or_exit(args.config)
    try:
        if args.template is not None:
            old = read_template_file(args.template)
            source = str(args.template)
        else:
            old = template_from_cloudformation(config.stack_name, config.aws.region, cloudformation)
            source = f"the deployed {config.stack_name}"
        diff, summary = preview(config, assembly=args.assembly, old=old, source=source)
    except (PreviewRefused, cdk_diff.DiffError) as refused:
        print(f"preview: {refused}", file=sys.stderr)
        return 2
    return print_summary(config, diff, summary, summary_only=args.summary_only, allow=args.allow_replacement)


if __name__ == "__main__":
    sys.exit(main())
