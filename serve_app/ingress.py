"""The OpenAI ingress behind API keys: Ray Serve LLM's own ``OpenAiIngress``, each of its routes
first checking the request's ``Authorization: Bearer <key>``.

``ServingSpec.builder_args`` names this class in the builders' ``ingress_cls_config`` when the spec
has an ``api_key_dir``; both builders (``build_pd_openai_app``, ``build_openai_app``) take it in Ray
2.58 and 2.60 alike. The routes are exactly the ones ``make_fastapi_ingress`` registers
(``DEFAULT_ENDPOINTS`` of Ray's ingress module, the same table in both versions), so a route Ray adds
is guarded too, never served open. What the app answers beyond those routes (FastAPI's
``/openapi.json``, ``/docs``, ``/docs/oauth2-redirect``, ``/redoc``: the map of every route and
the server's versions) and any path it does not know are refused as well, by a check in front of
the app's router (:class:`KeyCheck`), so without a key the app says nothing but 401. Serve's own
``/-/healthz`` and ``/-/routes`` are the proxy's, not the ingress's, and stay open for the health
checks. A refusal is HTTP 401 in OpenAI's error shape.

The keys are files in one directory, one key per file (a Secrets Manager secret each, mounted by
the CSI driver on the GPU workers; a file of `make local API_KEY=…`'s). Only their SHA-256 digests are
kept; a key never reaches a log, a metric or the Serve config.

The directory is read again when it changes, so a key added or removed on disk reaches the running
ingress without a restart (on the cluster the CSI driver rewrites the files on its rotation poll,
``manifests/hf_token.py``). A request looks at the directory
at most once every ``RELOAD_INTERVAL_S`` (``stat`` calls only: the names, inodes, sizes and
modification times of the entries), and the keys are read again only when that changed. So every
request that starts ``RELOAD_INTERVAL_S`` after a file changed is answered with the new keys.

With a cache-salt secret (``cache_salt_file``: a file of a secret the stack generates, mounted as
the keys are), every request's ``cache_salt`` is set from the key it came with: an HMAC-SHA256 of
the key's digest under that secret, and of the client's own ``cache_salt`` if it sent one
(:func:`tenant_salt`). vLLM keys the first KV block of a prompt by its salt, and every later block by
the one before, so requests under different keys never share cached blocks: no key holder can time
whether another key's prompt is cached (vLLM's CVE-2025-46570; its RFC 16016 has the salt come from
the server, since a client can send anyone's salt). A client's salt divides its own key's cache
further and reaches no other key's. The secret makes the salts the same on every ingress replica and
after a restart, and unguessable from a key's digest alone.

No ``from __future__ import annotations`` here: FastAPI reads the routes' signatures, and the one
parameter added below must carry a real class, not a string to resolve in this module.
"""

import functools
import hashlib
import hmac
import inspect
import logging
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse
from ray.llm._internal.serve.core.ingress.ingress import DEFAULT_ENDPOINTS
from ray.serve.llm.ingress import OpenAiIngress
from starlette.datastructures import Headers
from starlette.middleware import Middleware

# The parameter FastAPI fills with the request for a route whose own signature has none (/v1/models).
REQUEST_PARAMETER = "_api_key_request"
GUARDED = "__api_key_guarded__"

MISSING = (
    "You didn't provide an API key. You need to provide your API key in an Authorization header "
    "using Bearer auth (i.e. Authorization: Bearer YOUR_KEY)."
)
INCORRECT = "Incorrect API key provided."
# How stale the ingress's keys may be, in seconds, once the files on disk have changed.
RELOAD_INTERVAL_S = 5.0

logger = logging.getLogger(__name__)


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


def key_files_fingerprint(directory: str) -> tuple:
    """What changes whenever a key file of ``directory`` is added, removed or rewritten: the
    directory's own identity and time, and each entry's name with its target's inode, size and
    time (the CSI driver's files are links into a ``..data`` folder it swaps whole)."""
    folder = os.stat(directory)
    entries = []
    with os.scandir(directory) as scan:
        for entry in scan:
            try:
                target = entry.stat()
            except FileNotFoundError:  # removed, or a dangling link while the driver swaps
                continue
            entries.append((entry.name, target.st_ino, target.st_size, target.st_mtime_ns))
    return (folder.st_ino, folder.st_mtime_ns, tuple(sorted(entries)))


class KeyDirectory:
    """The digests of the keys in ``directory``, kept current: checked at most once every
    ``interval_s`` and read again only when :func:`key_files_fingerprint` changed."""

    def __init__(
        self, directory: str, *, interval_s: float = RELOAD_INTERVAL_S, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.directory = directory
        self.interval_s = interval_s
        self._clock = clock
        # Fingerprint first: a change made while the keys are read shows as a change next time. A
        # missing directory is read_key_digests's to name.
        self._fingerprint = key_files_fingerprint(directory) if os.path.isdir(directory) else ()
        self._digests = read_key_digests(directory)
        self._checked_at = clock()

    def digests(self) -> frozenset[bytes]:
        now = self._clock()
        if now - self._checked_at >= self.interval_s:
            self._checked_at = now
            self._reload_if_changed()
        return self._digests

    def _reload_if_changed(self) -> None:
        try:
            fingerprint = key_files_fingerprint(self.directory)
            if fingerprint == self._fingerprint:
                return
            digests = read_key_digests(self.directory)
        except (OSError, RuntimeError) as error:
            # No key left, or no directory: refuse every request rather than keep a removed key.
            # The fingerprint stays, so the next check reads again.
            if self._digests:
                logger.warning("API keys: %s; every request is refused until a key is back", error)
            self._digests = frozenset()
            return
        if digests != self._digests:
            logger.info("API keys: %d key(s) in %s, read again after a change", len(digests), self.directory)
        self._fingerprint, self._digests = fingerprint, digests


def presented_digest(headers: Any) -> bytes | None:
    """The SHA-256 of the bearer key ``headers`` carry, or None when they carry none."""
    scheme, _, presented = (headers.get("authorization") or "").strip().partition(" ")
    presented = presented.strip()
    if scheme.lower() != "bearer" or not presented:
        return None
    return hashlib.sha256(presented.encode()).digest()


def refusal(headers: Any, digests: frozenset[bytes]) -> JSONResponse | None:
    """None when ``headers`` carry one of the keys; else the 401 OpenAI answers with."""
    digest = presented_digest(headers)
    if digest is None:
        message, code = MISSING, None
    else:
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


def read_salt_secret(path: str) -> bytes:
    """The cache-salt secret in the file ``path`` (surrounding whitespace dropped)."""
    try:
        secret = Path(path).read_text().strip()
    except OSError as error:
        raise RuntimeError(f"the cache-salt secret {path} cannot be read: {error.strerror}") from None
    if not secret:
        raise RuntimeError(f"the cache-salt secret {path} is empty")
    return secret.encode()


def tenant_salt(secret: bytes, key_digest: bytes, client_salt: str | None) -> str:
    """The ``cache_salt`` of a request made with the key whose SHA-256 is ``key_digest``: HMAC-SHA256
    under ``secret`` of that digest, then of the client's own salt (a digest is 32 bytes, so the two
    never run together)."""
    message = key_digest + (b"\x00" + client_salt.encode() if client_salt else b"")
    return hmac.new(secret, message, hashlib.sha256).hexdigest()


def salt_requests(values: Any, secret: bytes, key_digest: bytes) -> None:
    """Sets ``cache_salt`` on each request model among ``values`` (a route's arguments) that has one."""
    for value in values:
        if "cache_salt" in getattr(type(value), "model_fields", {}):
            value.cache_salt = tenant_salt(secret, key_digest, value.cache_salt)


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
        refused = refusal(request.headers, self._api_keys.digests())
        if refused is not None:
            return refused
        digest = presented_digest(request.headers)  # one of the keys': the refusal above passed
        if self._salt_secret is not None and digest is not None:
            salt_requests([*args, *kwargs.values()], self._salt_secret, digest)
        return await route(self, *args, **kwargs)

    if own is None:
        extra = inspect.Parameter(REQUEST_PARAMETER, inspect.Parameter.KEYWORD_ONLY, annotation=Request)
        checked.__signature__ = signature.replace(parameters=[*signature.parameters.values(), extra])  # type: ignore[attr-defined]
    setattr(checked, GUARDED, True)
    return checked


class KeyCheck:
    """ASGI middleware: an HTTP request without one of the keys gets the 401, whatever its path."""

    def __init__(self, app: Any, *, keys: KeyDirectory) -> None:
        self.app = app
        self.keys = keys

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] == "http":
            refused = refusal(Headers(scope=scope), self.keys.digests())
            if refused is not None:
                await refused(scope, receive, send)
                return
        await self.app(scope, receive, send)


def check_every_request(app: Any, keys: KeyDirectory) -> None:
    """Puts :class:`KeyCheck` innermost in ``app``'s middleware, just before its router: Ray's own
    middleware (request ids, HTTP metrics, CORS, its error handling) sees a refusal as it sees a
    route's own 401. Starlette builds the middleware stack at the app's first call, after this."""
    if not isinstance(app, FastAPI):
        raise TypeError(f"the keyed ingress serves a FastAPI app, not {type(app).__name__}")
    app.user_middleware.append(Middleware(KeyCheck, keys=keys))


class KeyedOpenAiIngress(OpenAiIngress):
    """``OpenAiIngress`` that answers only requests with one of the keys in ``api_key_dir``, each key's
    requests under a prefix cache of their own when there is a ``cache_salt_file``."""

    def __init__(self, *args: Any, api_key_dir: str, cache_salt_file: str | None = None, **kwargs: Any) -> None:
        # Read before the parent starts anything: a replica without keys fails at start, loudly.
        self._api_keys = KeyDirectory(api_key_dir)
        self._salt_secret = read_salt_secret(cache_salt_file) if cache_salt_file else None
        super().__init__(*args, **kwargs)

    # Serve's replica wrapper (ray.serve._private.http_util.ASGIAppReplicaWrapper, the class
    # serve.ingress mixes in after this one) stores the FastAPI app it serves as ``self._asgi_app``
    # once this constructor has run; the app Ray's builder made is reached nowhere else. A property
    # here catches that assignment, however the wrapper makes it, and puts the key check in.
    @property
    def _asgi_app(self) -> Any:
        return self.__dict__["_keyed_asgi_app"]

    @_asgi_app.setter
    def _asgi_app(self, app: Any) -> None:
        check_every_request(app, self._api_keys)
        self.__dict__["_keyed_asgi_app"] = app


for _name in DEFAULT_ENDPOINTS:
    setattr(KeyedOpenAiIngress, _name, guarded(getattr(OpenAiIngress, _name)))
