"""`make plan`: `python -m cli.plan CONFIG` prints the deployment plan of an environment."""

from __future__ import annotations

import sys

from cli.args import ArgumentParser
from config.loader import ConfigError, load_config
from planner import PlanningError, render_text
from planner.from_config import plan_config


def main(argv: list[str] | None = None) -> int:
    parser = ArgumentParser(prog="python -m cli.plan", description=__doc__.splitlines()[0])
    parser.add_argument("config", help="the environment's config, e.g. config/dev.yaml")
    path = parser.parse_args(argv).config
    try:
        report = plan_config(load_config(path))
    except ConfigError as exc:
        print(f"Config error:\n{exc}", file=sys.stderr)
        return 2
    except PlanningError as exc:
        print(f"{path}: {exc}", file=sys.stderr)
        return 2
    print(render_text(report))
    return 0 if report.ok else 1


if __name__ == "__main__":
    sys.exit(main())
