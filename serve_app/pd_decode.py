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
replica does its handshake.

Ray's ``build_pd_openai_app`` picks its decode class by two module-level names of its builder
(``PDDecodeServer``; ``DPPDDecodeServer`` with data parallelism). :func:`build_pd_app` swaps those
names for the time of the call; everything else (prefill, ingress, options) is Ray's own code.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Iterator, Mapping
from typing import Any

from ray.llm._internal.serve.serving_patterns.prefill_decode import builder as pd_builder
from ray.llm._internal.serve.serving_patterns.prefill_decode.pd_server import DPPDDecodeServer, PDDecodeServer

logger = logging.getLogger(__name__)

# The names build_pd_openai_app reads its decode classes from, without and with data parallelism.
DECODE_CLASS_NAME = "PDDecodeServer"
DP_DECODE_CLASS_NAME = "DPPDDecodeServer"
RAYS_DECODE_CLASSES = {DECODE_CLASS_NAME: PDDecodeServer, DP_DECODE_CLASS_NAME: DPPDDecodeServer}
# How long decode waits before it runs Ray's prewarm again after Ray's own retries gave up.
PREWARM_PAUSE_S = 30.0


class BackgroundPrewarmPDDecodeServer(PDDecodeServer):
    """Ray's ``PDDecodeServer`` whose prewarm runs after the constructor, until it goes through."""

    _prewarm_task: asyncio.Task | None = None

    async def _maybe_prewarm(self) -> None:
        # Kept on the replica: the event loop holds tasks only weakly.
        self._prewarm_task = asyncio.get_running_loop().create_task(self._prewarm_until_done())

    async def _prewarm_until_done(self) -> None:
        while True:
            try:
                await super()._maybe_prewarm()
                return
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


def build_pd_app(pd_serving_args: dict[str, Any]):
    """``build_pd_openai_app(pd_serving_args)`` with decode's prewarm in the background."""
    classes = {
        DECODE_CLASS_NAME: BackgroundPrewarmPDDecodeServer,
        DP_DECODE_CLASS_NAME: BackgroundPrewarmDPPDDecodeServer,
    }
    with decode_classes(classes, "serving.prewarm_nixl", "set it to false"):
        return pd_builder.build_pd_openai_app(pd_serving_args)
