"""What the serve_app tests share."""

from __future__ import annotations

import os

import pytest


@pytest.fixture(scope="module")
def local_ray():
    """Building an LLM app asks Ray for its runtime context, which starts Ray: contain it per module."""
    ray = pytest.importorskip("ray", reason="the serving stack (requirements-serve.txt) is not installed")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    ray.init(address="local", num_cpus=1, include_dashboard=False, logging_level="ERROR")
    yield
    ray.shutdown()
