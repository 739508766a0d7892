"""Refuses to deploy a config that only makes sense offline: `python -m cli.deploy_guard CONFIG`."""

from __future__ import annotations

import sys

from config.loader import ConfigError, load_config
from config.schema import PLACEHOLDER_ACCOUNT


def deploy_problems(config_path: str) -> list[str]:
    config = load_config(config_path)
    problems = []
    if config.aws.account == PLACEHOLDER_ACCOUNT:
        problems.append(
            f"{config_path}: aws.account is the placeholder {PLACEHOLDER_ACCOUNT}; set your "
            "12-digit account id before deploying"
        )
    for arn in config.cluster.admin_principals:
        if f"::{PLACEHOLDER_ACCOUNT}:" in arn:
            problems.append(
                f"{config_path}: cluster.admin_principals has the placeholder {arn}; use a real ARN"
            )
    return problems


def main(argv: list[str]) -> int:
    try:
        problems = deploy_problems(argv[0])
    except ConfigError as exc:
        print(f"Config error:\n{exc}", file=sys.stderr)
        return 2
    for problem in problems:
        print(problem, file=sys.stderr)
    return 2 if problems else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
