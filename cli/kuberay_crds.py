"""`make upgrade-crds`: KubeRay's CRDs at the pinned operator version, applied server-side.

    python -m cli.kuberay_crds CONFIG [--dry-run]

Helm installs a chart's crds/ on the first install and never upgrades them, so a KubeRay chart
bump leaves the old CRDs, and the new operator's fields are pruned. The CRDs are too large for the
stack to carry: about 0.9-1.4 MB each as YAML, over client-side apply's 262,144-byte
last-applied-configuration limit (the stack's manifests are applied client-side) and, together,
over CloudFormation's 1 MB template limit. So this applies them from KubeRay's own kustomization at
the pinned version with server-side apply, through your kubeconfig. Run it before `make deploy`
when charts.kuberay_operator changes.
"""

from __future__ import annotations

import shutil
import subprocess
import sys

from cmdline import ArgumentParser
from config.loader import load_config_or_exit
from config.versions import KUBERAY_CRDS_KUSTOMIZATION


def command(version: str) -> list[str]:
    return [
        "kubectl",
        "apply",
        "--server-side",
        "--force-conflicts",
        "-k",
        KUBERAY_CRDS_KUSTOMIZATION.format(version=version),
    ]


def main(argv: list[str] | None = None) -> int:
    parser = ArgumentParser(prog="python -m cli.kuberay_crds", description=__doc__.splitlines()[0])
    parser.add_argument("config", help="the environment's config, e.g. config/dev.yaml (its charts.kuberay_operator)")
    parser.add_argument("--dry-run", action="store_true", help="print the command instead of running it")
    args = parser.parse_args(argv)
    config = load_config_or_exit(args.config)
    cmd = command(config.charts.kuberay_operator)
    print(" ".join(cmd))
    if args.dry_run:
        return 0
    if shutil.which("kubectl") is None:
        print("kubectl is not on PATH; install it (https://kubernetes.io/docs/tasks/tools/)", file=sys.stderr)
        return 2
    return subprocess.call(cmd)


if __name__ == "__main__":
    sys.exit(main())
