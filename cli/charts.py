"""`make charts`: every chart the stack can install, at its pinned version, into the chart cache.

    python -m cli.charts --cache DIR [--with-cdk-chosen] [--check]

The tests render the charts with the real Helm from this cache (CHART_CACHE); `make test` runs
this first, so only a chart missing from the cache is fetched, and a cache that holds them all
needs no network. Each chart comes from its repository with `helm pull`, the Helm the deploy runs
(from the kubectl layer package). --with-cdk-chosen (`make charts`) also fetches the charts that
aws-cdk-lib's own constructs choose (the tests skip those when absent). --check only says which
are missing, and exits 1 if any is.
"""

from __future__ import annotations

import sys
from pathlib import Path

from cmdline import ArgumentParser
from consumers import charts


def main(argv: list[str] | None = None) -> int:
    parser = ArgumentParser(prog="python -m cli.charts", description=__doc__.splitlines()[0])
    parser.add_argument("--cache", type=Path, required=True, help="the chart cache folder (make passes CHART_CACHE)")
    parser.add_argument(
        "--with-cdk-chosen",
        action="store_true",
        help="also the charts aws-cdk-lib's constructs choose (ALB controller)",
    )
    parser.add_argument("--check", action="store_true", help="only list the charts missing from the cache")
    args = parser.parse_args(argv)
    wanted = {**charts.PINNED_CHARTS, **(charts.CDK_CHOSEN_CHARTS if args.with_cdk_chosen else {})}
    failed = 0
    unreachable: list[str] = []
    for pin in wanted.values():
        try:
            path = charts.chart_archive(pin.chart, pin.version, args.cache)
            print(f"{pin.chart} {pin.version}: {path}")
            continue
        except charts.ChartNotCached as missing:
            if args.check:
                print(missing, file=sys.stderr)
                failed += 1
                continue
        try:
            print(
                f"{pin.chart} {pin.version}: {charts.pull(pin, pin.version, args.cache)} (pulled from {pin.repository})"
            )
        except charts.ChartRenderError as error:
            print(error, file=sys.stderr)
            unreachable.append(f"{pin.chart}-{pin.version}.tgz")
            failed += 1
    if unreachable:
        # Each pull's own line says why; this one says what to do, the same for all (offline, mostly).
        print(
            f"{len(unreachable)} chart(s) are not in the chart cache {args.cache} and could not be pulled: "
            f"run where the chart repositories are reachable, or set CHART_CACHE to a folder that holds "
            f"{', '.join(unreachable)}",
            file=sys.stderr,
        )
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
