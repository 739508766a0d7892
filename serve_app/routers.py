"""The request routers of the project's own that a phase may name (``serving.<phase>.request_router``).

Ray Serve LLM's ``PrefixCacheAffinityRouter`` (Ray 2.58, the cluster image's;
``routing_policies/prefix_aware/prefix_aware_router.py``) matches a request's text against the
text each replica was sent before. It reads that text from the request's ``messages`` or
``prompt`` and fails on what is not text:

- a completions prompt of token ids (what eval and RL tooling, and ``vllm bench`` with pre-tokenized
  prompts, send) normalizes to ``""``, and its match rate ``len(matched) / len(text)`` divides 0 by 0;
- a prompt-embeds request (``prompt`` None) raises ``ValueError``.

Either exception kills Serve's routing task for the request ("Unexpected error in
_fulfill_pending_requests", ``serve/_private/request_router/request_router.py``), which then waits
for the next request's routing task, or for ``request_timeout_s`` on a quiet endpoint.

:class:`PrefixAffinityRouter` is Ray's router with that one method made total: token ids become text
(so a pre-tokenized conversation still finds the replica that holds its prefix), and a request with
no text is routed by power of two choices and left out of the prefix tree, as Ray's router does
for a request it has no text for (``input_text is None``).
"""

from __future__ import annotations

from typing import Any

from ray.serve.llm.request_router import PrefixCacheAffinityRouter

# Ends each token id of a prompt given as ids, so that the ids' text keeps the prefix property: a
# prompt's text starts with another's exactly when its ids start with the other's ids.
TOKEN_ID_END = ","
PROMPT_FIELDS = ("messages", "prompt")


def token_ids_text(prompt: Any) -> str | None:
    """The text a prompt of token ids (one list, or a batch of them) is matched by; None otherwise."""
    if isinstance(prompt, list) and prompt and all(isinstance(t, int) for t in prompt):
        return "".join(f"{t}{TOKEN_ID_END}" for t in prompt)
    if isinstance(prompt, list) and prompt and all(isinstance(p, list) for p in prompt):
        texts = [text for p in prompt if (text := token_ids_text(p)) is not None]
        return "".join(texts) if len(texts) == len(prompt) else None
    return None


class PrefixAffinityRouter(PrefixCacheAffinityRouter):
    """Ray Serve LLM's ``PrefixCacheAffinityRouter``, safe for prompts that are not text."""

    def _extract_text_from_request(self, pending_request: Any) -> str | None:
        request = next((a for a in pending_request.args if any(hasattr(a, f) for f in PROMPT_FIELDS)), None)
        if request is None:
            return None
        prompt = getattr(request, "messages", None)
        if prompt is None:
            prompt = getattr(request, "prompt", None)
        text = token_ids_text(prompt)
        if text is None and prompt is not None:
            text = self._normalize_prompt_to_string(prompt)
        # No text to match (prompt embeddings, parts that are not text): power of two choices.
        return text or None
