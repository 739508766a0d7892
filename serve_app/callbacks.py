"""Ray Serve LLM callbacks that serve_app's engines run with (``LLMConfig.callback_config``)."""

from __future__ import annotations

import logging.config
from typing import Any

from ray.llm._internal.common.callbacks.base import CallbackBase


def keep_log_handlers_open() -> None:
    """Makes ``logging.config.dictConfig`` leave the handlers that exist in this process open.

    dictConfig first closes every handler in the process (``logging.config._clearExistingHandlers``),
    and an engine replica runs it twice after Serve has set up its replica logger: NIXL at its first
    import (``nixl_cu*/logging.py``, NIXL 1.3.1, the image's) and vLLM when it applies its logging config
    to the engine (``vllm/logger.py``, ``configure_logging``). Serve's MemoryHandler then has no target, and
    after a GCS restart Serve's recovered controller, which asks each replica for its log file
    (``logging_utils.get_component_logger_file_path``), fails on it and replaces the replica: a model
    reload that GCS fault tolerance exists to avoid. The handlers dictConfig installs are still
    installed; the ones it would have closed stay open (in a replica, only Serve's and Ray's own).
    """
    logging.config._clearExistingHandlers = _forget_handlers_without_closing  # type: ignore[attr-defined]


def _forget_handlers_without_closing() -> None:
    logging._handlers.clear()  # type: ignore[attr-defined]


class EngineCallbacks(CallbackBase):
    """What a P/D engine's replica does around Ray Serve LLM's node initialization.

    - Before it: keeps Serve's log handlers open through NIXL's and vLLM's logging set-up
      (``keep_log_handlers_open``).
    - After it, with ``model_uri`` (a streaming load format, runai_streamer): makes vLLM stream the
      weights from the S3 URI itself. Ray Serve LLM skips its per-node download then; Ray 2.58
      leaves the engine's model at the model id (``initialize_node`` sets ``hf_model_id`` to what
      the skipped download returned: the id), so vLLM would look for the id on Hugging Face; Ray
      2.60 resolves the mirror's URI itself. ``on_after_node_init`` runs after that and before the
      engine arguments are built (``vllm_engine.py``, both versions), on the engine config that
      LLMConfig caches, so vLLM gets the URI and still serves the model id.
    """

    async def on_before_node_init(self) -> None:
        if self.kwargs.get("kv_transfer"):
            keep_log_handlers_open()

    async def on_after_node_init(self) -> None:
        if "model_uri" in self.kwargs:
            # Typed optional in Ray; a callback runs only with its LLMConfig set.
            llm_config: Any = self.llm_config
            llm_config.get_engine_config().hf_model_id = self.kwargs["model_uri"]
