"""`make local`: serve serve_app on this CPU with a local Ray, until Ctrl-C.

    python -m local.server [--mode disaggregated|colocated] [--port 8000] [--metrics-port 8085]

It generates the tiny model if needed, starts Ray with one custom resource per phase (as the
cluster's worker groups advertise them), runs ``serve_app.app:build_app`` with the local serving
spec, and prints the OpenAI base URL once the app answers. A status file beside the model
(``.local/run/status.json``) tells tools which Serve replica is which, for the KV counters.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import threading
import time
import urllib.request
from pathlib import Path

from serve_app.spec import PHASE_RESOURCE, ServingSpec, load_spec

ROOT = Path(__file__).resolve().parent.parent
DEFAULT_SPEC = ROOT / "config" / "local.yaml"
RUN_DIR = ROOT / ".local" / "run"


def local_spec(path: Path, mode: str | None) -> ServingSpec:
    """The spec with its model path made absolute (replicas do not share this cwd)."""
    spec = load_spec(str(path))
    data = spec.model_dump()
    source = Path(data["model"]["source"])
    data["model"]["source"] = str(source if source.is_absolute() else (ROOT / source).resolve())
    if mode:
        data["mode"] = mode
    return ServingSpec.model_validate(data)


def cpus_needed(spec: ServingSpec) -> int:
    phases = ("prefill", "decode") if spec.mode == "disaggregated" else ("colocated",)
    bundles = [b for phase in phases for b in spec.placement_bundles(phase)]
    return max(2, int(sum(b["CPU"] for b in bundles) + 0.999))


def replica_map() -> dict[str, str]:
    """Serve replica id -> deployment, from the replica actors' names (no dashboard needed)."""
    import ray

    replicas = {}
    for actor in ray.util.list_named_actors(all_namespaces=True):
        name = actor["name"] if isinstance(actor, dict) else actor
        if name.startswith("SERVE_REPLICA::"):
            _app, deployment, replica_id = name.split("::", 1)[1].split("#")
            replicas[replica_id] = deployment
    return replicas


def wait_until_answering(base_url: str, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(f"{base_url}/models", timeout=5) as response:
                if response.status == 200 and json.loads(response.read())["data"]:
                    return
        except Exception:  # noqa: BLE001 - not up yet
            pass
        time.sleep(1)
    raise TimeoutError(f"{base_url} did not answer within {timeout:.0f} s")


def write_status(path: Path, status: dict) -> None:
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(status, indent=2))
    tmp.replace(path)


def serve(args: argparse.Namespace) -> int:
    import ray
    from ray import serve as ray_serve

    from local.tiny_model import ensure_tiny_model
    from serve_app.app import build_app

    spec = local_spec(Path(args.spec), args.mode)
    ensure_tiny_model(spec.model.source)
    started = time.monotonic()
    stop = threading.Event()
    for signum in (signal.SIGINT, signal.SIGTERM):
        signal.signal(signum, lambda *_: stop.set())

    # Ray detects GPUs itself; a cuda spec (the one-GPU check) then places engines on them.
    ray.init(
        num_cpus=cpus_needed(spec),
        resources={resource: 1 for resource in PHASE_RESOURCE.values()},
        include_dashboard=False,
        _metrics_export_port=args.metrics_port,
        _system_config={"metrics_report_interval_ms": 1000},
        logging_level="WARNING",
    )
    RUN_DIR.mkdir(parents=True, exist_ok=True)
    status_path = RUN_DIR / "status.json"
    base_url = f"http://127.0.0.1:{args.port}/v1"
    try:
        ray_serve.start(
            http_options={"host": "127.0.0.1", "port": args.port, "request_timeout_s": spec.request_timeout_s}
        )
        ray_serve.run(build_app(spec.model_dump(mode="json")), name=spec.app_name, route_prefix="/", blocking=False)
        wait_until_answering(base_url, args.ready_timeout)
        ready_seconds = time.monotonic() - started
        print(f"ready after {ready_seconds:.0f} s ({spec.mode}): OpenAI base URL {base_url}", flush=True)
        while not stop.is_set():
            write_status(
                status_path,
                {
                    "pid": os.getpid(),
                    "mode": spec.mode,
                    "model": spec.model.model_id,
                    "base_url": base_url,
                    "metrics_url": f"http://127.0.0.1:{args.metrics_port}/metrics",
                    "ready_seconds": round(ready_seconds, 1),
                    "replicas": replica_map(),
                },
            )
            stop.wait(2)
    finally:
        print("shutting down", flush=True)
        status_path.unlink(missing_ok=True)
        try:
            ray_serve.shutdown()
        finally:
            ray.shutdown()
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--mode", choices=["disaggregated", "colocated"], default=None)
    parser.add_argument("--spec", default=str(DEFAULT_SPEC))
    parser.add_argument("--port", type=int, default=8000)
    parser.add_argument("--metrics-port", type=int, default=8085)
    parser.add_argument("--ready-timeout", type=float, default=600)
    return serve(parser.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
