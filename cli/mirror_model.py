"""`make mirror-model`: fill the stack's S3 model mirror from Hugging Face with a Job on the cluster.

    python -m cli.mirror_model CONFIG [--repo ID] [--prefix P] [--revision R] [--dry-run]

The Job (``mirror/job.py`` in a ConfigMap, on the system nodes, with the ``model-mirror`` service
account's Pod Identity role, which may write to the mirror bucket only) downloads the model's
files one at a time through the region's NAT gateway and uploads them to
``s3://<mirror bucket>/<prefix>/``. Its log is followed here: progress per file, what was skipped,
the verification. Run it again after an interruption: it copies only what is missing. It ends by
printing the ``source:`` line to put in the config.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys

from cmdline import ArgumentParser
from config.loader import load_config_or_exit
from manifests.mirror_job import job_name, manifests


def kubectl(*args: str, stdin: str | None = None, timeout: float | None = None) -> int:
    return subprocess.run(["kubectl", *args], input=stdin, text=True, timeout=timeout, check=False).returncode


def main(argv: list[str] | None = None) -> int:
    parser = ArgumentParser(prog="python -m cli.mirror_model", description=__doc__.splitlines()[0])
    parser.add_argument("config", help="the environment's config, e.g. config/dev.yaml")
    parser.add_argument("--repo", help="Hugging Face repo id (default: serving.model.source)")
    parser.add_argument("--prefix", help="key prefix in the bucket (default: serving.model.model_id)")
    parser.add_argument("--revision", default="main", help="branch, tag or commit of the repo (default: main)")
    parser.add_argument("--timeout", type=int, default=7200, help="seconds to wait for the Job")
    parser.add_argument("--dry-run", action="store_true", help="print the manifests instead of applying them")
    args = parser.parse_args(argv)
    config = load_config_or_exit(args.config)
    if not config.model_mirror.enabled:
        print(f"{args.config}: model_mirror.enabled is false; set it to true and make deploy first", file=sys.stderr)
        return 2
    model = config.serving.model
    repo = args.repo or model.hub_repo
    if not repo:
        print(
            f"{args.config}: serving.model.source is {model.source}; give the Hugging Face repo with --repo",
            file=sys.stderr,
        )
        return 2
    prefix = (args.prefix or model.model_id).strip("/")
    objects = manifests(config, repo=repo, prefix=prefix, revision=args.revision)
    text = "\n".join(json.dumps(o) for o in objects)
    if args.dry_run:
        print(text)
        return 0
    if shutil.which("kubectl") is None:
        print("kubectl is not on PATH; install it (https://kubernetes.io/docs/tasks/tools/)", file=sys.stderr)
        return 2
    namespace, name = config.ray_service.namespace, job_name(config)
    kubectl("delete", "job", name, "-n", namespace, "--ignore-not-found", "--wait=true")
    if kubectl("apply", "--server-side", "-f", "-", stdin=text):
        return 2
    kubectl("wait", "--for=condition=Ready", "pod", "-l", f"job-name={name}", "-n", namespace, "--timeout=600s")
    kubectl("logs", "-f", f"job/{name}", "-n", namespace, timeout=args.timeout)
    if kubectl("wait", "--for=condition=complete", f"job/{name}", "-n", namespace, f"--timeout={args.timeout}s"):
        print(
            f"the mirror Job did not complete; see `kubectl describe job {name} -n {namespace}`; run again to resume",
            file=sys.stderr,
        )
        return 1
    print(
        f"\nPut this in {args.config} under serving.model:\n  source: s3://{config.mirror_bucket}/{prefix}\n"
        f"  hub_id: {repo}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
