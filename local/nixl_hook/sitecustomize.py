"""Imported by Python at start-up in every process of a local run (``local.nixl_hook.enable`` puts
this folder on ``PYTHONPATH``): NIXL agents made in this process get the progress-thread delay the
environment names. Nothing happens unless the environment names one, and nothing loads until NIXL's
bindings do."""

from __future__ import annotations

import importlib.abc
import os
import sys

DELAY_ENV = "PD_SERVING_NIXL_PROGRESS_DELAY_US"
# The extension module NIXL's Python agent calls (``nixlBind.nixlAgent(name, config)``), one per CUDA build.
BINDINGS = ("nixl_cu12._bindings", "nixl_cu13._bindings")
# The delays set on agents made in this process, for whoever wants to see that it took.
applied: list[int] = []


def _agent_with_delay(agent_class, delay_us: int):
    def make_agent(name, config):
        config.pthrDelay = delay_us
        applied.append(delay_us)
        return agent_class(name, config)

    return make_agent


class _SetDelayOnLoad(importlib.abc.Loader):
    def __init__(self, loader, delay_us: int):
        self.loader, self.delay_us = loader, delay_us

    def create_module(self, spec):
        return self.loader.create_module(spec)

    def exec_module(self, module):
        self.loader.exec_module(module)
        module.nixlAgent = _agent_with_delay(module.nixlAgent, self.delay_us)


class _BindingsFinder(importlib.abc.MetaPathFinder):
    def __init__(self, delay_us: int):
        self.delay_us = delay_us

    def find_spec(self, name, path, target=None):
        if name not in BINDINGS:
            return None
        for finder in sys.meta_path:
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(name, path, target)
            if spec is not None and spec.loader is not None:
                spec.loader = _SetDelayOnLoad(spec.loader, self.delay_us)
                return spec
        return None


def _install() -> None:
    value = os.environ.get(DELAY_ENV, "")
    if value.isdigit() and int(value) > 0:
        sys.meta_path.insert(0, _BindingsFinder(int(value)))


_install()
