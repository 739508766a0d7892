"""Selective disaggregation: a prompt whose uncached remainder is shorter than
``serving.pd_min_prompt_tokens`` is prefilled by decode itself; any other goes through remote prefill
and NIXL as in Ray Serve LLM's P/D graph.

Remote prefill only pays when what must be computed is long enough that computing it on decode would
stall decode's running streams for longer than the KV transfer costs. For a short computation it only
adds a second engine call, a handshake and a transfer before the first token (on this project's CPU
run, 50-100 ms). What must be computed is the prompt less what decode's engine already holds: a
conversation's next turn (a long history, a short new message) is a short prefill when decode kept
the history's KV from the turn before. llm-d's ``prefix-based-pd-decider`` decides the same way
(non-cached tokens against a threshold). This is a thin layer over Ray Serve LLM's own classes, the
read at Ray 2.58 (the cluster image's, which the tests run):

- :class:`SelectivePDDecodeServer` is Ray's ``PDDecodeServer`` (decode owns an engine and calls
  prefill), with its prewarm in the background (``serve_app/pd_decode.py``). Its ``_serve_here``,
  which decode's ``chat``/``completions`` ask, renders the prompt with vLLM's own front end in decode
  (:func:`rendered_prompt_ids`: tools and template arguments included, off the event loop),
  subtracts the full KV blocks decode's engine is estimated to hold
  (:class:`serve_app.prefix_index.PrefixIndex`, fed by :class:`ServedPrompts` with each prompt and
  reply the engine finished, as its token ids, and bounded by the blocks its running requests
  leave free) and says whether the request runs on the local engine (``LLMServer``'s methods, no
  ``kv_transfer_params``: vLLM computes what its cache lacks) or goes to Ray's P/D orchestration
  unchanged. A completion whose text alone proves it short (:func:`token_bound`) is not rendered.
- The remainder decode may prefill itself is below ``serving.pd_min_prompt_tokens`` and at most
  ``serving.pd_max_local_prefill_tokens`` (the cap that keeps decode's step within the ITL target).
  The cap governs only this choice: a request that cannot be split
  (``serve_app.pd_decode.whole_on_decode``) runs locally whatever its length, and so does one whose
  prefill is gone (availability first).
- :func:`build_selective_pd_app` is Ray's ``build_pd_openai_app`` with that class for decode
  (``serve_app.pd_decode.decode_classes``); everything else (prefill, ingress, options, DP checks) is
  Ray's own code.

The threshold and the cap reach the replica as ``experimental_configs[SELECTIVE_THRESHOLD_KEY]`` and
``[SELECTIVE_CAP_KEY]`` of decode's LLMConfig, keys Ray carries and does not read.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Callable
from typing import Any

from ray.llm._internal.serve.serving_patterns.prefill_decode import builder as pd_builder
from vllm.sampling_params import RequestOutputKind

from serve_app.pd_decode import DECODE_CLASS_NAME, BackgroundPrewarmPDDecodeServer, decode_classes
from serve_app.prefix_index import PrefixIndex
from serve_app.spec import SELECTIVE_CAP_KEY, SELECTIVE_THRESHOLD_KEY

logger = logging.getLogger(__name__)


async def rendered_prompt_ids(engine: Any, request: Any) -> list[int] | None:
    """The token ids of ``request``'s prompt as decode's engine will run it, or None when they cannot
    be told (then the request takes the P/D path).

    Rendered by vLLM's own front end in decode's replica (``render_chat_request`` /
    ``render_completion_request`` of the OpenAI serving objects Ray's engine holds), so the prompt is
    the one vLLM computes: the chat template with the request's tools (Qwen2.5 puts their schemas in
    the system turn), documents, template and template arguments, the generation-prompt flags, and
    assistant tool-call arguments parsed as vLLM parses them. It renders a copy (vLLM's tool parsers
    adjust the request they render) and tokenizes in vLLM's renderer threads, off the replica's event
    loop that streams every other answer. A request vLLM refuses, or one that is not a single prompt
    (batched prompts), goes through P/D, as one request each would."""
    chat = getattr(request, "messages", None) is not None
    serving = getattr(engine, "_oai_serving_chat" if chat else "_oai_serving_completion", None)
    if serving is None:
        return None
    copy = request.model_copy(deep=True)
    try:
        rendered = await (serving.render_chat_request(copy) if chat else serving.render_completion_request(copy))
    except Exception:  # a template or a part vLLM cannot render: its own answer comes from the P/D path
        return None
    if chat and isinstance(rendered, tuple):
        rendered = rendered[1]
    if not isinstance(rendered, list) or len(rendered) != 1:  # an ErrorResponse, or batched prompts
        return None
    ids = serving._extract_prompt_components(rendered[0]).token_ids
    return list(ids) if ids is not None else None


def byte_level(tokenizer: Any) -> bool:
    """Whether every token ``tokenizer`` makes of a text stands for at least one byte of it: a byte-level
    BPE (Llama 3's, Qwen2's, the local tiny model's) with no normalizer that could lengthen the text."""
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is None or backend.normalizer is not None:
        return False
    pre = backend.pre_tokenizer
    parts = getattr(pre, "pretokenizers", None) or [pre]
    return any(type(part).__name__ == "ByteLevel" for part in parts)


def token_bound(request: Any, tokenizer: Any) -> int | None:
    """An upper bound on the prompt tokens of ``request`` read from its text alone, without
    tokenizing; None where the text proves nothing.

    Only a completion's string prompt has one: with a byte-level tokenizer a prompt of n bytes is at
    most n tokens, plus the special tokens the tokenizer adds (a BOS) and the space it may put in
    front. A chat prompt is the chat template's text, which adds what the request does not show (a
    default system prompt, the tools' schemas), so its messages alone bound nothing."""
    prompt = getattr(request, "prompt", None)
    if getattr(request, "messages", None) is not None or not isinstance(prompt, str) or not byte_level(tokenizer):
        return None
    return len(prompt.encode()) + tokenizer.num_special_tokens_to_add() + 1


def cache_key(lora_name: str | None, cache_salt: str | None) -> tuple[str | None, str | None]:
    """What vLLM keys a prompt's cached blocks by beyond its tokens (its blocks' extra keys): the LoRA
    adapter and the cache salt."""
    return (lora_name, cache_salt)


class ServedPrompts:
    """Feeds a :class:`PrefixIndex` with what decode's engine ran, as the engine ran it.

    Wraps the engine client's ``generate`` (vLLM's ``AsyncLLM``, which every OpenAI serving object of
    Ray's engine calls), so a request is recorded only once the engine finished it, with the prompt's
    token ids and the reply's as the engine produced them: vLLM caches both (a reply's full blocks
    too), so a long reply does not send the next turn, which resends it, back through prefill. Until
    then the request's blocks are held by it, and counted as held (``held_blocks``): the index keeps
    no more prefixes than the engine's free blocks can, so running streams shorten what it claims."""

    def __init__(self, index: PrefixIndex) -> None:
        self.index = index
        self._held: dict[str, int] = {}

    def held_blocks(self) -> int:
        return sum(self._held.values())

    def wrap(self, generate: Callable[..., AsyncIterator[Any]]) -> Callable[..., AsyncIterator[Any]]:
        async def generate_and_record(prompt: Any, sampling_params: Any, request_id: str, *args: Any, **kwargs: Any):
            lora = kwargs.get("lora_request")
            salt = prompt.get("cache_salt") if isinstance(prompt, dict) else getattr(prompt, "cache_salt", None)
            key = cache_key(getattr(lora, "lora_name", None), salt)
            delta = getattr(sampling_params, "output_kind", None) == RequestOutputKind.DELTA
            reply: list[int] = []
            try:
                async for output in generate(prompt, sampling_params, request_id, *args, **kwargs):
                    prompt_ids = output.prompt_token_ids or ()
                    if output.outputs:
                        ids = output.outputs[0].token_ids
                        if delta:
                            reply.extend(ids)
                        else:
                            reply = list(ids)
                    self._held[request_id] = (len(prompt_ids) + len(reply)) // self.index.block_size
                    if output.finished and prompt_ids:
                        # The last token was sampled, never computed: its KV is not in the cache.
                        self._held.pop(request_id, None)
                        self.index.add([*prompt_ids, *reply[:-1]], key, reserved_blocks=self.held_blocks())
                    yield output
            finally:
                self._held.pop(request_id, None)

        return generate_and_record


class SelectivePDDecodeServer(BackgroundPrewarmPDDecodeServer):
    """Ray's ``PDDecodeServer`` that keeps prompts with a short uncached remainder on its own engine."""

    def _local_limit(self) -> int:
        """The uncached remainder below which decode prefills a prompt itself: the threshold, never
        above the cap."""
        configs = self._llm_config.experimental_configs
        threshold = int(configs.get(SELECTIVE_THRESHOLD_KEY, 0))
        return min(threshold, int(configs.get(SELECTIVE_CAP_KEY, threshold)) + 1)

    def _served(self) -> ServedPrompts | None:
        """What decode's engine served, as an estimate of its prefix cache; None when it caches no
        prefixes. Made at the first request, when the engine has started."""
        if not hasattr(self, "_served_prompts"):
            # The engine's own cache config, as AsyncLLM's front end holds it: block_size as the
            # platform set it (the CPU build's 128, a GPU's 16 by default), num_gpu_blocks as the
            # engine core reported on start (vLLM 0.26: wait_for_engine_startup in
            # vllm/v1/engine/utils.py; 0.32: MPClient._apply_ready_response in core_client.py).
            client = self.engine._engine_client
            cache = client.vllm_config.cache_config
            served = None
            if cache.enable_prefix_caching:
                served = ServedPrompts(PrefixIndex(cache.block_size, cache.num_gpu_blocks))
                client.generate = served.wrap(client.generate)
            self._served_prompts = served
        return self._served_prompts

    def _model_lora(self, request: Any) -> str | None:
        """The LoRA adapter ``request`` names (Ray names it by its model id), None for the base model."""
        model = getattr(request, "model", None)
        return None if model in (None, self._llm_config.model_id) else model

    async def _prefill_here(self, request: Any) -> bool:
        limit = self._local_limit()
        if limit <= 0:
            return False
        served = self._served()
        bound = token_bound(request, self.engine._engine_client.tokenizer)
        if bound is not None and bound < limit:
            return True
        tokens = await rendered_prompt_ids(self.engine, request)
        if tokens is None:
            return False
        if served is None:
            return len(tokens) < limit
        key = cache_key(self._model_lora(request), getattr(request, "cache_salt", None))
        cached = served.index.cached_tokens(tokens, key, reserved_blocks=served.held_blocks())
        return len(tokens) - cached < limit

    async def _serve_here(self, request: Any) -> bool:
        return await self._prefill_here(request) or await super()._serve_here(request)


def build_selective_pd_app(pd_serving_args: dict[str, Any]):
    """``build_pd_openai_app(pd_serving_args)`` with :class:`SelectivePDDecodeServer` for decode."""
    decode_config = pd_serving_args["decode_config"]
    engine_kwargs = decode_config.get("engine_kwargs", {}) if isinstance(decode_config, dict) else {}
    if engine_kwargs.get("data_parallel_size", 1) > 1:
        raise ValueError(
            "serving.pd_min_prompt_tokens applies to decode without data parallelism; "
            "set it to 0 or remove decode.engine_kwargs.data_parallel_size"
        )
    with decode_classes({DECODE_CLASS_NAME: SelectivePDDecodeServer}, "serving.pd_min_prompt_tokens", "set it to 0"):
        return pd_builder.build_pd_openai_app(pd_serving_args)
