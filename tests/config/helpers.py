"""Helpers the config tests share: the loader's message for a config, and the shipped dev config with a change."""

from __future__ import annotations

import pytest
from pydantic import BaseModel

from config.loader import ConfigError, load_config, parse_config
from tests.conftest import CONFIG_DIR


def problems_for(data: dict) -> str:
    """What parse_config reports for ``data`` (a config as a dict), which it must refuse."""
    with pytest.raises(ConfigError) as caught:
        parse_config(data, source="test.yaml")
    return str(caught.value)


def dev_config():
    return load_config(CONFIG_DIR / "dev.yaml")


def changed(model: BaseModel, path: str, value):
    """A copy of a frozen model with the dotted field ``path`` set to ``value``, not validated, so
    that a rule can be called on a config that validation would refuse."""
    head, _, rest = path.partition(".")
    new = changed(getattr(model, head), rest, value) if rest else value
    return model.model_copy(update={head: new})
