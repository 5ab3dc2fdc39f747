"""Backends made for the conformance tests: the CPU backend's library under another device type, with some of
its kernels replaced (a plugin's kernel overrides: ``llaisys_kernels``) or left out (a partial backend)."""

from __future__ import annotations

import pytest

from helpers.cpu_library_backend import install
from llaisys import plugins
from llaisys.ops._dispatch import clear_plans

pytest.importorskip("llaisys_backend_cpu", reason="the fake backends reuse the CPU backend's library")


@pytest.fixture
def fake_backend():
    """use(name, overrides={op: make(cpu_kernel) -> kernel}, missing=(), native=None) -> the device type: the
    process registry becomes the installed backends plus ``name``, whose op kernels are the CPU library's, but
    those ``overrides`` makes from them (a plugin's llaisys_kernels), those ``native`` makes from them (the
    backend's own) and those ``missing`` leaves out. Restored afterwards."""
    saved = plugins._registry

    def use(name: str, overrides=None, missing=(), native=None):
        return install(name, overrides, missing, native)

    yield use
    plugins._registry = saved
    clear_plans()
