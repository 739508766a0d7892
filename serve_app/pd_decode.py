"""Decode's P/D server, whose start never waits for prefill; and Ray's P/D builder with a decode class
of the project's.

With ``prewarm_nixl`` (``experimental_configs["_prewarm_prefill_decode"]``), Ray Serve LLM's
``PDDecodeServer`` ends its constructor with ``_maybe_prewarm``: a dummy request through every
prefill replica, tried 60 times 5 s apart, then a ``RuntimeError`` (``pd_server.py``,
``_PREWARM_MAX_RETRIES``; the same in Ray 2.58, the cluster image's, and 2.60). A constructor that
raises is a replica that failed to start: Serve starts a few more (``constants.py``,
``MAX_PER_REPLICA_RETRY_COUNT`` per replica), then marks the app DEPLOY_FAILED, and KubeRay does not
submit an unchanged serveConfigV2 again. So a prefill that comes late (a node Cluster Autoscaler
brings, a prefill replica that waits for one) would fail decode, and the app with it, for good.

:class:`BackgroundPrewarmPDDecodeServer` runs Ray's own prewarm (the same method, the same
handshake) after the constructor has returned, as a task of the replica's event loop, and starts it
again after ``PREWARM_PAUSE_S`` whenever Ray's gives up: a failure is logged, never raised. Until it
has gone through, requests do what they do with prewarm off: the first one to reach a prefill
replica does its handshake. It runs again whenever a prefill replica it has not prewarmed joins
(a replacement for one that died, a scale-up), before that replica's first client request if the
replica is seen first by decode's poll (each ``PREFILL_POLL_S``) rather than by a request.

Ray's prefill request (``clamp_request_to_single_token`` in ray.llm's ``kv_transfer/base.py``) sets
``max_tokens`` to 1 and keeps every other field of the client's request, so a field that vLLM checks
against ``max_tokens`` fails on prefill although the client's request is valid: ``min_tokens`` (vLLM's
``SamplingParams._verify_args``, "min_tokens must be less than or equal to max_tokens"). Prefill's
one token is never shown to the client (decode computes the first token again from the KV it pulls),
so :class:`OneTokenPrefill` fits those fields to that one token on the prefill request only, and
drops the grammar (structured outputs, a required or named ``tool_choice``) that prefill would compile
for it; decode runs the client's request as sent.

Some requests cannot be split between the two engines, whatever the prompt's length, so every decode
class here runs them whole on decode's own engine (``LLMServer``'s methods, the path selective P/D
takes for a short prompt), behind one predicate, :func:`whole_on_decode`:

- prompt logprobs (``prompt_logprobs``; ``echo`` with ``logprobs``/``top_logprobs``, which vLLM turns
  into prompt logprobs): decode loads the prompt's KV and computes only its last token, so there are
  no prompt logprobs to give. vLLM 0.26, the cluster image's, does not even skip the transfer for
  them (``v1/core/sched/scheduler.py`` takes the connector's count although ``prompt_logprobs`` sets
  ``skip_reading_prefix_cache``; fixed upstream in 0.32): chat answers ``[null]`` or garbage,
  completions with ``echo`` and ``logprobs`` answer 500, and on the V1 model runner the detokenizer's
  OverflowError kills decode's engine.
- ``n > 1``: prefill computes the prompt once per child and hands decode one child's KV; the others
  stay pinned on prefill for NIXL's lease (30 s), and every decode child pulls the same remote blocks,
  which prefill frees after the first read.
- beam search (``use_beam_search``): vLLM's beam search builds its own sampling parameters without
  ``kv_transfer_params``, so decode computes the whole prompt anyway and prefill's work is wasted.

A prefill that is gone does not fail a request decode can serve (availability first): decode holds
the same model, so every decode class here runs a request on its own engine, whole, when its handle
to prefill knows no running prefill replica (the only one died and its replacement is still loading
the model: minutes on a GPU, during which Ray's router would hold the request until
``request_timeout_s`` and answer 408), when the call to prefill fails because the replica died
under it (Ray's ``RayActorError`` family, Serve's ``DeploymentUnavailableError``) or prefill failed
(it raised, or answered with a server error, HTTP 5xx, as a replica whose engine died does; a
request prefill refused with a 4xx gets that answer, which decode's engine would give too), and when every
prefill replica is gone while the request waits for prefill's answer (Serve's router holds a request
whose replica died for the next replica), each before anything was streamed to the client. Each such request is logged and counted in the Ray metric
``pd_prefill_fallbacks`` (exported as ``ray_pd_prefill_fallbacks_total``, by reason), which
``make verify`` reads (Serve adds the deployment and replica tags). It costs decode's running streams a longer step while it lasts; the
selective threshold's cap does not apply to it.

Ray's ``build_pd_openai_app`` picks its decode class by two module-level names of its builder
(``PDDecodeServer``; ``DPPDDecodeServer`` with data parallelism). :func:`build_pd_app` swaps those
names for the time of the call; everything else (prefill, ingress, options) is Ray's own code.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Iterator, Mapping
from typing import Any

from ray.exceptions import RayActorError
from ray.llm._internal.serve.core.configs.openai_api_models import ErrorInfo, ErrorResponse
from ray.llm._internal.serve.core.server.llm_server import LLMServer
from ray.llm._internal.serve.serving_patterns.prefill_decode import builder as pd_builder
from ray.llm._internal.serve.serving_patterns.prefill_decode.pd_server import DPPDDecodeServer, PDDecodeServer
from ray.serve.exceptions import DeploymentUnavailableError
from ray.serve.metrics import Counter

from serve_app.spec import PREWARM_KEY

logger = logging.getLogger(__name__)

# The names build_pd_openai_app reads its decode classes from, without and with data parallelism.
DECODE_CLASS_NAME = "PDDecodeServer"
DP_DECODE_CLASS_NAME = "DPPDDecodeServer"
RAYS_DECODE_CLASSES = {DECODE_CLASS_NAME: PDDecodeServer, DP_DECODE_CLASS_NAME: DPPDDecodeServer}
# The logprobs the prewarm request asks for (BackgroundPrewarmPDDecodeServer._make_dummy_request).
PREWARM_LOGPROBS = 1
# How long decode waits before it runs Ray's prewarm again after Ray's own retries gave up.
PREWARM_PAUSE_S = 30.0
# How often decode looks whether its handle to prefill has prefill's replicas, before the prewarm.
PREFILL_POLL_S = 1.0
# How often decode looks, while it waits for prefill's answer, whether any prefill replica is left.
PREFILL_WATCH_S = 0.5
# What decode's call to prefill raises when the prefill replica it was routed to is gone.
PREFILL_LOST = (RayActorError, DeploymentUnavailableError)
# The Ray metric counting requests decode served itself because prefill was gone.
FALLBACK_METRIC = "pd_prefill_fallbacks"


# Request fields P/D cannot honour by design, each with why; a request with one gets HTTP 400.
REFUSED_FIELDS = {
    "kv_transfer_params": (
        "it is what P/D's prefill and decode exchange for each request (where decode pulls the prompt's "
        "KV from); a client's own cannot be honoured: remove it"
    ),
}


def pd_refusal(request: Any) -> tuple[str, str] | None:
    """(field, message) of the first field of ``request`` that P/D refuses, or None."""
    for field, why in REFUSED_FIELDS.items():
        if getattr(request, field, None) is not None:
            return field, f"{field} is not accepted by this P/D endpoint: {why}"
    return None


def whole_on_decode(request: Any) -> str | None:
    """The field of ``request`` that keeps it from being split between prefill and decode, or None.

    Read through vLLM's own conversion of the request (``to_sampling_params``), so that whatever vLLM
    turns into prompt logprobs or several sequences (``echo`` with ``logprobs`` in completions, with
    ``top_logprobs`` in chat) counts, as the engine will see it."""
    if getattr(request, "use_beam_search", False):
        return "use_beam_search"
    try:
        params = request.to_sampling_params(1, {})
    except ValueError:
        # A request vLLM refuses: either path answers it with vLLM's own 400.
        return None
    if params.prompt_logprobs is not None:
        return "prompt_logprobs" if getattr(request, "prompt_logprobs", None) is not None else "echo"
    if params.n > 1:
        return "n"
    return None


async def _refused(field: str, message: str) -> AsyncIterator[ErrorResponse]:
    yield ErrorResponse(error=ErrorInfo(message=message, type="BadRequestError", param=field, code=400))


# The request fields vLLM compiles into a structured-output grammar (ChatCompletionRequest's and
# CompletionRequest's extract_structured_outputs in vLLM 0.26, the image's), none of which changes the
# prompt: vLLM's renderer reads neither (renderers/online_renderer.py).
GRAMMAR_FIELDS = ("structured_outputs", "response_format")
# tool_choice values that make vLLM's tool parser add a JSON grammar built from the tools
# (tool_parsers/utils.py get_json_schema_from_tools, through ToolParser.adjust_request): "required",
# or a named function (an object). "auto" renders the same prompt (the renderer drops the tools only
# for "none") and adds no grammar.
GRAMMAR_FREE_TOOL_CHOICE = "auto"


def fit_prefill_to_one_token(prefill_request: Any) -> None:
    """Fits, in place, the fields vLLM checks against ``max_tokens`` to the one token Ray's prefill
    request asks for, and drops the grammar that token would be sampled under.

    Decode samples every token the client sees, the first included, under the client's grammar;
    prefill's one token is thrown away, so a grammar on prefill is compiled (xgrammar: up to seconds
    for a large schema, once per schema and engine) for nothing, before decode compiles it again."""
    if getattr(prefill_request, "min_tokens", 0) > 1:
        prefill_request.min_tokens = 1
    for field in GRAMMAR_FIELDS:
        if getattr(prefill_request, field, None) is not None:
            setattr(prefill_request, field, None)
    tool_choice = getattr(prefill_request, "tool_choice", None)
    if tool_choice is not None and tool_choice not in ("none", GRAMMAR_FREE_TOOL_CHOICE):
        prefill_request.tool_choice = GRAMMAR_FREE_TOOL_CHOICE


class OneTokenPrefill:
    """Ray's KV-connector backend of a replica, whose prefill requests are fitted to their one token."""

    def __init__(self, backend: Any) -> None:
        self._backend = backend
        # The ids of the client requests in flight whose prefill has answered (decode forgets each
        # when its answer is decided).
        self.past_prefill: set[int] = set()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._backend, name)

    def prepare_prefill_request(self, *, request: Any, peer: Any) -> Any:
        prefill_request = self._backend.prepare_prefill_request(request=request, peer=peer)
        fit_prefill_to_one_token(prefill_request)
        return prefill_request

    def prepare_decode_request(self, *, request: Any, peer: Any, prefill_response: Any) -> Any:
        # Ray's orchestration shapes decode's request only once prefill answered: from here on an
        # error is decode's own, which serving the request on decode again would not mend.
        self.past_prefill.add(id(request))
        return self._backend.prepare_decode_request(request=request, peer=peer, prefill_response=prefill_response)


def server_error(chunk: Any) -> bool:
    """Whether ``chunk`` is an answer of a failed server (HTTP 5xx), not of a request it refused: a
    request prefill refused would be refused by decode's engine, the same model, as well."""
    return isinstance(chunk, ErrorResponse) and int(chunk.error.code or 500) >= 500


def prefill_replica_ids(handle: Any) -> frozenset | None:
    """The running replicas decode's handle to prefill knows of; None before the handle has a request
    router (its first request or the background prewarm makes one). Empty as well before Serve's long
    poll has delivered prefill's first replicas: a prefill that has not come yet."""
    router = handle._router if handle.is_initialized else None
    # The router on a loop of its own, if so (as prefill_router_ready finds it).
    router = getattr(router, "_asyncio_router", router)
    request_router = getattr(router, "_request_router", None)  # read, never made, from here
    if request_router is None:
        return None
    # Read from this thread while the router's own loop may replace it: a copy, taken at once.
    return frozenset(list(request_router.curr_replicas))


def prefill_replicas(handle: Any) -> int | None:
    """How many running replicas decode's handle to prefill knows of (``prefill_replica_ids``)."""
    replicas = prefill_replica_ids(handle)
    return None if replicas is None else len(replicas)


class OneTokenPrefillPDDecodeServer(PDDecodeServer):
    """Ray's ``PDDecodeServer`` whose prefill requests are valid wherever the client's request is, and
    which runs on its own engine a request that cannot be split (:func:`whole_on_decode`) or whose
    prefill is gone."""

    _one_token_prefill: OneTokenPrefill | None = None
    _fallbacks: Counter | None = None

    def _prefill_fallback(self, reason: str, error: BaseException | None = None) -> None:
        """Logs and counts a request decode serves itself because prefill is gone."""
        if self._fallbacks is None:
            self._fallbacks = Counter(
                FALLBACK_METRIC,
                description="Requests decode served on its own engine because prefill was gone, by reason.",
                tag_keys=("reason",),
            )
        self._fallbacks.inc(tags={"reason": reason})
        logger.warning("prefill is gone (%s); decode serves the request on its own engine", error or reason)

    async def _prefill_or_here(self, method: str, request: Any, raw_request_info: Any, pd: Any) -> AsyncIterator[Any]:
        """Ray's P/D answer ``pd``; decode's own when, before its first chunk, the call to prefill fails
        (prefill's replica died under it, or prefill answered with a server error or raised) or every
        prefill replica is gone while it waits (a request sent to a replica that died is held by
        Serve's router for the next one)."""
        past_prefill = self._get_connector_backend().past_prefill
        first_chunk = asyncio.ensure_future(anext(pd))
        reason = None
        try:
            while reason is None:
                done, _ = await asyncio.wait({first_chunk}, timeout=PREFILL_WATCH_S)
                if done:
                    break
                if prefill_replicas(self._prefill_handle) == 0 and id(request) not in past_prefill:
                    reason = "prefill_replica_lost"
                    first_chunk.cancel()
            error: BaseException | None = None
            try:
                first = await first_chunk
            except StopAsyncIteration:
                return
            except asyncio.CancelledError:
                if reason is None:  # the client's own cancellation
                    raise
            except PREFILL_LOST as lost:
                reason, error = type(lost).__name__, lost
            except Exception as failed:
                if id(request) in past_prefill:  # decode's own failure
                    raise
                reason, error = "prefill_error", failed
            else:
                if id(request) in past_prefill or not server_error(first):
                    yield first
                    async for chunk in pd:
                        yield chunk
                    return
                reason, error = "prefill_error", RuntimeError(first.error.message)
        finally:
            past_prefill.discard(id(request))
        self._prefill_fallback(reason, error)
        async for chunk in await getattr(LLMServer, method)(self, request, raw_request_info):
            yield chunk

    async def _serve(self, method: str, request: Any, raw_request_info: Any) -> AsyncIterator[Any]:
        if refused := self._refusal(request):
            return refused
        if await self._serve_here(request):
            return await getattr(LLMServer, method)(self, request, raw_request_info)
        if prefill_replicas(self._prefill_handle) == 0:
            self._prefill_fallback("no_prefill_replica")
            return await getattr(LLMServer, method)(self, request, raw_request_info)
        pd = await getattr(super(), method)(request, raw_request_info)
        return self._prefill_or_here(method, request, raw_request_info, pd)

    def _refusal(self, request: Any) -> AsyncIterator[ErrorResponse] | None:
        """What decode answers to a request with a field P/D refuses, or None."""
        refusal = pd_refusal(request)
        return _refused(*refusal) if refusal else None

    async def _serve_here(self, request: Any) -> bool:
        """Whether decode's own engine serves ``request`` whole, without prefill."""
        return whole_on_decode(request) is not None

    async def chat(self, request, raw_request_info=None):
        return await self._serve("chat", request, raw_request_info)

    async def completions(self, request, raw_request_info=None):
        return await self._serve("completions", request, raw_request_info)

    def _get_connector_backend(self) -> Any:
        # Ray's orchestrator and its prewarm shape every prefill request through this backend (the
        # same method in Ray 2.58, the cluster image's, and 2.60).
        if self._one_token_prefill is None:
            self._one_token_prefill = OneTokenPrefill(super()._get_connector_backend())
        return self._one_token_prefill


class OneTokenPrefillDPPDDecodeServer(OneTokenPrefillPDDecodeServer, DPPDDecodeServer):
    """Ray's ``DPPDDecodeServer`` (decode with data parallelism), its prefill requests fitted the same way."""


async def _request_router_of(router: Any) -> Any:
    return router.request_router


async def prefill_router_ready(handle: Any) -> bool:
    """Whether decode's handle to prefill has its replicas and its request router, the router made on
    the router's own event loop; makes it there when the replicas are known.

    Ray's prewarm reaches the prefill replicas through ``broadcast`` (ray.llm's ``utils/broadcast.py``),
    which runs in a worker thread and reads the handle router's ``request_router``, a property that
    makes the request router on first read. Read first from that thread, it races with the router's
    own event loop, which reads the same property as Serve's long poll hands it the replicas: two
    request routers are made, the thread's may be stored last without the replicas, and the prewarm
    then reaches no prefill replica, or waits on replicas that never come. Read first here, on the
    router's loop, there is one request router, fed by the long poll; ``broadcast`` finds it made."""
    if not handle.is_initialized:
        handle._init(_run_router_in_separate_loop=True)  # as broadcast initializes it
    router = handle._router
    if not handle.running_replicas_populated():
        return False
    if hasattr(router, "_asyncio_router"):  # the router runs on a loop of its own, in another thread
        made = asyncio.run_coroutine_threadsafe(_request_router_of(router._asyncio_router), router._asyncio_loop)
        return await asyncio.wrap_future(made) is not None
    return router.request_router is not None  # the router runs on this very loop


class BackgroundPrewarmPDDecodeServer(OneTokenPrefillPDDecodeServer):
    """Ray's ``PDDecodeServer`` whose prewarm runs after the constructor, until it goes through."""

    _prewarm_task: asyncio.Task | None = None

    _prewarmed: frozenset = frozenset()

    def _make_dummy_request(self, model_id: str) -> Any:
        # vLLM compiles its logprobs kernel (batched_count_greater_than, torch.compile in
        # v1/sample/ops/logprobs.py) in each engine at the first request that asks for logprobs:
        # seconds on a GPU node, more on a CPU, paid by a client. With logprobs, the prewarm request
        # has every prefill replica and decode compile it before traffic.
        request = super()._make_dummy_request(model_id)
        request.logprobs = PREWARM_LOGPROBS
        return request

    async def _maybe_prewarm(self) -> None:
        # Kept on the replica: the event loop holds tasks only weakly.
        self._prewarm_task = asyncio.get_running_loop().create_task(self._prewarm_until_done())

    async def _prewarm_until_done(self) -> None:
        """Ray's prewarm, once prefill has replicas, and again whenever a replica decode has not
        prewarmed joins them (a replacement, a scale-up), so no new replica does its handshake on a
        client's request. Runs for the replica's life: a look each ``PREFILL_POLL_S``."""
        if not self._llm_config.experimental_configs.get(PREWARM_KEY):
            return
        while True:
            try:
                if await prefill_router_ready(self._prefill_handle):
                    replicas = prefill_replica_ids(self._prefill_handle) or frozenset()
                    if not replicas <= self._prewarmed:
                        # Ray's prewarm reaches every prefill replica; a known one answers a dummy
                        # request again, a new one does its handshake.
                        await super()._maybe_prewarm()
                        self._prewarmed = replicas
                await asyncio.sleep(PREFILL_POLL_S)
                continue
            except Exception:
                logger.warning(
                    "prewarm of the prefill replicas did not go through; decode serves meanwhile (each "
                    "prefill replica's first request does its handshake) and tries again in %.0f s",
                    PREWARM_PAUSE_S,
                    exc_info=True,
                )
            await asyncio.sleep(PREWARM_PAUSE_S)


class BackgroundPrewarmDPPDDecodeServer(BackgroundPrewarmPDDecodeServer, DPPDDecodeServer):
    """Ray's ``DPPDDecodeServer`` (decode with data parallelism), prewarming the same way."""


@contextlib.contextmanager
def decode_classes(classes: Mapping[str, type], setting: str, fix: str) -> Iterator[None]:
    """Ray's P/D builder with ``classes`` under its decode class names, for the time of the block."""
    for name, rays in RAYS_DECODE_CLASSES.items():
        if name in classes and getattr(pd_builder, name, None) is not rays:
            raise RuntimeError(
                f"Ray's P/D builder no longer names its decode class {name}; "
                f"{setting} cannot be applied to this Ray version ({fix})"
            )
    for name, cls in classes.items():
        setattr(pd_builder, name, cls)
    try:
        yield
    finally:
        for name in classes:
            setattr(pd_builder, name, RAYS_DECODE_CLASSES[name])


def build_pd_app(pd_serving_args: dict[str, Any], *, background_prewarm: bool):
    """``build_pd_openai_app(pd_serving_args)`` with decode's prefill requests fitted to their one
    token, and with ``background_prewarm`` its prewarm in the background."""
    if background_prewarm:
        classes: dict[str, type] = {
            DECODE_CLASS_NAME: BackgroundPrewarmPDDecodeServer,
            DP_DECODE_CLASS_NAME: BackgroundPrewarmDPPDDecodeServer,
        }
    else:
        classes = {
            DECODE_CLASS_NAME: OneTokenPrefillPDDecodeServer,
            DP_DECODE_CLASS_NAME: OneTokenPrefillDPPDDecodeServer,
        }
    with decode_classes(classes, "serving.mode disaggregated", "Ray 2.58 and 2.60 have it"):
        return pd_builder.build_pd_openai_app(pd_serving_args)
