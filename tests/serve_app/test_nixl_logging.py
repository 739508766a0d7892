"""NIXL's and vLLM's logging set-up and Serve's replica log handler, in a fresh interpreter each
(NIXL configures logging once, at its first import)."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

pytestmark = pytest.mark.serving

PROBE = textwrap.dedent(
    """
    import logging, logging.handlers, sys, tempfile
    # Serve's replica logger: a MemoryHandler in front of the replica's log file.
    handler = logging.handlers.MemoryHandler(100, target=logging.FileHandler(tempfile.mktemp()))
    logging.getLogger("ray.serve").addHandler(handler)
    if sys.argv[1] == "guarded":
        from serve_app.callbacks import keep_log_handlers_open
        keep_log_handlers_open()
    import nixl._api  # NIXL's set-up at its first import
    from vllm.logger import _configure_vllm_root_logger
    _configure_vllm_root_logger()  # vLLM's, as it applies its logging config to an engine
    print("open" if handler.target is not None else "closed")
    print("nixl handler" if logging.getLogger("nixl").handlers else "no nixl handler")
    """
)


def probe(mode: str) -> list[str]:
    done = subprocess.run([sys.executable, "-c", PROBE, mode], capture_output=True, text=True, timeout=120, check=True)
    return done.stdout.split("\n")[:2]


def test_nixl_and_vllm_logging_set_up_closes_the_replicas_log_handler():
    """What made Serve's recovered controller replace the engine replicas after a GCS restart."""
    assert probe("plain") == ["closed", "nixl handler"]


def test_with_the_engine_callback_it_stays_open_and_nixl_logs_still_set_up():
    assert probe("guarded") == ["open", "nixl handler"]
