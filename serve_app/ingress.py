"""The OpenAI ingress behind API keys: Ray Serve LLM's own ``OpenAiIngress``, each of its routes
first checking the request's ``Authorization: Bearer <key>``.

``ServingSpec.builder_args`` names this class in the builders' ``ingress_cls_config`` when the spec
has an ``api_key_dir``; both builders (``build_pd_openai_app``, ``build_openai_app``) take it in Ray
2.58 and 2.60 alike. The routes are exactly the ones ``make_fastapi_ingress`` registers
(``DEFAULT_ENDPOINTS`` of Ray's ingress module, the same table in both versions), so a route Ray adds
is guarded too, never served open. Serve's own ``/-/healthz`` and ``/-/routes`` are the proxy's,
not the ingress's, and stay open for the health checks. A refusal is HTTP 401 in OpenAI's error shape.

The keys are files in one directory, one key per file (a Secrets Manager secret each, mounted by
the CSI driver on the GPU workers; a file of `make local API_KEY=…`'s). Only their SHA-256 digests are
kept; a key never reaches a log, a metric or the Serve config.

No ``from __future__ import annotations`` here: FastAPI reads the routes' signatures, and the one
parameter added below must carry a real class, not a string to resolve in this module.
"""

import functools
import hashlib
import hmac
import inspect
from collections.abc import Callable
from pathlib import Path
from typing import Any

from fastapi import Request
from fastapi.responses import JSONResponse
from ray.llm._internal.serve.core.ingress.ingress import DEFAULT_ENDPOINTS
from ray.serve.llm.ingress import OpenAiIngress

# The parameter FastAPI fills with the request for a route whose own signature has none (/v1/models).
REQUEST_PARAMETER = "_api_key_request"
GUARDED = "__api_key_guarded__"

MISSING = (
    "You didn't provide an API key. You need to provide your API key in an Authorization header "
    "using Bearer auth (i.e. Authorization: Bearer YOUR_KEY)."
)
INCORRECT = "Incorrect API key provided."


def read_key_digests(directory: str) -> frozenset[bytes]:
    """The SHA-256 of every key in ``directory`` (one per file; the CSI driver's ``..data`` entries
    and other dot files are its own bookkeeping)."""
    folder = Path(directory)
    if not folder.is_dir():
        raise RuntimeError(f"the API key directory {directory} does not exist")
    keys = [
        path.read_text().strip()
        for path in sorted(folder.iterdir())
        if not path.name.startswith(".") and path.is_file()
    ]
    keys = [key for key in keys if key]
    if not keys:
        raise RuntimeError(f"the API key directory {directory} holds no key")
    return frozenset(hashlib.sha256(key.encode()).digest() for key in keys)


def refusal(headers: Any, digests: frozenset[bytes]) -> JSONResponse | None:
    """None when ``headers`` carry one of the keys; else the 401 OpenAI answers with."""
    scheme, _, presented = (headers.get("authorization") or "").strip().partition(" ")
    presented = presented.strip()
    if scheme.lower() != "bearer" or not presented:
        message, code = MISSING, None
    else:
        digest = hashlib.sha256(presented.encode()).digest()
        # Every key compared, in constant time each: the answer's timing says nothing about which.
        matches = [hmac.compare_digest(digest, known) for known in digests]
        if any(matches):
            return None
        message, code = INCORRECT, "invalid_api_key"
    return JSONResponse(
        status_code=401,
        content={"error": {"message": message, "type": "invalid_request_error", "param": None, "code": code}},
        headers={"WWW-Authenticate": "Bearer"},
    )


def _request_parameter(signature: inspect.Signature) -> str | None:
    for parameter in signature.parameters.values():
        if parameter.annotation is Request:
            return parameter.name
    return None


def guarded(route: Callable[..., Any]) -> Callable[..., Any]:
    """``route`` (an ingress method FastAPI calls with keyword arguments) behind the key check."""
    signature = inspect.signature(route)
    own = _request_parameter(signature)

    @functools.wraps(route)
    async def checked(self, *args, **kwargs):
        request = kwargs[own] if own else kwargs.pop(REQUEST_PARAMETER)
        refused = refusal(request.headers, self._api_key_digests)
        if refused is not None:
            return refused
        return await route(self, *args, **kwargs)

    if own is None:
        extra = inspect.Parameter(REQUEST_PARAMETER, inspect.Parameter.KEYWORD_ONLY, annotation=Request)
        checked.__signature__ = signature.replace(parameters=[*signature.parameters.values(), extra])  # type: ignore[attr-defined]
    setattr(checked, GUARDED, True)
    return checked


class KeyedOpenAiIngress(OpenAiIngress):
    """``OpenAiIngress`` that answers only requests with one of the keys in ``api_key_dir``."""

    def __init__(self, *args: Any, api_key_dir: str, **kwargs: Any) -> None:
        # Read before the parent starts anything: a replica without keys fails at start, loudly.
        self._api_key_digests = read_key_digests(api_key_dir)
        super().__init__(*args, **kwargs)


for _name in DEFAULT_ENDPOINTS:
    setattr(KeyedOpenAiIngress, _name, guarded(getattr(OpenAiIngress, _name)))
