"""Every private Ray API that the local run touches, and nothing else.

Each one below is private to Ray: undocumented, outside Ray's compatibility promise, and free to
change in any release, patch releases included. Each was checked against the serving image's Ray
(:data:`CHECKED_AGAINST`, which requirements-serve.txt pins), and each is an entry of
serve_app/upstream.py, which the tests resolve on the installed Ray. After a Ray upgrade, check each
one against the new release (the server prints a one-line note when it runs on another version):

``start_ray``
    ``ray.init``'s private keyword arguments ``_metrics_export_port`` (the fixed port of Ray's
    Prometheus export, which the tests, the benchmarks and `make verify` scrape) and
    ``_system_config={"metrics_report_interval_ms": ...}`` (the engines' counters reach the export
    within a second). ``ray.init`` also installs a SIGTERM handler of its own in the driver
    (``ray/_private/worker.py``, ``sigterm_handler``); the caller installs its handlers again after.
``shutdown_ray``
    ``ray._private.worker._global_node``, the node a ``ray.init`` in this process started, set before
    the driver connects: a start interrupted after it (Ctrl-C during start-up) has Ray's processes
    and, possibly, the driver's core worker, yet ``ray.is_initialized()`` is False.
``submit_app``
    ``ray.serve.api._run(..., _blocking=False)``: ``serve.run`` without waiting for the app to be
    RUNNING (``serve.run`` waits forever when a replica never gets there).
``deploy_serve_config``
    ``ray.serve._private.api.serve_start`` and the controller client's ``deploy_apps``
    (``ray/serve/_private/client.py``): what ``serve deploy`` does with a Serve config, and KubeRay
    with a RayService's serveConfigV2, done in this process.
``serve_replicas``
    The names Serve gives its replica actors, ``SERVE_REPLICA::<app>#<deployment>#<replica id>``
    (``ray/serve/_private/common.py``, ``REPLICA_ID_FULL_ID_STR_PREFIX``): the replica ids that the
    engines' metrics are labelled with. Listed with the public ``ray.util.list_named_actors``.
``replica_process_title``
    The process title of a replica's worker, ``ServeReplica:<app>:<deployment>``
    (``ray/serve/_private/common.py``, ``DeploymentID.to_replica_actor_class_name``).
``replica_log_files``
    ``ray._private.worker.global_worker.node.get_session_dir_path()``, and the layout of a session's
    logs: Serve's ``logs/serve/replica_<app>_<deployment>_<id>.log``, and the workers'
    ``logs/worker-*.out`` / ``.err``, whose first lines name the actor the worker runs.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

from serve_app.upstream import READ_AT

CHECKED_AGAINST = READ_AT["ray"]
REPLICA_ACTOR_PREFIX = "SERVE_REPLICA::"


def version_note() -> str | None:
    """A line to print when the installed Ray is not the one these were checked against."""
    import ray

    if ray.__version__ == CHECKED_AGAINST:
        return None
    return (
        f"note: local/ray_internals.py uses private Ray APIs checked against Ray {CHECKED_AGAINST}; "
        f"this is Ray {ray.__version__}"
    )


def enable_token_auth() -> None:
    """Ray's token authentication for this process and every one it starts (public: RAY_AUTH_MODE,
    RAY_AUTH_TOKEN_PATH), with a new token of this run's: as KubeRay's authOptions do in the cluster,
    rather than Ray's default for a local ray.init(), which keeps one in ~/.ray/auth_token."""
    import secrets

    from local.paths import RAY_AUTH_TOKEN_FILE, write_private

    write_private(RAY_AUTH_TOKEN_FILE, secrets.token_hex(32))
    os.environ.update(RAY_AUTH_MODE="token", RAY_AUTH_TOKEN_PATH=str(RAY_AUTH_TOKEN_FILE))
    if "ray" in sys.modules:
        # Ray reads RAY_AUTH_MODE into its cached config at import
        # (ray/_private/authentication/authentication_token_setup.py refreshes it the same way).
        from ray._raylet import Config

        Config.initialize("")


def start_ray(
    *, num_cpus: int, resources: dict[str, float], metrics_export_port: int, metrics_report_interval_ms: int = 1000
) -> None:
    """A local Ray for this process, without a dashboard, exporting metrics on a fixed port."""
    import ray

    ray.init(
        # A new Ray of its own even where a `ray start` left its address in /tmp/ray/ray_current_cluster,
        # which a bare ray.init() would try to join.
        address="local",
        num_cpus=num_cpus,
        resources=resources,
        include_dashboard=False,
        _metrics_export_port=metrics_export_port,
        _system_config={"metrics_report_interval_ms": metrics_report_interval_ms},
        logging_level="WARNING",
    )


def shutdown_ray() -> None:
    """Serve, then Ray, shut down from this process, a start that was interrupted included. Ray's
    shutdown destroys the driver's core worker before it stops the node's processes, because the
    core worker's IO thread does not survive them going first (ray/_private/worker.py, shutdown);
    an interrupted start needs that as much as a finished one."""
    import ray
    from ray import serve
    from ray._private import worker

    if ray.is_initialized():
        try:
            serve.shutdown()
        finally:
            ray.shutdown()
    elif worker._global_node is not None:
        ray.shutdown()  # not serve.shutdown(): without a connected driver it would start a Ray of its own


def submit_app(app, *, name: str, route_prefix: str = "/") -> None:
    """Submits a Serve application and returns without waiting for it to be RUNNING."""
    from ray.serve import api as serve_api

    serve_api._run(app, _blocking=False, name=name, route_prefix=route_prefix)


def deploy_serve_config(config: dict) -> None:
    """Deploys the applications of a Serve config (a dict, as serveConfigV2 holds it): Serve's
    controller builds each from its ``import_path`` inside its ``runtime_env``."""
    from ray.serve._private import api as serve_api
    from ray.serve.schema import ServeDeploySchema

    schema = ServeDeploySchema.model_validate(config)
    client = serve_api.serve_start(http_options=schema.http_options.model_dump())
    client.deploy_apps(schema)


def serve_replicas() -> dict[str, str]:
    """Serve replica id -> deployment name, from the replica actors' names (no dashboard needed)."""
    import ray

    replicas = {}
    for actor in ray.util.list_named_actors(all_namespaces=True):
        name = actor["name"] if isinstance(actor, dict) else actor
        if name.startswith(REPLICA_ACTOR_PREFIX):
            _app, deployment, replica_id = name[len(REPLICA_ACTOR_PREFIX) :].split("#")
            replicas[replica_id] = deployment
    return replicas


def replica_process_title(app: str, deployment: str) -> str:
    """What the process of a replica of ``deployment`` shows as its command line (its start)."""
    return f"ServeReplica:{app}:{deployment}"


def replica_log_files(deployment: str) -> list[Path]:
    """Where the replicas of ``deployment`` (in the Ray session this process is connected to) log:
    their Serve logs, then the stderr of their workers (where tracebacks of a replica's threads,
    such as ZMQ's 'Address already in use', end up)."""
    import ray

    logs = Path(ray._private.worker.global_worker.node.get_session_dir_path()) / "logs"
    files = sorted((logs / "serve").glob(f"replica_*_{deployment.replace('/', '_')}_*.log"))
    for out in logs.glob("worker-*.out"):
        try:
            with open(out, errors="replace") as log:
                head = log.read(400)
        except OSError:
            continue
        if "ServeReplica:" in head and f":{deployment}" in head:
            files.append(out.with_suffix(".err"))
    return files


# --- the cluster's shape on this machine (local/cluster.py) ----------------------------------------
# ``ray start`` itself is public; these parts of it are not, or not quite:
#
# - ``--redis-password`` is a hidden flag of ``ray start`` (ray/scripts/scripts.py), though Ray's
#   and KubeRay's GCS fault tolerance docs use it; Ray hands it to gcs_server on its command line.
# - ``RAY_external_storage_namespace``: Ray's system config read from the environment (what
#   KubeRay sets from the RayCluster's uid), so that two clusters on one Redis keep apart.
# - ``--system-config`` is a hidden flag (JSON of Ray's private system config).
# - ``RAY_SERVE_WORKER_PROXY_HTTP_PORT`` (ray/serve/_private/constants.py, read by the proxy in
#   ray/serve/_private/proxy.py, apply_per_node_port_overrides): the HTTP port a worker node's
#   Serve proxy binds instead of http_options.port; the head's proxy keeps http_options.port.
# - ``ray.init(_temp_dir=...)``: with several nodes on one machine the driver attaches to the head's
#   raylet unless a temp dir names another node (ray/_private/services.py,
#   get_node_to_connect_for_driver); a driver whose raylet dies dies with it. And
#   ``ray._raylet.Config.initialize("")``, which rereads RAY_AUTH_MODE after Ray was imported.

WORKER_PROXY_HTTP_PORT_ENV = "RAY_SERVE_WORKER_PROXY_HTTP_PORT"


def redis_password_args(password: str) -> list[str]:
    return [f"--redis-password={password}"]


def gcs_fault_tolerance_env(redis_address: str, *, namespace: str) -> dict[str, str]:
    """The head's environment for GCS fault tolerance on an external Redis (``RAY_REDIS_ADDRESS`` is
    public; the namespace is Ray's system config, as KubeRay sets it)."""
    return {"RAY_REDIS_ADDRESS": redis_address, "RAY_external_storage_namespace": namespace}


def system_config_args(metrics_report_interval_ms: int = 1000) -> list[str]:
    """The head's private system config (see start_ray): engine counters within a second."""
    import json

    return [f"--system-config={json.dumps({'metrics_report_interval_ms': metrics_report_interval_ms})}"]


def connect_driver(address: str, *, node_temp_dir: str) -> None:
    """This process as a driver of the cluster at ``address``, attached to the node whose Ray temp
    dir is ``node_temp_dir`` (a worker node: it outlives a head restart)."""
    import ray
    from ray._raylet import Config

    # Ray reads RAY_AUTH_MODE into its cached config at import; the cluster set it since
    # (ray/_private/authentication/authentication_token_setup.py refreshes it the same way).
    Config.initialize("")
    ray.init(address=address, _temp_dir=node_temp_dir, logging_level="WARNING")


def serve_controller_logs(node_temp_dir: str) -> list[Path]:
    """The Serve controller's logs in a node's Ray temp dir (the layout replica_log_files reads:
    ``session_latest/logs/serve/controller_<pid>.log``)."""
    return sorted((Path(node_temp_dir) / "session_latest" / "logs" / "serve").glob("controller_*.log"))
