#!/usr/bin/env python3
"""CDK entry point: the only place that reads the environment name, a config path or context.

cdk synth -c env=prod            # config/prod.yaml
cdk synth -c config=my.yaml      # any config file
cdk deploy -c deploy_facts=F     # what `make deploy` resolved at deploy time (cli.deploy_guard)
"""

from __future__ import annotations

import json
import os
import sys
from dataclasses import replace
from pathlib import Path

import aws_cdk as cdk

from cdk_constructs.policy import attach_policy_checks
from config.loader import ConfigError, config_path_for, describe_validation_error, load_config
from config.schema import DeployFacts
from config.token_rotation import RotationRefused
from config.upgrade import VersionStepRefused
from kuberay import MIRRORED_VERSION, KubeRayRejection
from planner import PlanningError
from planner.from_config import advisor_warning, plan_config
from stacks.pd_serving_stack import PdServingStack

# Resource types whose Tags cannot change without replacing the resource (CloudFormation's resource
# specification): a cost-tag edit would replace the GPU groups' placement group and with it roll
# every GPU node into a new one. They carry no stack tags; tests/stacks check the list against the spec.
TAGS_REPLACE = ("AWS::EC2::PlacementGroup",)


def availability_zone_context(account: str, region: str, zones: list[str]) -> dict[str, list[str]]:
    """Context that answers the VPC's AZ question from the config, so synth never asks AWS."""
    return {f"availability-zones:account={account}:region={region}": list(zones)}


def checked_plan(config, config_path: str):
    """The planner's verdict at synth: a deployment that cannot work fails here, not in EKS."""
    try:
        report = plan_config(config)
    except PlanningError as exc:
        raise ConfigError(config_path, [str(exc)]) from None
    if report.errors:
        raise ConfigError(config_path, report.errors)
    warning = advisor_warning(config, report)
    if warning:
        report = replace(report, warnings=[*report.warnings, warning])
    return report


def load_deploy_facts(path: str | None) -> DeployFacts:
    """The deployer's identity and address, written by `make deploy`'s guard; empty for synth."""
    if not path:
        return DeployFacts()
    from pydantic import ValidationError

    try:
        return DeployFacts.model_validate(json.loads(Path(path).read_text()))
    except (OSError, ValueError) as exc:
        problems = describe_validation_error(DeployFacts, exc) if isinstance(exc, ValidationError) else [str(exc)]
        raise ConfigError(path, problems) from None


def build_app(config_path: str, *, outdir: str | None = None, deploy_facts: str | None = None) -> cdk.App:
    config = load_config(config_path)
    deployer = load_deploy_facts(deploy_facts)
    report = checked_plan(config, config_path)
    app = cdk.App(
        outdir=outdir,
        # A construct's creation trace from Python ends in jsii's bundled JavaScript, not in this
        # code; the CDK CLI would print one such frame above every warning.
        stack_traces=False,
        context=availability_zone_context(config.aws.account, config.aws.region, config.network.availability_zones),
    )
    try:
        stack = PdServingStack(
            app,
            config.stack_name,
            config=config,
            deployer=deployer,
            env=cdk.Environment(account=config.aws.account, region=config.aws.region),
            description=f"Prefill/decode disaggregated LLM serving on EKS ({config.name})",
        )
    except KubeRayRejection as exc:
        raise ConfigError(
            config_path, [f"KubeRay {MIRRORED_VERSION}'s controller would refuse the RayService: {exc}"]
        ) from None
    except (VersionStepRefused, RotationRefused) as refused:  # a step EKS or ElastiCache would refuse
        raise ConfigError(config_path, [str(refused)]) from None
    attach_policy_checks(app)
    for key, value in config.tags.items():
        cdk.Tags.of(stack).add(key, value, exclude_resource_types=list(TAGS_REPLACE))
    for index, warning in enumerate(report.warnings):
        cdk.Annotations.of(stack).add_warning_v2(f"pd-serving:plan-{index}", warning)
    return app


def selected_config_path(app_context: cdk.App) -> str:
    config = app_context.node.try_get_context("config")
    if config:
        return config
    return str(config_path_for(app_context.node.try_get_context("env") or "dev"))


def main() -> int:
    selector = cdk.App()  # reads -c env=… / -c config=… passed by the CDK CLI
    try:
        app = build_app(
            selected_config_path(selector),
            outdir=os.environ.get("CDK_OUTDIR"),
            deploy_facts=selector.node.try_get_context("deploy_facts"),
        )
    except ConfigError as exc:
        print(f"Config error:\n{exc}", file=sys.stderr)
        return 2
    app.synth()
    return 0


if __name__ == "__main__":
    sys.exit(main())
