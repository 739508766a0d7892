"""`make local API_KEY=…`: the key comes from the environment (never a command line), in one line when
it is missing, and the refused flags of the command stay one line too."""

from __future__ import annotations

import argparse

import pytest

from local.errors import StartupFailure
from local.server import _api_keys, main


def test_each_key_is_read_from_the_variable_named(monkeypatch):
    monkeypatch.setenv("MY_KEY", "  sk-local-1 \n")
    monkeypatch.setenv("OTHER_KEY", "sk-local-2")
    assert _api_keys(argparse.Namespace(api_key_env=["MY_KEY"])) == ["sk-local-1"]
    assert _api_keys(argparse.Namespace(api_key_env=["MY_KEY", "OTHER_KEY"])) == ["sk-local-1", "sk-local-2"]
    assert _api_keys(argparse.Namespace(api_key_env=None)) == []


@pytest.mark.parametrize("value", [None, "", "   "])
def test_a_missing_or_empty_variable_is_one_line_naming_it(monkeypatch, value):
    if value is None:
        monkeypatch.delenv("MY_KEY", raising=False)
    else:
        monkeypatch.setenv("MY_KEY", value)
    with pytest.raises(StartupFailure) as refused:
        _api_keys(argparse.Namespace(api_key_env=["MY_KEY"]))
    assert str(refused.value) == "--api-key-env MY_KEY: the variable is empty or not set; set it to the key"


def test_a_prefix_of_the_flag_is_refused_not_taken_for_it(capsys):
    with pytest.raises(SystemExit) as refused:
        main(["--api-key", "sk-local-1"])
    assert refused.value.code == 2
    err = capsys.readouterr().err
    assert "unrecognized arguments: --api-key sk-local-1" in err
