"""Live local servers for the tests in tests/local, and the helpers those tests share.

Starting a server is most of what these tests cost, so tests that can share one do: a shared server
is named by what it is started with (``LIVE_SERVERS``), at most one runs at a time (two would share
this machine's cores), and it stays up for as long as the tests that use it run one after the
other. ``ORDER`` makes sure they do: the colocated server's tests; the kill -9 test, whose "next
start" is the disaggregated server; the disaggregated server's tests (the streaming ones first:
they only read, while the disaggregated module kills a replica and rolls the app out; the P/D half
of the parity sweep among them, its colocated half beside the colocated tests); then the
life-cycle tests, which start servers of their own and stop any shared one first.
"""

from __future__ import annotations

import json
import time

import pytest

from tests.conftest import CONFIG_DIR, ROOT

# What each shared server is started with; every server proves, once stopped, that it left nothing
# (no process, no shared-memory segment its processes mapped).
LIVE_SERVERS = {
    "colocated": dict(mode="colocated", port=8001, metrics_port=8086),
    # The code comes as the cluster gets it: dev's synthesized asset, published by the CDK CLI to a
    # loopback S3 and fetched by Ray from the s3:// working_dir (local/code_asset.py); the weights
    # too, streamed from that S3 by vLLM's Run:ai Model Streamer (tests/local/test_local_streaming.py).
    "disaggregated": dict(
        mode="disaggregated",
        port=8000,
        metrics_port=8085,
        code_from_asset=CONFIG_DIR / "dev.yaml",
        extra_args=["--model-from-s3"],
    ),
    # The cluster's shape: a head with no resources, a worker node per phase, and GCS fault tolerance
    # on a loopback Redis (local/cluster.py); then the same shape without it.
    # It also asks every request for an API key (tests/local/test_local_security.py): the others
    # ask for none, so the suite serves both ways.
    "gcs-fault-tolerant": dict(
        mode="disaggregated",
        port=8000,
        metrics_port=8085,
        extra_args=["--gcs-fault-tolerance"],
        api_key="sk-local-" + "5f0c" * 8,
        # A second tenant (tests/local/test_local_security.py: one prefix cache per key).
        other_api_keys=("sk-local-" + "9e2b" * 8,),
    ),
    # The same shape without fault tolerance, with two decode replicas behind session affinity
    # (tests/local/test_local_session_affinity.py): the one shared server with two replicas of a phase.
    "ray-cluster": dict(
        mode="disaggregated",
        port=8000,
        metrics_port=8085,
        extra_args=["--ray-cluster"],
        spec_changes={"decode": {"min_replicas": 2, "max_replicas": 2, "request_router": "session_affinity"}},
    ),
}
# The order the tests run in (a test's node id ends with one of these): each shared server's tests
# together, and the kill -9 test right before the disaggregated server's, as that server is its
# "next start". Tests named nowhere here run first, in the order they were collected.
ORDER = [
    "test_local_processes.py",
    "test_local_colocated.py",
    "test_local_parity.py::test_colocated_answers_are_recorded",
    "test_local_lifecycle.py::test_after_a_kill_9_the_next_start_cleans_up_and_serves",
    "test_local_streaming.py",
    "test_local_parity.py",
    "test_local_disaggregated.py",
    "test_local_security.py",
    "test_local_gcs_fault_tolerance.py",
    "test_local_session_affinity.py",
    "test_local_gcs_fault_tolerance.py::test_without_fault_tolerance_the_same_kill_costs_the_engines",
    "test_local_lifecycle.py",
]


def pytest_collection_modifyitems(session, config, items):
    """Sorts the tests by ORDER (stable: within an entry, they keep the order they were collected in)."""

    def rank(item):
        tail = item.nodeid.rsplit("/", 1)[-1]  # e.g. test_local_lifecycle.py::test_x[param]
        matching = [i for i, entry in enumerate(ORDER) if tail == entry or tail.startswith((entry + "::", entry + "["))]
        return max(matching, key=lambda i: len(ORDER[i])) if matching else -1

    items.sort(key=rank)


class SharedServers:
    """At most one live server at a time, reused by every test that asks for the same one."""

    def __init__(self):
        self.name: str | None = None
        self.server = None

    def get(self, name: str):
        if self.name != name:
            self.stop()
            from local.harness import LocalServer

            settings = dict(LIVE_SERVERS[name])
            extra = settings.pop("extra_args", [])
            if changes := settings.pop("spec_changes", None):
                settings["spec"] = changed_local_spec(name, changes)
            self.server = LocalServer(**settings, extra_args=list(extra)).start()
            self.name = name
        assert self.server.process.poll() is None, f"the {name} server exited:\n{self.server.log_tail()}"
        return self.server

    def stop(self) -> None:
        from local.harness import session_processes
        from local.lifecycle import shared_memory_of

        running, self.server, self.name = self.server, None, None
        if running is None:
            return
        session = running.process.pid
        mapped = shared_memory_of(session_processes(session))
        running.stop()
        assert session_processes(session) == [], "the local server left processes behind"
        left = sorted(str(segment) for segment in mapped if segment.exists())
        assert not left, f"the local server left shared memory behind: {', '.join(left)}"


def changed_local_spec(name: str, changes: dict[str, dict]):
    """config/local.yaml with each phase's ``changes``, written where the local server's runs live."""
    import yaml

    from local.paths import DEFAULT_SPEC, RUN_DIR
    from serve_app.spec import load_spec

    data = load_spec(str(DEFAULT_SPEC)).model_dump(mode="json")
    for phase, fields in changes.items():
        data[phase].update(fields)
    RUN_DIR.mkdir(parents=True, exist_ok=True)
    path = RUN_DIR / f"spec-{name}.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


@pytest.fixture(scope="session")
def shared_servers():
    servers = SharedServers()
    try:
        yield servers
    finally:
        servers.stop()


@pytest.fixture(scope="session")
def parity_answers() -> dict:
    """The colocated server's answers, which the P/D server's must equal (test_local_parity.py)."""
    return {}


@pytest.fixture(scope="session")
def bench_rows() -> dict:
    """Benchmark rows of each local mode, so the last module can put them side by side."""
    return {}


def openai_client(server):
    import openai

    return openai.OpenAI(base_url=server.base_url, api_key=server.api_key or "unused", timeout=120, max_retries=0)


def unique_prompt(tag: str, length: int = 100) -> str:
    """A prompt of ``length`` tokens for the tiny model (byte-level: an ASCII character is a token)
    that no earlier prompt shares a prefix with."""
    return (f"{tag} {time.time_ns()} " + "the quick brown fox jumps over the lazy dog " * 10)[:length]


def wait_for_counters(server, before, deployment, metric, source, at_least, timeout=30):
    """The server's counters once ``metric`` (``source``) of ``deployment`` grew by ``at_least``
    since ``before``, or at ``timeout``: Ray exports engine counters on an interval."""
    from local.metrics import counter_delta

    deadline = time.monotonic() + timeout
    while True:
        after = server.counters()
        if counter_delta(before, after, deployment, metric, source) >= at_least or time.monotonic() > deadline:
            return after
        time.sleep(1)


def report_measurement(name: str, data: dict) -> None:
    """Writes a measured number for the record (results/local-tests/); tests never assert timings."""
    out = ROOT / "results" / "local-tests"
    out.mkdir(parents=True, exist_ok=True)
    (out / f"{name}.json").write_text(json.dumps(data, indent=2))
    print(f"\n{name}: {json.dumps(data)}")


def measure_one_request(server, client, model: str) -> dict:
    started = time.monotonic()
    response = client.completions.create(
        model=model, prompt="m" * 100, max_tokens=8, temperature=0, extra_body={"ignore_eos": True}
    )
    return {
        "ready_seconds": server.status["ready_seconds"],
        "models_listed_seconds": server.status["models_seconds"],
        "one_request_seconds": round(time.monotonic() - started, 3),
        "prompt_tokens": response.usage.prompt_tokens,
        "completion_tokens": response.usage.completion_tokens,
    }
