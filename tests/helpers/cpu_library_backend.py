"""The CPU backend's library under another device type, with some of its kernels replaced (a plugin's kernel
overrides: ``llaisys_kernels``) or left out (a partial backend): backends for the conformance and fallback tests."""

from __future__ import annotations

import importlib.metadata

import llaisys
from llaisys import plugins
from llaisys.backend import DLPACK_CPU
from llaisys.ops._dispatch import clear_plans


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

    def __init__(self, name: str, library, missing=(), native=None):
        super().__init__(name, library, "llaisys_cpu", dlpack_device_type=DLPACK_CPU)
        self.missing, self.native = set(missing), dict(native or {})

    def kernel(self, op):
        if op in self.missing:
            return None
        kernel = super().kernel(op)
        return self.native[op](kernel) if op in self.native else kernel


def install(name: str, overrides=None, missing=(), native=None) -> str:
    """Make the process registry the installed backends plus ``name``, whose op kernels are the CPU library's,
    but those ``overrides`` ({op: make(cpu_kernel) -> kernel}) makes from them (a plugin's llaisys_kernels),
    those ``native`` makes from them (the backend's own) and those ``missing`` leaves out. The caller restores
    ``plugins._registry`` (and calls ``clear_plans``) afterwards; returns ``name``."""
    import llaisys_backend_cpu

    backend = CpuLibraryBackend(name, llaisys_backend_cpu.LIBRARY, missing, native)

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
