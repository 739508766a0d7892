"""Rewrites the checked-in Grafana dashboard from the panel definitions."""

import sys

from cmdline import ArgumentParser
from manifests.dashboards import GRAFANA_FILE, grafana_json


def main(argv: list[str] | None = None) -> int:
    parser = ArgumentParser(prog="python -m cli.dashboards", description=__doc__.splitlines()[0])
    parser.parse_args(argv)
    GRAFANA_FILE.write_text(grafana_json())
    print(f"wrote {GRAFANA_FILE}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
