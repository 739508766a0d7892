"""`python -m verify --config config/dev.yaml`: check a deployed environment, one line per check.

Without --base-url / --metrics-url it reaches the endpoint through `kubectl port-forward`: the
serve service on 8000 and each running GPU worker pod's Ray metrics port (each pod exports only
its own node's engine counters). --record DIR keeps every answer; --recorded DIR replays one.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path

from cmdline import ArgumentParser
from config.loader import load_config_or_exit
from manifests.contract import METRICS_PORT, PHASES, SERVE_PORT
from verify import checks
from verify.kube import KubectlRunner, KubeError, RecordedKube, RecordingKube

ENDPOINT_FILE = "endpoint.json"


# --- port-forwarding: the only part that starts processes ---------------------------------------


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextmanager
def port_forward(kubectl: KubectlRunner, namespace: str, target: str, port: int, timeout: float = 30) -> Iterator[str]:
    """``http://127.0.0.1:<local>`` forwarded to ``target``'s ``port`` until the block ends."""
    local = _free_port()
    process = subprocess.Popen(
        [*kubectl.base, "port-forward", "-n", namespace, target, f"{local}:{port}"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        deadline = time.monotonic() + timeout
        while True:
            if process.poll() is not None:
                raise KubeError(f"kubectl port-forward {target} exited: {process.stderr.read().strip()}")
            try:
                socket.create_connection(("127.0.0.1", local), timeout=1).close()
                break
            except OSError:
                if time.monotonic() > deadline:
                    raise KubeError(f"kubectl port-forward {target} did not open within {timeout:.0f} s") from None
                time.sleep(0.3)
        yield f"http://127.0.0.1:{local}"
    finally:
        process.terminate()
        try:
            process.wait(5)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


# --- the endpoint checks, live or replayed -------------------------------------------------------


def live_endpoint(args: argparse.Namespace, kubectl: KubectlRunner, namespace: str, name: str, model: str):
    def measure(workers: dict[str, str]) -> list[checks.CheckResult]:
        with ExitStack() as stack:
            base_url = (
                args.base_url
                or stack.enter_context(port_forward(kubectl, namespace, f"svc/{name}-serve-svc", SERVE_PORT)) + "/v1"
            )
            # A deployment label per URL ("Decode/<pod>"): the phase is where the text came from.
            metrics = {}
            for item in args.metrics_url:
                phase, url = item.split("=", 1)
                metrics[f"{phase.capitalize()}/{phase}"] = url
            if not metrics:
                for pod, phase in sorted(workers.items()):
                    url = stack.enter_context(port_forward(kubectl, namespace, f"pod/{pod}", METRICS_PORT))
                    metrics[f"{phase.capitalize()}/{pod}"] = f"{url}/metrics"
            return checks.verify_kv_reuse(
                base_url,
                model,
                lambda: checks.phase_snapshot(metrics),
                timeout=args.timeout,
                # The endpoint's key, when it asks for one: the Makefile's API_KEY, from the environment.
                api_key=os.environ.get("API_KEY", "").strip() or None,
            )

    def run(workers: dict[str, str]) -> list[checks.CheckResult]:
        try:
            results = measure(workers)
        except (KubeError, OSError) as exc:
            reason = f"endpoint unreachable: {exc}"
            return [checks.CheckResult(name, False, reason) for name in (checks.CHAT, checks.KV, checks.REUSE)]
        if args.record:
            record = json.dumps(checks.endpoint_record(results), indent=1)
            (Path(args.record) / ENDPOINT_FILE).write_text(record + "\n")
        return results

    return run


def recorded_endpoint(directory: str):
    def run(_workers: dict[str, str]) -> list[checks.CheckResult]:
        path = Path(directory) / ENDPOINT_FILE
        return checks.replay_endpoint(json.loads(path.read_text()) if path.is_file() else {})

    return run


def replica_estimates(config) -> dict[str, float]:
    """The planner's time to a new replica on a new node per phase, for the configured weight source."""
    from planner.from_config import plan_config

    return {phase: times[0].total for phase, times in plan_config(config).scaling.replica_times.items()}


def main(argv: list[str] | None = None) -> int:
    parser = ArgumentParser(prog="python -m verify", description=__doc__.splitlines()[0])
    parser.add_argument("--config", required=True, help="the environment's config, e.g. config/dev.yaml")
    parser.add_argument("--base-url", help="OpenAI base URL ending in /v1 (default: port-forward the serve service)")
    parser.add_argument(
        "--metrics-url",
        action="append",
        default=[],
        metavar="PHASE=URL",
        help="a Ray metrics URL and the phase whose engines it shows, e.g. decode=http://…/metrics; repeatable",
    )
    parser.add_argument("--kubeconfig", help="kubeconfig file for kubectl (default: kubectl's own)")
    parser.add_argument("--context", help="kubeconfig context for kubectl (default: the current one)")
    parser.add_argument("--timeout", type=float, default=60, help="seconds to wait for counters to move")
    source = parser.add_mutually_exclusive_group()
    source.add_argument("--recorded", metavar="DIR", help="replay outputs recorded with --record")
    source.add_argument("--record", metavar="DIR", help="keep every output here (for a bug report)")
    args = parser.parse_args(argv)

    config = load_config_or_exit(args.config)
    rs, model = config.ray_service, config.serving.model.model_id
    bad = [item for item in args.metrics_url if "=" not in item]
    if bad:
        parser.error(f"--metrics-url wants PHASE=URL, got {bad[0]!r}")
    if args.recorded:
        kube, endpoint = RecordedKube(args.recorded), recorded_endpoint(args.recorded)
    else:
        kubectl = KubectlRunner(args.kubeconfig, args.context)
        kube = RecordingKube(kubectl, args.record) if args.record else kubectl
        endpoint = live_endpoint(args, kubectl, rs.namespace, rs.name, model)
    groups = config.cluster.gpu_node_groups
    try:
        results = checks.run_all(
            kube,
            namespace=rs.namespace,
            name=rs.name,
            app_name=config.serving.app_name,
            endpoint=endpoint,
            gpu_groups={phase: (getattr(groups, phase).min_size, getattr(groups, phase).max_size) for phase in PHASES},
            replica_estimates=replica_estimates(config),
            gated=bool(config.serving.model.hf_token_secret),
            deletion_delay_seconds=config.deletion_delay_seconds,
            kv_backend=config.serving.kv_transfer.backend,
        )
    except KubeError as exc:
        print(f"FAIL cluster: {exc}", file=sys.stderr)
        return 2
    return checks.render(results, sys.stdout)


if __name__ == "__main__":
    sys.exit(main())
