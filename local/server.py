"""`make local`: serve serve_app on this CPU with a local Ray, until Ctrl-C.

    python -m local.server [--mode disaggregated|colocated] [--port 8000] [--metrics-port 8085]
                           [--nixl-port-base 20000] [--code-from-asset config/dev.yaml]

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
  says so in one line;
- it checks every port it will bind first and names the process in the way;
- the first Ctrl-C or SIGTERM stops it within 30 s at any moment, start-up included, with nothing
  left behind; a second one stops it at once;
- start-up is bounded: if the app is not ready within ``--ready-timeout``, or a replica dies on
  the way, it exits non-zero naming the deployment and the first error line of its replica log.

With ``--code-from-asset CONFIG`` the code comes the way the cluster gets it: the environment is
synthesized, the CDK CLI publishes its assets to an S3 server on loopback (moto), and Serve
deploys the application from a Serve config whose ``runtime_env.working_dir`` is the asset's
``s3://`` URI, so Ray's runtime_env agent downloads and unpacks the very zip `make deploy` uploads.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import sys
import threading
import time
import urllib.error
import urllib.request
from contextlib import ExitStack
from pathlib import Path

from local import lifecycle
from serve_app.spec import PHASE_RESOURCE, ServingSpec, load_spec

ROOT = Path(__file__).resolve().parent.parent
DEFAULT_SPEC = ROOT / "config" / "local.yaml"
RUN_DIR = ROOT / ".local" / "run"
STATUS_FILE = RUN_DIR / "status.json"
RUN_RECORD = RUN_DIR / "run.json"
SHUTDOWN_SECONDS = 20
LOCAL_MODEL_BUCKET = "local-models"


class StartupFailure(Exception):
    """The run cannot start or become ready; the message says what is wrong and what to do."""


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


def write_json(path: Path, data: dict) -> None:
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(data, indent=2))
    tmp.replace(path)


# --- before anything starts ----------------------------------------------------------------------


def ports_to_bind(spec: ServingSpec, args: argparse.Namespace) -> list[tuple[int, str, str]]:
    """(port, what binds it, the setting that moves it) for every fixed port of the run."""
    ports = [
        (args.port, "Serve's HTTP endpoint", "--port N (make local LOCAL_ARGS='--port N')"),
        (args.metrics_port, "Ray's metrics export", "--metrics-port N (make local LOCAL_ARGS='--metrics-port N')"),
    ]
    if spec.mode == "disaggregated":
        move = (
            "--nixl-port-base N (make local LOCAL_ARGS='--nixl-port-base N'; decode uses N+2000) or the spec's "
            "kv_transfer.side_channel_port_base"
        )
        for phase in ("prefill", "decode"):
            ports.append((spec.side_channel_port(phase), f"the {phase} engine's NIXL side channel", move))
    return ports


def check_ports(ports: list[tuple[int, str, str]]) -> None:
    for port, what, move in ports:
        if lifecycle.port_free(port):
            continue
        holder = lifecycle.port_holder(port)
        who = holder.describe() if holder else "a process this user cannot see"
        raise StartupFailure(f"port {port} ({what}) is in use by {who}; stop it, or move the port with {move}")


def sweep_leftovers() -> None:
    """Stops what earlier runs left behind (their server is gone), saying so in one line."""
    try:
        recorded = json.loads(RUN_RECORD.read_text()).get("mark")
    except (OSError, ValueError):
        recorded = None
    left = lifecycle.leftovers(recorded)
    if not left:
        return
    lifecycle.stop_processes([p.pid for p in left])
    names = ", ".join(p.describe() for p in left[:4]) + (f" and {len(left) - 4} more" if len(left) > 4 else "")
    print(f"stopped {len(left)} process(es) left by an earlier local run that did not shut down: {names}", flush=True)


# --- start-up and readiness ----------------------------------------------------------------------


def loopback_s3(stack: ExitStack, asset_config=None):
    """One S3-compatible server on loopback for whatever the run takes from S3 (code, weights), in
    the code asset's region (``asset_config``); this process and the Ray processes it starts are
    pointed at it."""
    from local.code_asset import LocalS3

    s3 = stack.enter_context(LocalS3(region=asset_config.aws.region) if asset_config else LocalS3())
    # The streamer's S3 client (AWS CRT) and its file listing (boto3) read these; moto wants path-style URLs.
    os.environ.update(s3.env, RUNAI_STREAMER_S3_USE_VIRTUAL_ADDRESSING="0")
    return s3


def published_code(config_path: str, config, s3) -> str:
    """Synthesizes ``config_path`` (loaded as ``config``) and publishes its assets to the loopback
    S3 with the CDK CLI; returns the working_dir the RayService would name."""
    from local.code_asset import bootstrap, publish_assets, synthesize, working_dir

    outdir = RUN_DIR / "asset-cdk.out"
    synthesize(Path(config_path).resolve(), outdir)
    bootstrap(s3, config.aws.account)
    publish_assets(s3, outdir)
    return working_dir(outdir, config.stack_name)


def streamed_model(spec: ServingSpec, s3) -> ServingSpec:
    """The tiny model mirrored into the loopback S3 by the mirror Job's own script; the spec then
    names its s3:// URI, which the engines stream with vLLM's Run:ai Model Streamer."""
    from mirror.job import mirror

    client = s3.client("s3")
    client.create_bucket(Bucket=LOCAL_MODEL_BUCKET, CreateBucketConfiguration={"LocationConstraint": s3.region})
    prefix = spec.model.model_id
    if mirror(bucket=LOCAL_MODEL_BUCKET, prefix=prefix, from_dir=Path(spec.model.source), s3=client, out=lambda _: None):
        raise StartupFailure("the tiny model could not be mirrored into the loopback S3")
    data = spec.model_dump()
    data["model"].update(source=f"s3://{LOCAL_MODEL_BUCKET}/{prefix}", load_format="runai_streamer")
    return ServingSpec.model_validate(data)


def deploy_from_serve_config(spec: ServingSpec, port: int, code_url: str) -> None:
    """Deploys the app from a Serve config, as KubeRay does with serveConfigV2: Serve's controller
    builds it from ``import_path`` inside the runtime_env that fetches ``code_url``."""
    from ray.serve._private import api as serve_api
    from ray.serve.schema import ServeDeploySchema

    from serve_app.serve_config import serve_config

    config = serve_config(spec, working_dir=code_url)
    config["http_options"].update(host="127.0.0.1", port=port)
    schema = ServeDeploySchema.model_validate(config)
    client = serve_api.serve_start(http_options=schema.http_options.model_dump())
    client.deploy_apps(schema)


def first_error_line(deployment: str) -> str | None:
    """The first error a replica of ``deployment`` logged: its Serve log, then its worker's stderr
    (where tracebacks of its threads, such as a ZMQ 'Address already in use', end up)."""
    import ray

    logs = Path(ray._private.worker.global_worker.node.get_session_dir_path()) / "logs"
    pattern = re.compile(r"(\b\w*(Error|Exception)\b:|\bTraceback\b|\bFAILED\b|Address already in use)")
    candidates = sorted((logs / "serve").glob(f"replica_*_{deployment.replace('/', '_')}_*.log"))
    for out in logs.glob("worker-*.out"):
        try:
            with open(out, errors="replace") as log:
                head = log.read(400)
        except OSError:
            continue
        if "ServeReplica:" in head and f":{deployment}" in head:
            candidates.append(out.with_suffix(".err"))
    for path in candidates:
        try:
            lines = path.read_text(errors="replace").splitlines()
        except OSError:
            continue
        hits = [line.strip() for line in lines if pattern.search(line) and "Traceback" not in line]
        if hits:
            return hits[0][:300]
    return None


def unhealthy_deployments(app_name: str) -> tuple[list[str], list[str]]:
    """(failed, not yet healthy) deployments of the app, each 'name (status: message)'."""
    from ray import serve

    status = serve.status().applications.get(app_name)
    if status is None:
        return [], [f"application {app_name} (not deployed yet)"]
    failed, pending = [], []
    app_state = str(status.status).rsplit(".", 1)[-1]
    if app_state == "DEPLOY_FAILED" and not status.deployments:
        failed.append(f"application {app_name} ({status.message.strip().splitlines()[0] if status.message else 'deploy failed'})")
    elif app_state != "RUNNING" and not status.deployments:
        pending.append(f"application {app_name} ({app_state})")
    for name, deployment in status.deployments.items():
        state = str(deployment.status).rsplit(".", 1)[-1]
        if state == "HEALTHY":
            continue
        line = f"{name} ({state}{': ' + deployment.message.strip().splitlines()[0] if deployment.message else ''})"
        (failed if state in ("UNHEALTHY", "DEPLOY_FAILED") else pending).append(line)
    return failed, pending


def models_listed(base_url: str) -> bool:
    try:
        with urllib.request.urlopen(f"{base_url}/models", timeout=5) as response:
            return bool(json.loads(response.read())["data"])
    except (urllib.error.URLError, OSError, ValueError, KeyError):
        return False


def chat_once(base_url: str, model: str, timeout: float) -> str | None:
    """None if one chat completion succeeds, else what went wrong."""
    body = json.dumps({
        "model": model,
        "messages": [{"role": "user", "content": f"ready check {time.time_ns()}"}],
        "max_tokens": 2,
        "temperature": 0,
    }).encode()
    request = urllib.request.Request(
        f"{base_url}/chat/completions", data=body, headers={"Content-Type": "application/json"}
    )
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            return None if json.loads(response.read())["choices"] else "an answer without choices"
    except urllib.error.HTTPError as exc:
        return f"HTTP {exc.code}"
    except (urllib.error.URLError, OSError, ValueError, KeyError) as exc:
        return str(exc)


def kv_arrived(metrics_url: str, before: dict, timeout: float = 20) -> bool:
    """Whether decode took a prompt's KV over NIXL since ``before`` (vLLM's per-engine counters)."""
    from local.metrics import PROMPT_TOKENS_BY_SOURCE, counter_delta, engine_counters, scrape

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        after = engine_counters(scrape(metrics_url), replica_map())
        if counter_delta(before, after, "Decode", PROMPT_TOKENS_BY_SOURCE, "external_kv_transfer") > 0:
            return True
        time.sleep(1)
    return False


def wait_until_ready(spec: ServingSpec, base_url: str, metrics_url: str, deadline: float) -> dict:
    """Returns once one chat completion went through the app (and, P/D, its KV through NIXL)."""
    from local.metrics import engine_counters, scrape

    models_at, last = None, "no deployment healthy yet"
    while True:
        if models_at is None and models_listed(base_url):
            models_at = time.monotonic()  # what a client polling /v1/models would take for "up"
        failed, pending = unhealthy_deployments(spec.app_name)
        if failed:
            raise StartupFailure(_failure("failed during start-up", failed))
        if time.monotonic() > deadline:
            if pending:
                raise StartupFailure(_failure("is not ready within the ready timeout", pending))
            raise StartupFailure(
                f"every deployment is healthy, but no chat completion went through within the ready timeout "
                f"(last attempt: {last})"
            )
        if not pending:
            before = engine_counters(scrape(metrics_url), replica_map()) if spec.mode == "disaggregated" else {}
            last = chat_once(base_url, spec.model.model_id, timeout=spec.request_timeout_s + 5)
            if last is None:
                if spec.mode != "disaggregated" or kv_arrived(metrics_url, before):
                    return {"models_at": models_at or time.monotonic()}
                last = "the completion succeeded, but decode took no KV over NIXL (it computed the prompt itself)"
        time.sleep(1)


def _failure(what: str, deployments: list[str]) -> str:
    lines = []
    for entry in deployments:
        name = entry.split(" (", 1)[0]
        error = first_error_line(name) if not name.startswith("application") else None
        lines.append(f"  {entry}" + (f"\n    first error in its replica log: {error}" if error else ""))
    return f"the Serve app {what}:\n" + "\n".join(lines)


# --- stopping ------------------------------------------------------------------------------------

_signals_seen = 0


def _on_signal(signum, _frame):
    """First SIGINT/SIGTERM: unwind (KeyboardInterrupt) into the bounded shutdown. Second: stop now."""
    global _signals_seen
    _signals_seen += 1
    if _signals_seen == 1:
        raise KeyboardInterrupt
    _stop_now()


def _stop_now() -> None:
    lifecycle.stop_processes(lifecycle.run_processes(lifecycle.run_mark()), grace=0)
    os._exit(130)


def install_signal_handlers() -> None:
    for signum in (signal.SIGINT, signal.SIGTERM):
        signal.signal(signum, _on_signal)


def shutdown(timeout: float = SHUTDOWN_SECONDS) -> None:
    """Serve and Ray shut down cleanly if they can within ``timeout``; then every process this run
    started that is still there is stopped, so nothing outlives the server."""
    global _signals_seen
    _signals_seen = max(_signals_seen, 1)  # a signal from here on means "stop now"

    def graceful():
        try:
            import ray
            from ray import serve

            if ray.is_initialized():
                try:
                    serve.shutdown()
                finally:
                    ray.shutdown()
        except Exception as exc:  # noqa: BLE001 - whatever is left is stopped below
            print(f"clean shutdown failed ({exc}); stopping the run's processes", flush=True)

    worker = threading.Thread(target=graceful, daemon=True)
    worker.start()
    worker.join(timeout)
    lifecycle.stop_processes(lifecycle.run_processes(lifecycle.run_mark()), grace=3)


# --- the run ---------------------------------------------------------------------------------------


def serve(args: argparse.Namespace) -> int:
    lifecycle.become_session_leader()
    install_signal_handlers()
    spec = local_spec(Path(args.spec), args.mode, args.nixl_port_base)
    started = time.monotonic()
    RUN_DIR.mkdir(parents=True, exist_ok=True)
    STATUS_FILE.unlink(missing_ok=True)
    code = 0
    with ExitStack() as resources:
        try:
            sweep_leftovers()
            ports = ports_to_bind(spec, args)
            check_ports(ports)
            # Recorded, and every child marked, before anything starts: a kill -9 from here on
            # leaves processes that the next start recognizes and stops.
            os.environ[lifecycle.RUN_MARKER] = lifecycle.run_mark()
            write_json(RUN_RECORD, {
                "pid": os.getpid(), "mark": os.environ[lifecycle.RUN_MARKER], "mode": spec.mode,
                "ports": [p for p, _, _ in ports], "started_at": time.time(),
            })
            code = _run(spec, args, resources, started)
        except StartupFailure as exc:
            print(f"local server: {exc}", file=sys.stderr, flush=True)
            code = 1
        except KeyboardInterrupt:
            print("interrupted", flush=True)
            code = 130
        finally:
            print("shutting down", flush=True)
            STATUS_FILE.unlink(missing_ok=True)
            shutdown()
            RUN_RECORD.unlink(missing_ok=True)
    return code


def _run(spec: ServingSpec, args: argparse.Namespace, resources: ExitStack, started: float) -> int:
    import ray
    from ray import serve as ray_serve
    from ray.serve import api as serve_api

    from local.tiny_model import ensure_tiny_model
    from serve_app.app import build_app

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
    # Ray detects GPUs itself; a cuda spec (the one-GPU check) then places engines on them.
    ray.init(
        num_cpus=cpus_needed(spec),
        resources={resource: 1 for resource in PHASE_RESOURCE.values()},
        include_dashboard=False,
        _metrics_export_port=args.metrics_port,
        _system_config={"metrics_report_interval_ms": 1000},
        logging_level="WARNING",
    )
    install_signal_handlers()  # ray.init installs a SIGTERM handler of its own in the driver
    base_url = f"http://127.0.0.1:{args.port}/v1"
    metrics_url = f"http://127.0.0.1:{args.metrics_port}/metrics"
    if code_url:
        deploy_from_serve_config(spec, args.port, code_url)
    else:
        ray_serve.start(
            http_options={"host": "127.0.0.1", "port": args.port, "request_timeout_s": spec.request_timeout_s}
        )
        # serve.run waits until the app is RUNNING, forever if a replica never gets there; this
        # returns once the app is submitted, and wait_until_ready watches it with a deadline.
        serve_api._run(build_app(spec.model_dump(mode="json")), _blocking=False, name=spec.app_name, route_prefix="/")
    ready = wait_until_ready(spec, base_url, metrics_url, deadline=started + args.ready_timeout)
    ready_seconds = time.monotonic() - started
    models_seconds = ready["models_at"] - started
    through = "prefill and decode, KV over NIXL" if spec.mode == "disaggregated" else "the engine"
    print(
        f"ready after {ready_seconds:.0f} s ({spec.mode}; a chat completion went through {through}; "
        f"/v1/models answered after {models_seconds:.0f} s): OpenAI base URL {base_url}",
        flush=True,
    )
    while True:
        write_json(STATUS_FILE, {
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
            "replicas": replica_map(),
        })
        time.sleep(2)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--mode", choices=["disaggregated", "colocated"], default=None)
    parser.add_argument("--spec", default=str(DEFAULT_SPEC))
    parser.add_argument("--port", type=int, default=8000)
    parser.add_argument("--metrics-port", type=int, default=8085)
    parser.add_argument(
        "--nixl-port-base", type=int, default=None,
        help="first NIXL side-channel port (prefill; decode +2000); default: the spec's kv_transfer.side_channel_port_base",
    )
    parser.add_argument("--ready-timeout", type=float, default=600)
    parser.add_argument(
        "--model-from-s3", action="store_true",
        help="mirror the tiny model into a loopback S3 and let the engines stream it from there (runai_streamer)",
    )
    parser.add_argument(
        "--code-from-asset", metavar="CONFIG",
        help="serve serve_app from CONFIG's synthesized code asset, fetched by Ray from a loopback S3",
    )
    return serve(parser.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
