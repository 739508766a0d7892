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
  (:class:`serve_app.prefix_index.PrefixIndex`, fed with every prompt this replica serves) and says
  whether the request runs on the local engine (``LLMServer``'s methods, no ``kv_transfer_params``:
  vLLM computes what its cache lacks) or goes to Ray's P/D orchestration unchanged. A request that
  cannot be split (``serve_app.pd_decode.whole_on_decode``) runs locally whatever its length.
- :func:`build_selective_pd_app` is Ray's ``build_pd_openai_app`` with that class for decode
  (``serve_app.pd_decode.decode_classes``); everything else (prefill, ingress, options, DP checks) is
  Ray's own code.

The threshold reaches the replica as ``experimental_configs[SELECTIVE_THRESHOLD_KEY]`` of decode's LLMConfig,
a key Ray carries and does not read.
"""

from __future__ import annotations

import logging
from typing import Any

from ray.llm._internal.serve.serving_patterns.prefill_decode import builder as pd_builder

from serve_app.pd_decode import DECODE_CLASS_NAME, BackgroundPrewarmPDDecodeServer, decode_classes
from serve_app.prefix_index import PrefixIndex
from serve_app.spec import SELECTIVE_THRESHOLD_KEY

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


class SelectivePDDecodeServer(BackgroundPrewarmPDDecodeServer):
    """Ray's ``PDDecodeServer`` that keeps prompts with a short uncached remainder on its own engine."""

    def _min_prompt_tokens(self) -> int:
        return int(self._llm_config.experimental_configs.get(SELECTIVE_THRESHOLD_KEY, 0))

    def _prefix_index(self) -> PrefixIndex | None:
        """The estimate of decode's prefix cache; None when its engine caches no prefixes."""
        if not hasattr(self, "_selective_index"):
            # The engine's own cache config, as AsyncLLM's front end holds it: block_size as the
            # platform set it (the CPU build's 128, a GPU's 16 by default), num_gpu_blocks as the
            # engine core reported on start (vLLM 0.26: wait_for_engine_startup in
            # vllm/v1/engine/utils.py; 0.32: MPClient._apply_ready_response in core_client.py).
            cache = self.engine._engine_client.vllm_config.cache_config
            self._selective_index = (
                PrefixIndex(cache.block_size, cache.num_gpu_blocks) if cache.enable_prefix_caching else None
            )
        return self._selective_index

    async def _prefill_here(self, request: Any) -> bool:
        threshold = self._min_prompt_tokens()
        if threshold <= 0:
            return False
        tokens = await rendered_prompt_ids(self.engine, request)
        if tokens is None:
            return False
        index = self._prefix_index()
        if index is None:
            return len(tokens) < threshold
        # vLLM keys the cache by LoRA adapter and cache_salt too (its blocks' extra keys).
        salt = (getattr(request, "model", None), getattr(request, "cache_salt", None))
        remainder = len(tokens) - index.cached_tokens(tokens, salt)
        # Either path leaves the prompt's blocks in decode's cache: computed here, or pulled over
        # NIXL, which vLLM caches like computed blocks (the next turn of docs/serving.md's "Repeated
        # long inputs" is served 1,408 tokens from decode's own cache).
        index.add(tokens, salt)
        return remainder < threshold

    async def _serve_here(self, request: Any) -> bool:
        # The estimate first: it records the prompt, whose blocks decode keeps whichever path runs it.
        short = await self._prefill_here(request)
        return short or await super()._serve_here(request)


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
