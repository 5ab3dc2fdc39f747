"""Backend discovery: entry points -> pluggy hooks -> one Backend per device type.

Hooks are called once per process. Each entry point is loaded and called on its own,
so one broken plugin is recorded in ``backend_report()`` while every other loads.
"""

from __future__ import annotations

import dataclasses
import importlib.metadata
import os
import threading
from collections.abc import Callable

import pluggy

from .backend import Backend
from .device import Device, as_device
from .errors import BackendUnavailableError, LlaisysError

API_VERSION = 2  # LLAISYS_API_VERSION of include/llaisys/backend.h
PROJECT = "llaisys"
ENTRY_POINT_GROUP = "llaisys.backends"
ENV_FILTER = "LLAISYS_BACKENDS"

hookspec = pluggy.HookspecMarker(PROJECT)
hookimpl = pluggy.HookimplMarker(PROJECT)


@dataclasses.dataclass
class BackendSpec:
    """A cheap descriptor; ``load()`` does the expensive part (open the .so, init the driver)."""

    name: str  # device type: "cpu", "cuda", ...
    load: Callable[[], Backend]
    api_version: int = API_VERSION
    priority: int = 0  # the highest wins when two plugins offer one device type


@dataclasses.dataclass
class KernelOverride:
    """A third-party kernel replacing a backend's ``op`` on ``device_type``."""

    op: str
    device_type: str
    kernel: Callable  # kernel(device_index, stream, *op_args)
    priority: int = 0


class _Specs:
    @hookspec
    def llaisys_backends(self) -> list[BackendSpec]:
        """Return the backends this plugin offers (called once per process)."""

    @hookspec
    def llaisys_kernels(self) -> list[KernelOverride]:
        """Return kernel overrides (called once per process)."""


@dataclasses.dataclass
class BackendRecord:
    """One row of ``backend_report()``."""

    name: str
    package: str
    version: str
    status: str  # "loaded" | "no device" | "failed" | "disabled" | "shadowed"
    reason: str = ""
    devices: int = 0
    priority: int = 0
    backend: Backend | None = dataclasses.field(default=None, repr=False)


def _install_hint(device_type: str) -> str:
    return f"pip install llaisys-backend-{device_type}"


class Registry:
    """The backends found in this process, their kernels and their allocators."""

    def __init__(self, entry_points=None, env_filter: str | None = None):
        self.plugin_manager = pluggy.PluginManager(PROJECT)
        self.plugin_manager.add_hookspecs(_Specs)
        if entry_points is None:
            entry_points = importlib.metadata.entry_points(group=ENTRY_POINT_GROUP)
        if env_filter is None:
            env_filter = os.environ.get(ENV_FILTER, "")
        self.allowed = {n.strip() for n in env_filter.split(",") if n.strip()} or None
        self.records: list[BackendRecord] = []
        self.backends: dict[str, BackendRecord] = {}
        self._overrides: dict[tuple[str, str], KernelOverride] = {}
        self._kernels: dict[tuple[str, str], Callable] = {}
        self._allocators: dict[Device, object] = {}
        self._lock = threading.Lock()
        for ep in entry_points:
            self._load_entry_point(ep)

    # -- discovery -----------------------------------------------------------------

    def _load_entry_point(self, ep):
        package, version = _distribution_of(ep)
        if self.allowed is not None and ep.name not in self.allowed:
            self.records.append(BackendRecord(ep.name, package, version, "disabled",
                                              f"not in {ENV_FILTER}={','.join(sorted(self.allowed))}"))
            return
        try:
            plugin = ep.load()
            self.plugin_manager.register(plugin, name=f"{package}:{ep.name}")
            specs = self._call_hook(plugin, "llaisys_backends") or []
            for override in self._call_hook(plugin, "llaisys_kernels") or []:
                key = (override.op, override.device_type)
                if key not in self._overrides or override.priority > self._overrides[key].priority:
                    self._overrides[key] = override
        except Exception as e:  # a broken plugin never stops the others
            self.records.append(BackendRecord(ep.name, package, version, "failed", _describe(e)))
            return
        if not specs:
            self.records.append(BackendRecord(ep.name, package, version, "failed",
                                              "the plugin's llaisys_backends hook returned no backend"))
        for spec in specs:
            self._load_spec(spec, package, version)

    def _call_hook(self, plugin, hook_name):
        results = []
        for impl in getattr(self.plugin_manager.hook, hook_name).get_hookimpls():
            if impl.plugin is plugin:
                results.extend(impl.function() or [])
        return results

    def _load_spec(self, spec: BackendSpec, package: str, version: str):
        record = BackendRecord(spec.name, package, version, "failed", priority=spec.priority)
        self.records.append(record)
        if spec.api_version != API_VERSION:
            record.reason = (f"backend API version {spec.api_version}, but llaisys-core {_core_version()} "
                             f"speaks version {API_VERSION}; install matching versions of llaisys-core and {package}")
            return
        try:
            backend = spec.load()
            native_version = getattr(backend, "api_version", API_VERSION)
            if native_version != API_VERSION:
                record.reason = (f"native library speaks API version {native_version}, core expects "
                                 f"{API_VERSION}; reinstall {package}")
                return
            record.devices = backend.device_count()
        except Exception as e:
            record.reason = f"{_describe(e)}; reinstall with 'pip install --force-reinstall {package}' " \
                            f"or check the device driver"
            return
        record.backend = backend
        if record.devices == 0:
            record.status, record.reason = "no device", "installed, but the runtime reports 0 devices"
            return
        record.status = "loaded"
        current = self.backends.get(spec.name)
        if current is not None and current.priority >= spec.priority:
            record.status, record.reason = "shadowed", f"{current.package} has priority {current.priority}"
            return
        if current is not None:
            current.status, current.reason = "shadowed", f"{package} has priority {spec.priority}"
        self.backends[spec.name] = record

    # -- lookups -------------------------------------------------------------------

    def available_devices(self) -> list[Device]:
        ordered = sorted(self.backends.values(), key=lambda r: (r.name == "cpu", -r.priority, r.name))
        return [Device(r.name, i) for r in ordered for i in range(r.devices)]

    def backend(self, device) -> Backend:
        """The backend that serves ``device``, or an error that says why none does."""
        device = as_device(device)
        record = self.backends.get(device.type)
        if record is not None:
            if device.index >= record.devices:
                raise BackendUnavailableError(
                    f"device {device} does not exist: backend '{device.type}' ({record.package}) "
                    f"has {record.devices} device(s)")
            return record.backend
        raise BackendUnavailableError(self._why_missing(device.type))

    def _why_missing(self, device_type: str) -> str:
        found = [r for r in self.records if r.name == device_type]
        loaded = sorted(self.backends) or ["none"]
        if not found:
            return (f"No llaisys backend provides '{device_type}'. Installed: {', '.join(loaded)}. "
                    f"Install: {_install_hint(device_type)}")
        r = found[-1]
        if r.status == "disabled":
            return f"the '{device_type}' backend ({r.package}) is {r.reason}; add it to {ENV_FILTER}"
        if r.status == "no device":
            return (f"the '{device_type}' backend ({r.package} {r.version}) is installed but found no "
                    f"device: check that the hardware and its driver are present")
        return f"the '{device_type}' backend ({r.package} {r.version}) failed to load: {r.reason}"

    def kernel(self, op: str, device_type: str):
        """Resolved once per (op, device type), then served from a dict."""
        key = (op, device_type)
        fn = self._kernels.get(key)
        if fn is None:
            override = self._overrides.get(key)
            fn = override.kernel if override else self.backend(Device(device_type)).kernel(op)
            if fn is None:
                raise LlaisysError(f"op '{op}' is not implemented by the '{device_type}' backend "
                                   f"({self.backends[device_type].package})")
            self._kernels[key] = fn
        return fn

    def allocator(self, device: Device):
        allocator = self._allocators.get(device)
        if allocator is None:
            from .allocator import CachingAllocator
            with self._lock:
                allocator = self._allocators.get(device)
                if allocator is None:
                    allocator = CachingAllocator(self.backend(device), device)
                    self._allocators[device] = allocator
        return allocator


def _distribution_of(ep) -> tuple[str, str]:
    dist = getattr(ep, "dist", None)
    if dist is None:
        return ep.value.split(".")[0].split(":")[0], "?"
    return dist.metadata["Name"], dist.version


def _core_version() -> str:
    try:
        return importlib.metadata.version("llaisys-core")
    except importlib.metadata.PackageNotFoundError:
        return "?"


def _describe(e: BaseException) -> str:
    return f"{type(e).__name__}: {e}"


_registry: Registry | None = None
_registry_lock = threading.Lock()


def registry() -> Registry:
    """The process-wide registry, discovered on first use."""
    global _registry
    if _registry is None:
        with _registry_lock:
            if _registry is None:
                _registry = Registry()
    return _registry


def available_devices() -> list[Device]:
    """Every device of every loaded backend, accelerators first, CPU last."""
    return registry().available_devices()


def backend_report() -> list[BackendRecord]:
    """One row per discovered plugin: loaded, no device, failed (with why), disabled or shadowed."""
    return list(registry().records)


def format_backend_report(records: list[BackendRecord]) -> str:
    rows = [("backend", "package", "version", "status", "devices", "details")]
    rows += [(r.name, r.package, r.version, r.status, str(r.devices), r.reason) for r in records]
    widths = [max(len(row[i]) for row in rows) for i in range(5)]
    lines = ["  ".join(cell.ljust(w) for cell, w in zip(row, widths)) + "  " + row[5] for row in rows]
    if not records:
        lines.append("(no llaisys backend installed: pip install llaisys-backend-cpu)")
    return "\n".join(line.rstrip() for line in lines)
