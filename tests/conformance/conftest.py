"""Backends made for the conformance tests: the CPU backend's library under another device type, with some of
its kernels replaced (a plugin's kernel overrides: ``llaisys_kernels``) or left out (a partial backend)."""

from __future__ import annotations

import importlib.metadata

import pytest

import llaisys
from llaisys import plugins
from llaisys.backend import DLPACK_CPU
from llaisys.ops._dispatch import clear_plans

llaisys_backend_cpu = pytest.importorskip("llaisys_backend_cpu", reason="the fake backends reuse the CPU backend's library")


class _EntryPoint:
    """An installed plugin's stand-in: the entry point's name, its distribution and the plugin object."""

    def __init__(self, name, plugin):
        self.name, self.value, self._plugin = name, f"{name}_plugin", plugin
        self.dist = type("Dist", (), {"metadata": {"Name": f"llaisys-backend-{name}"}, "version": "0.0.1"})()

    def load(self):
        return self._plugin


class CpuLibraryBackend(llaisys.NativeBackend):
    """The CPU backend's library as device type ``name``, without the kernels of ``missing`` and with those of
    ``native`` ({op: make(cpu_kernel) -> kernel}) made from the CPU's (the backend's own kernels: a non-zero
    status is turned into an exception as a compiled backend's is)."""

    def __init__(self, name: str, missing=(), native=None):
        super().__init__(name, llaisys_backend_cpu.LIBRARY, "llaisys_cpu", dlpack_device_type=DLPACK_CPU)
        self.missing, self.native = set(missing), dict(native or {})

    def kernel(self, op):
        if op in self.missing:
            return None
        kernel = super().kernel(op)
        return self.native[op](kernel) if op in self.native else kernel


@pytest.fixture
def fake_backend():
    """use(name, overrides={op: make(cpu_kernel) -> kernel}, missing=(), native=None) -> the device type: the
    process registry becomes the installed backends plus ``name``, whose op kernels are the CPU library's, but
    those ``overrides`` makes from them (a plugin's llaisys_kernels), those ``native`` makes from them (the
    backend's own) and those ``missing`` leaves out. Restored afterwards."""
    saved = plugins._registry

    def use(name: str, overrides=None, missing=(), native=None):
        backend = CpuLibraryBackend(name, missing, native)

        class Plugin:
            @llaisys.hookimpl
            def llaisys_backends(self):
                return [llaisys.BackendSpec(name, lambda: backend)]

            @llaisys.hookimpl
            def llaisys_kernels(self):
                return [llaisys.KernelOverride(op, name, make(backend.lib.kernel(op)))
                        for op, make in (overrides or {}).items()]

        installed = list(importlib.metadata.entry_points(group=plugins.ENTRY_POINT_GROUP))
        plugins._registry = plugins.Registry(entry_points=[*installed, _EntryPoint(name, Plugin())], env_filter="")
        clear_plans()
        return name

    yield use
    plugins._registry = saved
    clear_plans()
