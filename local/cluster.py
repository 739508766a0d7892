"""The cluster's shape on this machine: a Ray head with no resources, one worker node per phase,
and (``fault_tolerant``) GCS fault tolerance on a Redis server on loopback.

    python -m local.server --mode disaggregated --gcs-fault-tolerance    (make local HA=1)

What it starts, each with Ray's own ``ray start`` (public CLI) or Debian's ``redis-server``, each a
process of the run's session carrying the run mark (local/lifecycle.py), so the run stops them all:

- ``redis-server`` on a free 127.0.0.1 port, with a password generated for this run and handed
  over on stdin (never on a command line, never printed), no persistence (``--save ''``,
  ``--appendonly no``), its pidfile and dir under .local/run/redis;
- the head: ``ray start --head --block --num-cpus=0 --num-gpus=0`` with no phase resource, GCS fault
  tolerance on that Redis (``RAY_REDIS_ADDRESS``, ``--redis-password``, a storage namespace per run:
  what KubeRay sets from a RayService's ``gcsFaultToleranceOptions``), as the cluster's head;
- one worker node per phase, ``ray start --block --address=<head's GCS>`` with the phase's custom
  resource, as the cluster's worker groups advertise them.

A node whose ``ray start --block`` exits is started again, as the kubelet restarts a container
(``restartPolicy: Always``), at most RESTARTS times. That is what happens to the head on
Kubernetes when its GCS dies: ``ray start --block`` sees a process of the head exit, kills the
others and exits; the container restarts and runs ``ray start --head`` again, and with fault
tolerance the new GCS reads the cluster's state back from Redis while the worker nodes (and their
replicas) wait for it. Nothing in Ray outside KubeRay restarts a GCS. Each incarnation of the head
gets a temp dir of its own, as a restarted container starts with an empty /tmp: on one machine
``ray start --head`` otherwise refuses to start where a worker's raylet still names that GCS.

Every node uses 127.0.0.1 as its node address, and every port it is given is free on loopback;
note that Ray's own daemons (GCS, raylets, agents) listen on all interfaces whatever the node
address (Ray's behaviour, as for ``ray.init()``). Requests reach Serve through the worker nodes'
proxies, which share the HTTP port (SO_REUSEPORT, as Serve binds it): the head's proxy gets a port
of its own, out of that "Service", as KubeRay's ``excludeHeadPodFromServeSvc`` keeps the head out.
"""

from __future__ import annotations

import json
import os
import random
import secrets
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
import zlib
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from local import ray_internals
from local.errors import StartupFailure
from local.paths import RAY_AUTH_TOKEN_FILE, RUN_DIR

REDIS_SERVER = "redis-server"
REDIS_MISSING = "--gcs-fault-tolerance needs Redis: apt-get install redis-server (Debian's package)"
# How often a node that exited is started again before the run gives up on it.
RESTARTS = 5
# The object store of each node (the engines do not use it; Ray's default is 30% of memory each).
OBJECT_STORE_BYTES = 300 * 1024 * 1024
START_SECONDS = 60.0
# The nodes' Ray temp dirs (sessions, logs, sockets): short, as Unix socket paths must be, one per
# checkout (one run at a time uses it), kept after a run for its logs and cleared by the next.
TEMP_ROOT = Path(tempfile.gettempdir()) / f"pd-serving-ray-{zlib.crc32(str(RUN_DIR).encode()):08x}"


# The ports picked here are bound later, by processes started after the pick (the GCS, the head's
# Serve proxy, Redis, Ray's agents). One picked from the kernel's ephemeral range with bind(0) and let
# go is anyone's for their own bind(0) or connect() until then, and Ray's workers and agents bind that
# way while the cluster starts: once one of them took the head proxy's port. So they come from below
# that range, above Ray's worker ports (10002-19999) and NIXL's side channels (20000 and 22000, each
# plus a replica's offset).
STABLE_PORTS = range(24000, 32768)
EPHEMERAL_RANGE_FILE = Path("/proc/sys/net/ipv4/ip_local_port_range")
PORT_TRIES = 200


def ephemeral_low() -> int:
    """The first port of the kernel's ephemeral range (Linux's default where it cannot be read)."""
    try:
        return int(EPHEMERAL_RANGE_FILE.read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768


def free_port() -> int:
    """A loopback port free now, outside the ephemeral range where it can be (else any free one)."""
    candidates = [port for port in STABLE_PORTS if port < ephemeral_low()]
    for port in random.sample(candidates, min(PORT_TRIES, len(candidates))):
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
            try:
                probe.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def wait_for_port(port: int, timeout: float, alive: Callable[[], bool]) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and alive():
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
            probe.settimeout(1)
            if probe.connect_ex(("127.0.0.1", port)) == 0:
                return True
        time.sleep(0.3)
    return False


@dataclass
class Node:
    """One ``ray start --block`` (or redis-server) and how to start it again."""

    name: str
    argv: Callable[[], list[str]]
    env: dict[str, str]
    log: Path
    process: subprocess.Popen | None = None
    starts: int = 0
    exits: list[int | None] = field(default_factory=list)

    def start(self) -> None:
        self.starts += 1
        with open(self.log, "a") as log:
            log.write(f"\n--- start {self.starts} at {time.strftime('%H:%M:%S')}\n")
            log.flush()
            self.process = subprocess.Popen(
                self.argv(), cwd=RUN_DIR.parent.parent, stdout=log, stderr=subprocess.STDOUT, env=self.env
            )

    def alive(self) -> bool:
        return self.process is not None and self.process.poll() is None


@dataclass
class LocalCluster:
    resources: dict[str, dict[str, float]]  # worker node name -> its custom resources
    cpus: dict[str, int]  # worker node name -> its CPUs
    http_port: int  # the worker nodes' proxies (the "serve Service")
    metrics_ports: dict[str, int]  # node name -> Ray's metrics export port there
    fault_tolerant: bool
    stopping: Callable[[], bool]
    say: Callable[[str], None] = print
    gcs_port: int = 0
    head_proxy_port: int = 0
    dashboard_port: int = 0
    temp_root: Path = field(default_factory=lambda: TEMP_ROOT)
    nodes: dict[str, Node] = field(default_factory=dict)
    redis: Node | None = None
    restarts: list[dict] = field(default_factory=list)

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.gcs_port}"

    def temp_dir(self, name: str) -> Path:
        """A node's Ray temp dir; the head's is new at each start (see the module's docstring)."""
        count = self.nodes[name].starts if name in self.nodes else 1
        return self.temp_root / (f"{name}-{count}" if name == "head" else name)

    def start(self) -> None:
        if shutil.which(REDIS_SERVER) is None and self.fault_tolerant:
            raise StartupFailure(REDIS_MISSING)
        RUN_DIR.mkdir(parents=True, exist_ok=True)
        shutil.rmtree(self.temp_root, ignore_errors=True)
        for log in RUN_DIR.glob("ray-*.log"):
            log.unlink()
        self.gcs_port = free_port()
        self.head_proxy_port = free_port()
        self.dashboard_port = free_port()
        # Ray's token authentication, as KubeRay sets it up in every pod of the cluster.
        ray_internals.enable_token_auth()
        base_env = dict(os.environ)
        head_env = dict(base_env)
        head_args: list[str] = []
        if self.fault_tolerant:
            password = secrets.token_urlsafe(24)
            self._start_redis(password)
            head_env.update(ray_internals.gcs_fault_tolerance_env(self.redis_address, namespace=self.temp_root.name))
            head_args = ray_internals.redis_password_args(password)
        head_ports = {"client": free_port(), "agent": free_port()}
        self.nodes["head"] = Node(
            "head",
            lambda: [
                *self._ray_start("head", head_ports["agent"]),
                "--head",
                f"--port={self.gcs_port}",
                f"--ray-client-server-port={head_ports['client']}",
                "--num-cpus=0",
                "--num-gpus=0",
                # The dashboard, as on the cluster's head (its job and Serve APIs behind the token).
                "--include-dashboard=true",
                "--dashboard-host=127.0.0.1",
                f"--dashboard-port={self.dashboard_port}",
                *ray_internals.system_config_args(),
                *head_args,
            ],
            head_env,
            RUN_DIR / "ray-head.log",
        )
        self.nodes["head"].start()
        if not wait_for_port(self.gcs_port, START_SECONDS, self.nodes["head"].alive):
            raise StartupFailure(f"the Ray head did not start; see {self.nodes['head'].log}")
        for name, resources in self.resources.items():
            agent = free_port()
            env = {
                **base_env,
                ray_internals.WORKER_PROXY_HTTP_PORT_ENV: str(self.http_port),
            }
            self.nodes[name] = Node(
                name,
                lambda name=name, resources=resources, agent=agent: [
                    *self._ray_start(name, agent),
                    f"--address={self.address}",
                    f"--num-cpus={self.cpus[name]}",
                    f"--resources={json.dumps(resources)}",
                ],
                env,
                RUN_DIR / f"ray-{name}.log",
            )
            self.nodes[name].start()
        threading.Thread(target=self._supervise, name="node-supervisor", daemon=True).start()

    @property
    def redis_address(self) -> str:
        return f"127.0.0.1:{self.redis_port}"

    def _start_redis(self, password: str) -> None:
        self.redis_port = free_port()
        home = RUN_DIR / "redis"
        home.mkdir(parents=True, exist_ok=True)
        argv = [
            REDIS_SERVER,
            "-",  # the config file is stdin: it holds the password, which no command line shows
            *("--port", str(self.redis_port)),
            *("--bind", "127.0.0.1"),
            *("--protected-mode", "yes"),
            *("--save", ""),
            *("--appendonly", "no"),
            *("--dir", str(home)),
            *("--pidfile", str(home / "redis.pid")),
            *("--daemonize", "no"),
        ]
        log = open(RUN_DIR / "redis.log", "w")
        process = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=log, stderr=subprocess.STDOUT)
        assert process.stdin is not None
        process.stdin.write(f"requirepass {password}\n".encode())
        process.stdin.close()
        self.redis = Node("redis", lambda: argv, dict(os.environ), RUN_DIR / "redis.log", process, 1)
        if not wait_for_port(self.redis_port, 15, self.redis.alive):
            raise StartupFailure(f"redis-server did not start; see {RUN_DIR / 'redis.log'}")

    def _ray_start(self, name: str, agent_port: int) -> list[str]:
        return [
            sys.executable,
            "-m",
            "ray.scripts.scripts",
            "start",
            "--block",
            "--node-ip-address=127.0.0.1",
            f"--temp-dir={self.temp_dir(name)}",
            f"--dashboard-agent-listen-port={agent_port}",
            f"--metrics-export-port={self.metrics_ports[name]}",
            f"--object-store-memory={OBJECT_STORE_BYTES}",
            "--disable-usage-stats",
        ]

    def _supervise(self) -> None:
        """Starts a node again once its ``ray start --block`` exits (the kubelet's restart)."""
        while not self.stopping():
            for node in self.nodes.values():
                if node.alive() or self.stopping():
                    continue
                code = node.process.returncode if node.process else None
                node.exits.append(code)
                if node.starts > RESTARTS:
                    continue
                exited_at = time.time()
                self.say(f"ray node {node.name} exited ({code}); starting it again, as the kubelet would")
                node.start()
                self.restarts.append({"node": node.name, "exit_code": code, "at": exited_at})
            time.sleep(0.5)

    def forget(self) -> None:
        """Removes the run's Ray token once its processes are gone (the logs stay for a look)."""
        RAY_AUTH_TOKEN_FILE.unlink(missing_ok=True)

    def status(self) -> dict:
        return {
            "gcs_address": self.address,
            "gcs_fault_tolerance": self.fault_tolerant,
            "redis": self.redis_address if self.redis else None,
            "head_proxy_port": self.head_proxy_port,
            "dashboard_url": f"http://127.0.0.1:{self.dashboard_port}",
            "worker_proxy_port": self.http_port,
            "metrics_urls": {name: f"http://127.0.0.1:{port}/metrics" for name, port in self.metrics_ports.items()},
            "temp_dirs": {name: str(self.temp_dir(name)) for name in self.nodes},
            "node_starts": {name: node.starts for name, node in self.nodes.items()},
            "restarts": self.restarts,
        }
