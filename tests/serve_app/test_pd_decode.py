"""Decode's start with prefill late (serve_app/pd_decode.py), in a real Ray Serve: Ray Serve LLM's own
``PDDecodeServer`` and ``PDPrefillServer`` classes, constructed by Serve from the local spec's
LLMConfigs, with an engine that only answers (no model: the engine is not what is tested) and a
prefill whose constructor waits until the test lets it finish, as one waits for a node.

Ray's retry constants are shortened in each replica (60 x 5 s, each try waiting 30 s for a prefill
replica, would take up to 35 minutes): the behaviour is the same, sooner."""

from __future__ import annotations

import multiprocessing
import os
import sys
import time
from pathlib import Path
from typing import Any

import pytest

ray = pytest.importorskip("ray", reason="the serving stack (requirements-serve.txt) is not installed")
pytestmark = pytest.mark.serving

from ray.llm._internal.serve.core.configs.openai_api_models import ErrorInfo, ErrorResponse  # noqa: E402
from ray.llm._internal.serve.core.engine.protocol import LLMEngine  # noqa: E402
from ray.llm._internal.serve.serving_patterns.prefill_decode.pd_server import (  # noqa: E402
    DPPDDecodeServer,
    PDDecodeServer,
    PDPrefillServer,
)

from local.ray_internals import submit_app  # noqa: E402
from serve_app.pd_decode import (  # noqa: E402
    BackgroundPrewarmDPPDDecodeServer,
    BackgroundPrewarmPDDecodeServer,
    OneTokenPrefillPDDecodeServer,
)

# The replicas get this module's classes by value: pytest imports it from a path Ray's workers lack.
ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])

KV_PARAMS = {"remote_engine_id": "prefill-0", "remote_block_ids": [1, 2], "remote_host": "127.0.0.1"}
# A prompt with one of these makes prefill's engine answer with that HTTP status, as vLLM's does when
# its engine died (500) or when it refuses a request (400).
PREFILL_ERRORS = {"prefill-engine-died": 500, "prefill-refuses": 400}


class Chunk:
    def __init__(self, kv_transfer_params: dict[str, Any]) -> None:
        self.kv_transfer_params = kv_transfer_params


class AnsweringEngine(LLMEngine):
    """Sets up the KV connector's backend as vLLM's engine does, then answers every completion
    with one chunk; remembers the KV parameters decode was asked to pull."""

    def __init__(self, llm_config) -> None:
        self.llm_config = llm_config
        self.pulled: list[dict[str, Any]] = []

    async def start(self) -> None:
        self.llm_config.setup_engine_backend()

    async def completions(self, request, raw_request_info=None):
        if request.kv_transfer_params and request.kv_transfer_params.get("do_remote_decode"):
            for marker, code in PREFILL_ERRORS.items():
                if marker in str(request.prompt):
                    yield ErrorResponse(error=ErrorInfo(message=marker, type="Error", code=code))
                    return
            yield Chunk(KV_PARAMS)  # prefill: the KV is ready for a remote decode
        else:
            self.pulled.append(request.kv_transfer_params)

    async def chat(self, request, raw_request_info=None):
        raise NotImplementedError

    async def embeddings(self, request, raw_request_info=None):
        raise NotImplementedError

    async def transcriptions(self, request, raw_request_info=None):
        raise NotImplementedError

    async def resolve_lora(self, lora_model) -> None:
        return None

    async def reset_prefix_cache(self) -> None:
        return None

    def routing_stats(self) -> dict:
        return {}


def shorten_rays_retries() -> None:
    from ray.llm._internal.serve.serving_patterns.prefill_decode import pd_server
    from ray.llm._internal.serve.utils import broadcast

    import serve_app.pd_decode

    pd_server._PREWARM_MAX_RETRIES = 2
    pd_server._PREWARM_RETRY_INTERVAL_S = 0.1
    broadcast.BROADCAST_REPLICA_POPULATION_TIMEOUT_S = 0.5
    serve_app.pd_decode.PREWARM_PAUSE_S = 0.2
    serve_app.pd_decode.PREFILL_POLL_S = 0.2


class RaysDecode(PDDecodeServer):
    async def __init__(self, *args, **kwargs):
        shorten_rays_retries()
        await super().__init__(*args, **kwargs)

    async def pulled(self) -> list:
        return self.engine.pulled


class OurDecode(BackgroundPrewarmPDDecodeServer):
    async def __init__(self, *args, **kwargs):
        shorten_rays_retries()
        await super().__init__(*args, **kwargs)

    async def pulled(self) -> list:
        return self.engine.pulled


class LatePrefill(PDPrefillServer):
    async def __init__(self, *args, until: str, first_at_once: str | None = None, **kwargs):
        """Starts once ``until`` exists; with ``first_at_once``, the first replica (the one that makes
        that file) starts at once and only the others wait, as a replica added later does."""
        import asyncio

        try:
            if first_at_once is None:
                raise FileExistsError
            os.close(os.open(first_at_once, os.O_CREAT | os.O_EXCL))
        except FileExistsError:
            while not os.path.exists(until):
                await asyncio.sleep(0.1)
        await super().__init__(*args, **kwargs)


@pytest.fixture(scope="module")
def serve_instance():
    from ray import serve

    before = os.environ.get("RAY_AUTH_MODE")
    os.environ["RAY_AUTH_MODE"] = "disabled"
    ray.init(address="local", num_cpus=2, include_dashboard=False, logging_level="ERROR")
    try:
        serve.start(proxy_location="Disabled")
        yield serve
    finally:
        serve.shutdown()
        ray.shutdown()
        if before is None:
            os.environ.pop("RAY_AUTH_MODE", None)
        else:
            os.environ["RAY_AUTH_MODE"] = before


def llm_configs():
    from ray.serve.llm import LLMConfig

    from local.paths import DEFAULT_SPEC
    from local.server import local_spec

    spec = local_spec(DEFAULT_SPEC, "disaggregated")
    assert spec.prewarm_nixl
    return {phase: LLMConfig(**spec.llm_config(phase)) for phase in ("prefill", "decode")}


def deploy(
    serve, name: str, decode_cls: type, until: Path, *, prefill_replicas: int = 1, first_at_once: Path | None = None
):
    configs = llm_configs()
    options = {"ray_actor_options": {"num_cpus": 0}}
    prefill = (
        serve.deployment(LatePrefill)
        .options(name="Prefill", num_replicas=prefill_replicas, **options)
        .bind(
            configs["prefill"],
            engine_cls=AnsweringEngine,
            until=str(until),
            first_at_once=str(first_at_once) if first_at_once else None,
        )
    )
    decode = (
        serve.deployment(decode_cls)
        .options(name="Decode", **options)
        .bind(configs["decode"], prefill_server=prefill, engine_cls=AnsweringEngine)
    )
    submit_app(decode, name=name, route_prefix=None)


# How long one replica's start may take: process start, imports (Ray Serve LLM, vLLM) and constructor.
# Measured up to about 70 s in a CI run here with the other core busy.
REPLICA_START_S = 120.0


def replicas_start_s(replicas: int) -> float:
    """How long ``replicas`` started at once may take: the raylet starts at most as many worker
    processes at a time as the node has CPUs (ray/_private/services.py, maximum_startup_concurrency),
    so on two cores a third replica's start waits for one of the first two."""
    at_once = max(1, min(multiprocessing.cpu_count(), int(ray.cluster_resources().get("CPU", 0))))
    return -(-replicas // at_once) * REPLICA_START_S


def deploy_failed_deadline_s() -> float:
    """Serve marks an app DEPLOY_FAILED after MAX_PER_REPLICA_RETRY_COUNT failed starts of a replica
    (ray/serve/_private/constants.py); each is a replica start."""
    from ray.serve._private.constants import MAX_PER_REPLICA_RETRY_COUNT

    return (MAX_PER_REPLICA_RETRY_COUNT + 1) * REPLICA_START_S


def wait_for(what, deadline_s: float = REPLICA_START_S):
    started = time.monotonic()
    while time.monotonic() - started < deadline_s:
        value = what()
        if value:
            return value
        time.sleep(0.5)
    return what()


def pulled_by(decode) -> list | None:
    """What decode's engine was asked to pull, or None when the replica does not answer within 10 s:
    a call the handle never delivers must fail the test at wait_for's deadline, not hold the run."""
    try:
        return decode.pulled.remote().result(timeout_s=10)
    except TimeoutError:
        return None


def decode_status(serve, app: str) -> str | None:
    application = serve.status().applications.get(app)
    return application.deployments["Decode"].status if application else None


def test_rays_decode_fails_the_app_when_prefill_is_late(serve_instance, tmp_path):
    """What the cluster would get: the constructor raises, Serve gives up, DEPLOY_FAILED for good."""
    serve = serve_instance
    deploy(serve, "rays", RaysDecode, until=tmp_path / "prefill-may-start")
    assert wait_for(lambda: serve.status().applications["rays"].status == "DEPLOY_FAILED", deploy_failed_deadline_s())
    assert "Pre-warm failed" in serve.status().applications["rays"].deployments["Decode"].message
    serve.delete("rays")


def test_decode_starts_while_prefill_is_late_and_prewarms_once_it_comes(serve_instance, tmp_path):
    serve = serve_instance
    gate = tmp_path / "prefill-may-start"
    deploy(serve, "ours", OurDecode, until=gate)
    assert wait_for(lambda: decode_status(serve, "ours") == "HEALTHY")
    # Longer than Ray's shortened retries, in which Ray's own decode would have failed.
    time.sleep(5)
    status = serve.status().applications["ours"]
    assert status.status == "DEPLOYING" and status.deployments["Decode"].status == "HEALTHY"
    assert status.deployments["Prefill"].status == "UPDATING"

    # No prefill replica yet: a request is served by decode's own engine (nothing to pull), at once,
    # where Ray's P/D would hold it for a prefill replica until the request timeout.
    decode = serve.get_deployment_handle("Decode", app_name="ours")
    assert served_within(decode, 60), "decode held the request for a prefill replica"
    assert pulled_by(decode) == [None]

    gate.touch()
    assert wait_for(lambda: serve.status().applications["ours"].status == "RUNNING")
    # The background prewarm went through prefill: decode was asked to pull prefill's KV.
    assert wait_for(lambda: len(pulled_by(decode) or []) > 1) and pulled_by(decode) == [None, KV_PARAMS]
    serve.delete("ours")


def test_a_prefill_replica_that_joins_later_is_prewarmed_too(serve_instance, tmp_path):
    """A replacement for a prefill replica that died, or one added by a scale-up: decode prewarms it
    as it prewarmed the first, before a client's request does its handshake."""
    serve = serve_instance
    gate = tmp_path / "second-prefill-may-start"
    deploy(serve, "joins", OurDecode, until=gate, prefill_replicas=2, first_at_once=tmp_path / "first")
    # Two prefill replicas and decode start at once.
    assert wait_for(lambda: decode_status(serve, "joins") == "HEALTHY", replicas_start_s(3)), "decode did not start"
    decode = serve.get_deployment_handle("Decode", app_name="joins")
    # The first prefill replica was prewarmed: decode pulled its KV once.
    assert wait_for(lambda: pulled_by(decode)) == [KV_PARAMS]
    gate.touch()
    assert wait_for(lambda: serve.status().applications["joins"].status == "RUNNING")
    # Ray's prewarm ran again, through both replicas, without a client request.
    assert wait_for(lambda: len(pulled_by(decode) or []) >= 3) and pulled_by(decode) == [KV_PARAMS] * 3
    serve.delete("joins")


def completion_through(decode, prompt: str) -> list:
    """The chunks decode streams for a completion of ``prompt``."""
    from ray.llm._internal.serve.core.configs.openai_api_models import CompletionRequest

    request = CompletionRequest(model=llm_configs()["decode"].model_id, prompt=prompt, max_tokens=4)
    return list(decode.options(stream=True).completions.remote(request))


def test_a_prefill_that_answers_with_a_server_error_is_served_by_decode(serve_instance, tmp_path):
    serve = serve_instance
    gate = tmp_path / "prefill-may-start"
    gate.touch()
    deploy(serve, "errs", OurDecode, until=gate)
    assert wait_for(lambda: serve.status().applications["errs"].status == "RUNNING")
    decode = serve.get_deployment_handle("Decode", app_name="errs")
    assert wait_for(lambda: pulled_by(decode)) == [KV_PARAMS]  # the prewarm

    # Prefill's engine died (500): decode serves the request whole (nothing to pull) and no error reaches the client.
    chunks = completion_through(decode, "prefill-engine-died " * 8)
    assert not any(isinstance(chunk, ErrorResponse) for chunk in chunks)
    assert pulled_by(decode) == [KV_PARAMS, None]
    # Prefill refused the request (400): decode's engine, the same model, would too; the answer is prefill's.
    chunks = completion_through(decode, "prefill-refuses " * 8)
    assert [chunk.error.code for chunk in chunks] == [400]
    assert pulled_by(decode) == [KV_PARAMS, None]
    serve.delete("errs")


def served_within(decode, seconds: float) -> bool:
    """Whether a completion sent to decode ends within ``seconds`` (a daemon thread holds it, so a
    request that waits forever fails the test, not the run)."""
    import threading

    from ray.llm._internal.serve.core.configs.openai_api_models import CompletionRequest

    model = llm_configs()["decode"].model_id
    request = CompletionRequest(model=model, prompt="a prompt of some length " * 8, max_tokens=4)
    done = threading.Event()
    failed: list[BaseException] = []

    def send() -> None:
        try:
            for _ in decode.options(stream=True).completions.remote(request):
                pass
        except BaseException as error:  # said by the test, not lost in the thread
            failed.append(error)
        done.set()

    threading.Thread(target=send, daemon=True).start()
    finished = done.wait(seconds)
    assert not failed, failed
    return finished


def test_the_app_builds_decode_with_the_background_prewarm_and_leaves_ray_as_it_was(serve_instance):
    from ray.llm._internal.serve.serving_patterns.prefill_decode import builder as pd_builder

    from serve_app.app import build_app
    from tests.serve_app.test_app import cluster_spec, graph

    decode = graph(build_app(cluster_spec(pd_min_prompt_tokens=0).model_dump(mode="json")))
    assert decode["Decode:qwen2_5-7b-instruct"].func_or_class is BackgroundPrewarmPDDecodeServer
    assert pd_builder.PDDecodeServer is PDDecodeServer
    # Decode with data parallelism: Ray's DP class, prewarming the same way.
    data_parallel = cluster_spec(pd_min_prompt_tokens=0).model_dump(mode="json")
    data_parallel["decode"]["engine_kwargs"]["data_parallel_size"] = 2
    decode = graph(build_app(data_parallel))["Decode:qwen2_5-7b-instruct"].func_or_class
    assert decode is BackgroundPrewarmDPPDDecodeServer and issubclass(decode, DPPDDecodeServer)
    assert pd_builder.DPPDDecodeServer is DPPDDecodeServer
    # Without prewarm, decode is Ray's own with only its prefill requests fitted to their one token.
    without = graph(build_app(cluster_spec(pd_min_prompt_tokens=0, prewarm_nixl=False).model_dump(mode="json")))
    assert without["Decode:qwen2_5-7b-instruct"].func_or_class is OneTokenPrefillPDDecodeServer
    assert not issubclass(OneTokenPrefillPDDecodeServer, BackgroundPrewarmPDDecodeServer)
