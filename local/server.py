"""`make local`: serve serve_app on this CPU with a local Ray, until Ctrl-C.

    python -m local.server [--mode disaggregated|colocated] [--port 8000] [--metrics-port 8085]
                           [--nixl-port-base 20000] [--code-from-asset config/dev.yaml]
                           [--gcs-fault-tolerance | --ray-cluster] [--api-key-env NAME]

It generates the tiny model if needed, starts Ray with one custom resource per phase (as the
cluster's worker groups advertise them), runs ``serve_app.app:build_app`` with the local serving
spec, and prints ``ready`` once one chat completion has gone through the whole app (in
disaggregated mode: prefill, then decode with the prompt's KV cache over NIXL). Until then
``/v1/models`` may already answer while completions still time out. The status file
``.local/run/status.json`` is written from that moment on and tells tools which Serve replica is
which, for the KV counters.

The run looks after itself:

- before it starts anything it records itself (``.local/run/run.json``) and marks every process
  it starts (``local/lifecycle.py``); a later start stops whatever a killed run left behind, and
  says so in one line, and waits until those processes and their ports are gone;
- it checks every port it will bind first and names the process in the way;
- the first Ctrl-C or SIGTERM stops it within 30 s at any moment, start-up included, with nothing
  left behind; a second one stops it at once;
- it never outlives what started it: when that process goes away (a closed terminal, a killed
  make, a CI runner's SIGKILL), the run stops within seconds;
- start-up is bounded: if the app is not ready within ``--ready-timeout``, or a replica dies on
  the way, it exits non-zero naming the deployment and the first error line of its replica log;
- ``kill -USR1 <pid>`` writes the stack of every one of its threads to its output, whatever the
  main thread is doing: what to look at when it does not stop as promised.

With ``--code-from-asset CONFIG`` the code comes the way the cluster gets it: the environment is
synthesized, the CDK CLI publishes its assets to an S3 server on loopback (moto), and Serve
deploys the application from a Serve config whose ``runtime_env.working_dir`` is the asset's
``s3://`` URI, so Ray's runtime_env agent downloads and unpacks the very zip `make deploy` uploads.

With ``--gcs-fault-tolerance`` (make local HA=1) Ray runs in the cluster's shape: a head with no
resources and GCS fault tolerance on a Redis server on loopback, and one worker node per phase
(``local/cluster.py``); requests go through the worker nodes' Serve proxies on ``--port``, never
through the head, so the head's GCS can die and come back while the worker nodes stay.
``--ray-cluster`` is the same shape without fault tolerance (what a head restart costs without it).

Ray runs with token authentication, as KubeRay sets it up in the cluster: a new token of the run's
in ``.local/run/ray-auth-token`` (this user's only), which every node and this driver read. With
``--api-key-env NAME`` (make local API_KEY=…; given again, another key) the ingress asks every request
for the key in that variable, as the cluster's does for ``ray_service.endpoint.api_key_secrets``,
and gives each key a prefix cache of its own under a cache-salt secret made for the run, as the
cluster's ``cache_isolation: per_key`` does.

The parts: ``paths`` (the run's files), ``ports``, ``leftovers``, ``assets`` (loopback S3),
``readiness``, ``shutdown``, ``cluster`` (the multi-node shape), ``lifecycle`` (processes, from
/proc) and ``ray_internals`` (every private Ray API used, in one place).
"""

from __future__ import annotations

import argparse
import faulthandler
import os
import secrets
import shutil
import signal
import time
from contextlib import ExitStack
from pathlib import Path

from cmdline import ArgumentParser
from local import leftovers, lifecycle, nixl_hook, ray_internals, shutdown
from local.errors import StartupFailure
from local.paths import (
    API_KEYS_DIR,
    CACHE_SALT_FILE,
    DEFAULT_SPEC,
    RAY_AUTH_TOKEN_FILE,
    ROOT,
    RUN_DIR,
    RUN_RECORD,
    STATUS_FILE,
    write_json,
    write_private,
)
from local.ports import check_ports, ports_to_bind
from local.readiness import wait_until_ready
from serve_app.spec import INGRESS_CPUS, PHASE_RESOURCE, PHASES, ServingSpec, load_spec

__all__ = [
    "DEFAULT_SPEC",
    "ROOT",
    "RUN_DIR",
    "RUN_RECORD",
    "STATUS_FILE",
    "StartupFailure",
    "cpus_needed",
    "local_spec",
    "main",
    "replica_map",
    "serve",
]

replica_map = ray_internals.serve_replicas


def local_spec(path: Path, mode: str | None, nixl_port_base: int | None = None) -> ServingSpec:
    """The spec with its model path made absolute (replicas do not share this cwd)."""
    spec = load_spec(str(path))
    data = spec.model_dump()
    source = Path(data["model"]["source"])
    data["model"]["source"] = str(source if source.is_absolute() else (ROOT / source).resolve())
    if mode:
        data["mode"] = mode
    if nixl_port_base:
        data["kv_transfer"]["side_channel_port_base"] = nixl_port_base
    return ServingSpec.model_validate(data)


def cpus_needed(spec: ServingSpec) -> int:
    phases = PHASES if spec.mode == "disaggregated" else ("colocated",)
    # A colocated app's ingress asks for a sliver of CPU beside the engines' bundles.
    ingress = INGRESS_CPUS if spec.mode == "colocated" else 0
    return max(2, int(sum(phase_cpus(spec, phase) for phase in phases) + ingress + 0.999))


def phase_cpus(spec: ServingSpec, phase: str) -> float:
    """The Ray CPUs a phase's replicas reserve at most: every replica up to max_replicas gets its bundles."""
    return sum(b["CPU"] for b in spec.placement_bundles(phase)) * spec.phase(phase).max_replicas


def serve(args: argparse.Namespace) -> int:
    parent = lifecycle.become_session_leader()
    # faulthandler writes from its C signal handler, without the GIL: it shows a run stuck where no
    # Python code can run, not even the shutdown's own threads.
    faulthandler.register(signal.SIGUSR1, all_threads=True)
    # And on a fatal signal (an abort in Ray's C++ among them), every thread's Python stack in the log.
    faulthandler.enable(all_threads=True)
    shutdown.install_signal_handlers()
    lifecycle.watch_parent(parent, shutdown.parent_gone)
    spec = local_spec(Path(args.spec), args.mode, args.nixl_port_base)
    started = time.monotonic()
    RUN_DIR.mkdir(parents=True, exist_ok=True)
    STATUS_FILE.unlink(missing_ok=True)
    code = 0
    with ExitStack() as resources:
        try:
            if args.gcs_fault_tolerance:
                from local.cluster import REDIS_MISSING, REDIS_SERVER

                if shutil.which(REDIS_SERVER) is None:
                    raise StartupFailure(REDIS_MISSING)
            stopped = leftovers.sweep(shutdown.say)
            ports = ports_to_bind(spec, args)
            check_ports(ports, stopped=stopped)
            # Recorded, and every child marked, before anything starts: a kill -9 from here on
            # leaves processes that the next start recognizes and stops.
            os.environ[lifecycle.RUN_MARKER] = lifecycle.run_mark()
            shutdown.track_shared_memory()
            # Before Ray starts, so every engine inherits it: NIXL's progress thread sleeps when idle.
            nixl_hook.enable(os.environ)
            write_json(
                RUN_RECORD,
                {
                    "pid": os.getpid(),
                    "mark": os.environ[lifecycle.RUN_MARKER],
                    "mode": spec.mode,
                    "ports": [p for p, _, _ in ports],
                    "started_at": time.time(),
                },
            )
            code = _run(spec, args, resources, started)
        except StartupFailure as exc:
            shutdown.say(f"local server: {exc}", error=True)
            code = 1
        except KeyboardInterrupt:
            shutdown.say("interrupted")
            code = 130
        finally:
            shutdown.shutdown()
            RUN_RECORD.unlink(missing_ok=True)
    return code


def _run(spec: ServingSpec, args: argparse.Namespace, resources: ExitStack, started: float) -> int:
    from ray import serve as ray_serve

    from local.assets import loopback_s3, published_code, streamed_model
    from local.tiny_model import ensure_tiny_model
    from serve_app.app import build_app
    from serve_app.serve_config import serve_config

    ensure_tiny_model(spec.model.source)
    asset_config = None
    if args.code_from_asset:
        from config.loader import load_config

        asset_config = load_config(args.code_from_asset)
    s3 = loopback_s3(resources, asset_config) if (asset_config or args.model_from_s3) else None
    if args.model_from_s3:
        spec = streamed_model(spec, s3)
    try:
        code_url = published_code(args.code_from_asset, asset_config, s3) if asset_config else None
    except RuntimeError as exc:  # synth or publish failed: say which, without a traceback
        raise StartupFailure(f"the code asset of {args.code_from_asset} could not be prepared: {exc}") from None
    if note := ray_internals.version_note():
        shutdown.say(note)
    api_keys = _api_keys(args)
    api_key = api_keys[0] if api_keys else None
    if api_keys:
        # The keyed ingress reads the keys from files of the run's, as in the cluster from the CSI mount,
        # and the cache-salt secret too, which the stack generates in the cluster.
        for index, key in enumerate(api_keys):
            write_private(API_KEYS_DIR / f"key-{index}", key)
        resources.callback(shutil.rmtree, API_KEYS_DIR, ignore_errors=True)
        write_private(CACHE_SALT_FILE, secrets.token_hex(32))
        resources.callback(CACHE_SALT_FILE.unlink, missing_ok=True)
        spec = spec.model_copy(update={"api_key_dir": str(API_KEYS_DIR), "cache_salt_file": str(CACHE_SALT_FILE)})
    cluster = _start_cluster(spec, args, resources) if (args.gcs_fault_tolerance or args.ray_cluster) else None
    if cluster is None:
        ray_internals.enable_token_auth()
        resources.callback(RAY_AUTH_TOKEN_FILE.unlink, missing_ok=True)
        # Ray detects GPUs itself; a cuda spec (the one-GPU check) then places engines on them.
        ray_internals.start_ray(
            num_cpus=cpus_needed(spec),
            resources={resource: 1 for resource in PHASE_RESOURCE.values()},
            metrics_export_port=args.metrics_port,
        )
    shutdown.install_signal_handlers()  # ray.init installs a SIGTERM handler of its own in the driver
    base_url = f"http://127.0.0.1:{args.port}/v1"
    metrics_url = f"http://127.0.0.1:{args.metrics_port}/metrics"
    if code_url:
        # As KubeRay does with serveConfigV2: Serve's controller builds the app from import_path
        # inside the runtime_env that fetches code_url.
        config = serve_config(spec, working_dir=code_url)
        config["http_options"].update(host="127.0.0.1", port=args.port)
        ray_internals.deploy_serve_config(config)
    elif cluster is not None:
        # A proxy on every node with a replica (the worker nodes, on --port) and on the head, on a
        # port of its own that no client uses (local/cluster.py).
        ray_serve.start(
            proxy_location="EveryNode",
            http_options={
                "host": "127.0.0.1",
                "port": cluster.head_proxy_port,
                "request_timeout_s": spec.request_timeout_s,
            },
        )
        ray_internals.submit_app(build_app(spec.model_dump(mode="json")), name=spec.app_name, route_prefix="/")
    else:
        ray_serve.start(
            http_options={"host": "127.0.0.1", "port": args.port, "request_timeout_s": spec.request_timeout_s}
        )
        # serve.run waits until the app is RUNNING, forever if a replica never gets there; this
        # returns once the app is submitted, and wait_until_ready watches it with a deadline.
        ray_internals.submit_app(build_app(spec.model_dump(mode="json")), name=spec.app_name, route_prefix="/")
    ready = wait_until_ready(spec, base_url, metrics_url, deadline=started + args.ready_timeout, api_key=api_key)
    ready_seconds = time.monotonic() - started
    models_seconds = ready["models_at"] - started
    through = "prefill and decode, KV over NIXL" if spec.mode == "disaggregated" else "the engine"
    shutdown.say(
        f"ready after {ready_seconds:.0f} s ({spec.mode}; a chat completion went through {through}; "
        f"/v1/models answered after {models_seconds:.0f} s): OpenAI base URL {base_url}"
    )
    while True:
        write_json(
            STATUS_FILE,
            {
                "pid": os.getpid(),
                "ready": True,
                "mode": spec.mode,
                "model": spec.model.model_id,
                "base_url": base_url,
                "metrics_url": metrics_url,
                "ready_seconds": round(ready_seconds, 1),
                "models_seconds": round(models_seconds, 1),
                "code": code_url or "this checkout",
                # Where the code asset lives (loopback S3), so that tools can publish a changed one.
                "code_endpoint": s3.endpoint if s3 else None,
                "model_source": spec.model.source,
                # Where the run's secrets are, never what they are: tools and tests read the files.
                "ray_auth_token_file": str(RAY_AUTH_TOKEN_FILE),
                "api_key_file": str(API_KEYS_DIR / "key-0") if api_key else None,
                "replicas": replica_map(),
                **({"cluster": cluster.status()} if cluster else {}),
            },
        )
        time.sleep(2)


def _api_keys(args: argparse.Namespace) -> list[str]:
    """The keys --api-key-env names (from the environment, so they never show in a process list)."""
    keys = []
    for name in args.api_key_env or []:
        key = os.environ.get(name, "").strip()
        if not key:
            raise StartupFailure(f"--api-key-env {name}: the variable is empty or not set; set it to the key")
        keys.append(key)
    return keys


def _start_cluster(spec: ServingSpec, args: argparse.Namespace, resources: ExitStack):
    """The cluster's shape (local/cluster.py), with this process a driver on the decode node."""
    from local.cluster import LocalCluster, free_port

    if spec.mode != "disaggregated":
        raise StartupFailure("--gcs-fault-tolerance and --ray-cluster run the disaggregated mode only")
    if args.code_from_asset:
        raise StartupFailure("--gcs-fault-tolerance and --ray-cluster serve this checkout (not --code-from-asset)")
    cluster = LocalCluster(
        resources={phase: {PHASE_RESOURCE[phase]: 1} for phase in PHASES},
        cpus={phase: max(1, int(phase_cpus(spec, phase) + 0.999)) for phase in PHASES},
        http_port=args.port,
        # The decode node exports on --metrics-port: the counters readiness and the tests read.
        metrics_ports={"head": free_port(), "prefill": free_port(), "decode": args.metrics_port},
        fault_tolerant=args.gcs_fault_tolerance,
        stopping=shutdown.stopping,
        say=shutdown.say,
    )
    resources.callback(cluster.forget)
    cluster.start()
    # On a worker node: the driver outlives the head (a driver dies with the raylet it is on).
    ray_internals.connect_driver(cluster.address, node_temp_dir=str(cluster.temp_dir("decode")))
    shutdown.say(
        f"ray: a head with no resources{' and GCS fault tolerance on Redis' if cluster.fault_tolerant else ''}, "
        f"worker nodes {', '.join(PHASES)} (GCS {cluster.address})"
    )
    return cluster


def main(argv: list[str] | None = None) -> int:
    parser = ArgumentParser(
        prog="python -m local.server", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--mode", choices=["disaggregated", "colocated"], default=None, help="serving mode (default: the spec's)"
    )
    parser.add_argument("--spec", default=str(DEFAULT_SPEC), help="local serving spec (default: config/local.yaml)")
    parser.add_argument("--port", type=int, default=8000, help="Serve's HTTP port on 127.0.0.1 (default: 8000)")
    parser.add_argument("--metrics-port", type=int, default=8085, help="Ray's metrics export port (default: 8085)")
    parser.add_argument(
        "--nixl-port-base",
        type=int,
        default=None,
        help="first NIXL side-channel port (prefill; decode +2000); default: the spec's kv_transfer.side_channel_port_base",
    )
    parser.add_argument(
        "--ready-timeout", type=float, default=600, help="seconds until the app must be ready (default: 600)"
    )
    parser.add_argument(
        "--model-from-s3",
        action="store_true",
        help="mirror the tiny model into a loopback S3 and let the engines stream it from there (runai_streamer)",
    )
    parser.add_argument(
        "--code-from-asset",
        metavar="CONFIG",
        help="serve serve_app from CONFIG's synthesized code asset, fetched by Ray from a loopback S3",
    )
    parser.add_argument(
        "--api-key-env",
        metavar="NAME",
        action="append",
        help=(
            "ask every request for the API key in the environment variable NAME (make local API_KEY=…); "
            "again for another key, each with a prefix cache of its own"
        ),
    )
    shape = parser.add_mutually_exclusive_group()
    shape.add_argument(
        "--gcs-fault-tolerance",
        action="store_true",
        help="the cluster's shape: a head with no resources, GCS fault tolerance on a loopback Redis "
        "(apt-get install redis-server), a worker node per phase",
    )
    shape.add_argument(
        "--ray-cluster",
        action="store_true",
        help="the same shape without GCS fault tolerance (a head restart restarts everything)",
    )
    return serve(parser.parse_args(argv))


if __name__ == "__main__":
    shutdown.exit_now(main())  # every process of the run is gone by now (shutdown.shutdown)
