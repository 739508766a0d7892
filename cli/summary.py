"""Prints a one-screen summary of a synthesized environment: `python -m cli.summary CONFIG OUTDIR`."""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

from cmdline import ArgumentParser
from config.loader import ConfigError, load_config
from serve_app.spec import ServingSpec

# The serving spec's field that makes both builders serve the keyed ingress; the Serve config in the
# template carries it (null or a directory).
KEY_DIRECTORY_FIELD = "api_key_dir"
assert KEY_DIRECTORY_FIELD in ServingSpec.model_fields
ASKS_FOR_A_KEY = re.compile(rf"\b{KEY_DIRECTORY_FIELD}: (?!null\b)\S")


def summarize(config_path: str, outdir: str) -> str:
    config = load_config(config_path)
    out = Path(outdir)
    template_path = out / f"{config.stack_name}.template.json"
    template = json.loads(template_path.read_text())
    resources = template["Resources"]
    node_groups = [r["Properties"] for r in resources.values() if r["Type"] == "AWS::EKS::Nodegroup"]
    groups = config.cluster.gpu_node_groups
    lines = [
        f"Synthesized {config.name} from {config_path}",
        f"  template        {template_path} ({len(resources)} resources)",
        f"  stack           {config.stack_name} in {config.aws.account}/{config.aws.region}",
        f"  kubernetes      {config.cluster.kubernetes_version}",
        f"  VPC AZs         {', '.join(config.network.availability_zones)}; "
        f"GPU nodes in {config.network.gpu_availability_zone}",
        "  node groups     name      instance      min/desired/max  AMI",
    ]
    rows = [
        ("system", config.cluster.system_node_group),
        ("prefill", groups.prefill),
        ("decode", groups.decode),
    ]
    amis = {ng["Labels"].get("pd-serving/phase", ng["Labels"].get("role")): ng["AmiType"] for ng in node_groups}
    for name, group in rows:
        lines.append(
            f"                  {name:<9} {group.instance_type:<13} "
            f"{group.min_size}/{group.desired_size}/{group.max_size:<13} {amis.get(name, '?')}"
        )
    endpoint = config.cluster.endpoint
    doors = list(endpoint.public_cidrs) + (["your address (make deploy)"] if endpoint.allow_deployer_address else [])
    access = []
    if endpoint.public:
        access.append(f"public to {', '.join(doors)}")
    if endpoint.private:
        access.append("private (inside the VPC)")
    admins = list(config.cluster.admin_principals) + (
        ["you (make deploy)"] if config.cluster.grant_deployer_admin else []
    )
    lines += [
        f"  API endpoint    {'; '.join(access)}",
        f"  cluster admins  {', '.join(admins)}",
    ]
    lines.append(f"  OpenAI endpoint {openai_endpoint(config, template_path.read_text())}")
    serving = config.serving
    lines += [
        f"  serving         {serving.mode}: {serving.model.model_id} ({serving.model.source}), "
        f"max_model_len {serving.max_model_len}",
        f"  image           {config.ray_service.image_for(config.aws.region)} (Ray {config.ray_service.ray_version})",
    ]
    return "\n".join(lines)


def openai_endpoint(config, template_text: str) -> str:
    """Where Serve's OpenAI endpoint can be reached from, and whether it asks for a key: the key
    as the synthesized template ships it (the Serve config's serving spec names a key directory)."""
    endpoint = config.ray_service.endpoint
    if endpoint.internal_nlb:
        reach = f"internal NLB for {', '.join(endpoint.allowed_cidrs)}, Serve's port open to the whole VPC"
    else:
        reach = "inside the cluster only (kubectl port-forward)"
    if ASKS_FOR_A_KEY.search(template_text):
        key = f"asks for an API key ({len(endpoint.api_key_secrets)} secret(s) in api_key_secrets)"
    elif endpoint.internal_nlb:
        key = "asks for NO key: any pod in the VPC may call it (open_to_vpc_without_key)"
    else:
        key = "asks for no key"
    return f"{reach}; {key}"


def main(argv: list[str] | None = None) -> int:
    parser = ArgumentParser(prog="python -m cli.summary", description=__doc__.splitlines()[0])
    parser.add_argument("config", help="the environment's config, e.g. config/dev.yaml")
    parser.add_argument("outdir", help="the folder `cdk synth` wrote the templates to, e.g. cdk.out")
    args = parser.parse_args(argv)
    try:
        print(summarize(args.config, args.outdir))
    except ConfigError as exc:
        print(f"Config error:\n{exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
