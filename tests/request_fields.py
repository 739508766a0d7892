"""A valid, non-default value for every field of vLLM's OpenAI request models, derived from the
field's type and constraints, so a field that a later vLLM adds is swept without being named here.

``VALUES`` holds the few fields whose type says too little (a token id as a dict key, a schema the
structured-output backend must accept, a field that only means something with another one);
everything else comes from :func:`derived`. A type nothing here can derive a value for fails
loudly, naming the field, rather than being skipped.
"""

from __future__ import annotations

import dataclasses
import types
import typing
from typing import Any

from pydantic import BaseModel
from pydantic_core import PydanticUndefined

# The model's own vocabulary: byte-level, so token 97 is "a" (local/tiny_model.py).
TOKEN_ID = 97
# Fields of the base requests below, not swept.
BASE_FIELDS = {"model", "messages", "prompt"}

# Where the type says too little. Each entry is the fields sent together: n > 1 only means
# something when sampling (vLLM refuses it at temperature 0; the base's seed keeps it reproducible),
# stream options only with a stream, top logprobs only with logprobs.
VALUES: dict[str, dict[str, Any]] = {
    "logit_bias": {"logit_bias": {str(TOKEN_ID): 5.0}},
    "n": {"n": 2, "temperature": 1.0},
    "response_format": {"response_format": {"type": "json_object"}},
    "structured_outputs": {"structured_outputs": {"regex": "[a-z]{4}"}},
    "repetition_detection": {"repetition_detection": {"max_pattern_size": 2, "min_count": 3}},
    "top_logprobs": {"top_logprobs": 2, "logprobs": True},
    "stream_options": {"stream_options": {"include_usage": True}, "stream": True},
}


def base_request(kind: str, model: str) -> dict[str, Any]:
    """A greedy, seeded request whose prompt is long enough for the remote prefill of P/D."""
    prompt = "the parity of every field " + "the quick brown fox jumps over the lazy dog " * 2
    body: dict[str, Any] = {"model": model, "max_tokens": 8, "temperature": 0, "seed": 7}
    if kind == "chat":
        body["messages"] = [{"role": "user", "content": prompt}]
    else:
        body["prompt"] = prompt
    return body


def sweep(request_model: type[BaseModel]) -> dict[str, dict[str, Any]]:
    """For every field of ``request_model`` but the base ones: the fields to send with it."""
    cases = {}
    for name, field in request_model.model_fields.items():
        if name in BASE_FIELDS:
            continue
        if name in VALUES:
            cases[name] = VALUES[name]
            continue
        default = None if field.default is PydanticUndefined else field.default
        try:
            cases[name] = {field.alias or name: derived(field.annotation, default, list(field.metadata))}
        except TypeError as error:
            raise TypeError(f"{request_model.__name__}.{name}: {error}; give it a value in VALUES") from None
    return cases


def derived(annotation: Any, default: Any = None, metadata: list[Any] | None = None) -> Any:
    """A JSON value of type ``annotation``, other than ``default``, within the constraints in ``metadata``."""
    metadata = list(metadata or [])
    origin = typing.get_origin(annotation)
    if origin is typing.Annotated:
        inner, *extra = typing.get_args(annotation)
        return derived(inner, default, metadata + extra)
    if origin in (typing.Union, types.UnionType):
        for arm in typing.get_args(annotation):
            if arm is not type(None):
                try:
                    return derived(arm, default, metadata)
                except TypeError:
                    continue
        raise TypeError(f"no arm of {annotation!r} gives a value other than {default!r}")
    if origin is typing.Literal:
        others = [value for value in typing.get_args(annotation) if value != default]
        if not others:
            raise TypeError(f"{annotation!r} has no value other than {default!r}")
        return others[0]
    if annotation is bool:
        return not default
    if annotation is int:
        value = max(2, (default or 0) + 1)
        return _within(value, metadata)
    if annotation is float:
        return 0.5 if default != 0.5 else 0.25
    if annotation is str or annotation is Any:
        return "parity"
    if annotation is bytes:
        return "cGFyaXR5"  # base64, as JSON carries bytes
    if origin is list:
        (item,) = typing.get_args(annotation)
        return [TOKEN_ID if item is int else derived(item)]
    if origin is dict:
        key, value = typing.get_args(annotation)
        return {derived(key): derived(value)}
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return _model_value(annotation.model_fields)
    if dataclasses.is_dataclass(annotation):
        fields = {f.name: f for f in dataclasses.fields(annotation) if f.init}
        return _dataclass_value(fields)
    raise TypeError(f"no value can be derived from {annotation!r}")


def _within(value: int, metadata: list[Any]) -> int:
    for constraint in metadata:
        if getattr(constraint, "ge", None) is not None:
            value = max(value, constraint.ge)
        if getattr(constraint, "le", None) is not None:
            value = min(value, constraint.le)
    return value


def _model_value(fields: dict[str, Any]) -> dict[str, Any]:
    """The required fields, or else the first one, of a nested model."""
    required = {n: f for n, f in fields.items() if f.is_required()}
    chosen = required or dict([next(iter(fields.items()))])
    value = {}
    for name, field in chosen.items():
        default = None if field.default is PydanticUndefined else field.default
        value[field.alias or name] = derived(field.annotation, default, list(field.metadata))
    return value


def _dataclass_value(fields: dict[str, dataclasses.Field]) -> dict[str, Any]:
    required = {
        n: f for n, f in fields.items() if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING
    }
    chosen = required or dict([next(iter(fields.items()))])
    return {
        name: derived(field.type, None if field.default is dataclasses.MISSING else field.default)
        for name, field in chosen.items()
    }
