"""Ray Serve LLM callbacks that serve_app's engines run with (``LLMConfig.callback_config``)."""

from __future__ import annotations

from typing import Any

from ray.llm._internal.common.callbacks.base import CallbackBase


class StreamWeightsFromS3(CallbackBase):
    """Makes vLLM stream the weights from the S3 URI itself.

    With a streaming load format (runai_streamer), Ray Serve LLM skips its per-node download.
    Ray 2.58 then leaves the engine's model at the model id (``initialize_node`` sets
    ``hf_model_id`` to what the skipped download returned: the id), so vLLM would look for the id
    on Hugging Face; Ray 2.60 resolves the mirror's URI itself. ``on_after_node_init`` runs after
    that and before the engine arguments are built (``vllm_engine.py``, both versions), on the
    engine config that LLMConfig caches, so vLLM gets the URI and still serves the model id.
    """

    async def on_after_node_init(self) -> None:
        # Typed optional in Ray; a callback runs only with its LLMConfig set.
        llm_config: Any = self.llm_config
        llm_config.get_engine_config().hf_model_id = self.kwargs["model_uri"]
