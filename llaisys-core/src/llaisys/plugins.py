"""Backend discovery: entry points -> pluggy hooks -> one Backend per device type.

Hooks are called once per process. Each entry point is loaded and called on its own,
so one broken plugin is recorded in ``backend_report()`` while every other loads.
"""

from __future__ import annotations

import dataclasses
import importlib.metadata
import os
import threading
import warnings
from collections.abc import Callable

import pluggy

from ._version import __version__ as CORE_VERSION
from .abi import API_VERSION
from .backend import Backend
from .device import Device, as_device
from .errors import BackendUnavailableError, LlaisysError, LlaisysWarning

PROJECT = "llaisys"
ENTRY_POINT_GROUP = "llaisys.backends"
ENV_FILTER = "LLAISYS_BACKENDS"
# Device types with a llaisys backend package (installed from its folder of the llaisys source tree)
KNOWN_PACKAGES = {"cpu": "llaisys-backend-cpu", "cuda": "llaisys-backend-cuda", "iluvatar": "llaisys-backend-iluvatar"}

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
    kernel: Callable  # kernel(device_index, stream, *c_args) -> status, the op's C ABI (llaisys.abi.OP_SLOTS)
    priority: int = 0


class _Specs:
    @hookspec
    def llaisys_backends(self) -> list[BackendSpec]:
        """Return the backends this plugin offers (called once per process)."""
        raise NotImplementedError  # a specification: pluggy calls the plugins' implementations

    @hookspec
    def llaisys_kernels(self) -> list[KernelOverride]:
        """Return kernel overrides (called once per process)."""
        raise NotImplementedError


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
    """How to get a backend for ``device_type``, naming only packages that exist."""
    package = KNOWN_PACKAGES.get(device_type)
    if package is None:
        return f"No llaisys package provides it (backend packages exist for {', '.join(KNOWN_PACKAGES)})"
    return f"Install it from the llaisys source tree: pip install ./{package}"


class Registry:
    """The backends found in this process, their kernels and their allocators."""

    def __init__(self, entry_points=None, env_filter: str | None = None):
        self.plugin_manager = pluggy.PluginManager(PROJECT)
        self.plugin_manager.add_hookspecs(_Specs)
        if entry_points is None:
            entry_points = importlib.metadata.entry_points(group=ENTRY_POINT_GROUP)
        if env_filter is None:
            env_filter = os.environ.get(ENV_FILTER, "")
        self.env_filter = env_filter.strip()
        self.allowed = {n.strip() for n in env_filter.split(",") if n.strip()} or None
        self.records: list[BackendRecord] = []
        self.backends: dict[str, BackendRecord] = {}
        self._overrides: dict[tuple[str, str], KernelOverride] = {}
        self._kernels: dict[tuple[str, str], tuple[Callable, Callable]] = {}  # the one kernel cache
        self.kernel_wrapper: Callable | None = None  # wraps each kernel as it is resolved (llaisys.profiler)
        self._allocators: dict[Device, object] = {}
        self._lock = threading.Lock()
        entry_points = list(entry_points)
        for ep in entry_points:
            self._load_entry_point(ep)
        self._warn_unknown_filter_names({ep.name for ep in entry_points})

    def _warn_unknown_filter_names(self, installed: set[str]) -> None:
        unknown = sorted((self.allowed or set()) - installed)
        if unknown:
            names = ", ".join(repr(n) for n in unknown)
            warnings.warn(f"{ENV_FILTER}={self.env_filter} names {names}, which no installed backend provides; "
                          f"installed backends: {', '.join(sorted(installed)) or 'none'}", LlaisysWarning, stacklevel=2)

    # -- discovery -----------------------------------------------------------------

    def _load_entry_point(self, ep):
        package, version = _distribution_of(ep)
        if self.allowed is not None and ep.name not in self.allowed:
            self.records.append(BackendRecord(ep.name, package, version, "disabled",
                                              f"disabled by {ENV_FILTER}={self.env_filter}"))
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

    def _call_hook(self, plugin, hook_name) -> list:
        results: list = []
        for impl in getattr(self.plugin_manager.hook, hook_name).get_hookimpls():
            if impl.plugin is plugin:
                results.extend(impl.function() or [])
        return results

    def _load_spec(self, spec: BackendSpec, package: str, version: str):
        record = BackendRecord(spec.name, package, version, "failed", priority=spec.priority)
        self.records.append(record)
        if spec.api_version != API_VERSION:
            record.reason = (f"backend API version {spec.api_version}, but llaisys-core {CORE_VERSION} "
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
            why = _no_device_reason(backend)
            record.status = "no device"
            record.reason = f"the runtime reports 0 devices: {why}" if why else "the runtime reports 0 devices"
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

    def why_no_device(self) -> str:
        """One line on why ``available_devices()`` is empty: each plugin's state, or what to install."""
        if not self.records:
            return f"no llaisys backend is installed. {_install_hint('cpu')}"
        def state(r: BackendRecord) -> str:
            if not r.reason or r.reason.startswith(r.status):
                return r.reason or r.status
            return f"{r.status}: {r.reason}"
        return "no llaisys device is available: " + "; ".join(f"'{r.name}' ({r.package}) {state(r)}"
                                                              for r in self.records)

    def backend(self, device) -> Backend:
        """The backend that serves ``device``, or an error that says why none does."""
        device = as_device(device)
        record = self.backends.get(device.type)
        if record is not None:
            if device.index >= record.devices:
                raise BackendUnavailableError(
                    f"device {device} does not exist: backend '{device.type}' ({record.package}) "
                    f"has {record.devices} device(s)")
            assert record.backend is not None  # self.backends holds loaded records only
            return record.backend
        raise BackendUnavailableError(self._why_missing(device.type))

    def _why_missing(self, device_type: str) -> str:
        found = [r for r in self.records if r.name == device_type]
        if not found:
            installed = ", ".join(sorted(self.backends)) or "none"
            disabled = [r.name for r in self.records if r.status == "disabled"]
            if disabled:
                installed += f" ({', '.join(disabled)} disabled by {ENV_FILTER}={self.env_filter})"
            return f"No llaisys backend provides '{device_type}'. Installed: {installed}. {_install_hint(device_type)}"
        r = found[-1]
        if r.status == "disabled":
            return (f"the '{device_type}' backend ({r.package}) is installed but {r.reason}; "
                    f"add '{device_type}' to {ENV_FILTER} to use it")
        if r.status == "no device":
            return (f"the '{device_type}' backend ({r.package} {r.version}) is installed but found no "
                    f"device ({r.reason}): check that the hardware and its driver are present")
        return f"the '{device_type}' backend ({r.package} {r.version}) failed to load: {r.reason}"

    def host_addressable(self, device) -> bool:
        """Whether the host reads and writes ``device``'s memory directly (its backend's capability)."""
        device = as_device(device)
        return self.backend(device).host_addressable(device.index)

    def kernel(self, op: str, device_type: str):
        """The kernel for (op, device type): a plugin's override, else the backend's; resolved once."""
        return self.launcher(op, device_type)[0]

    def launcher(self, op: str, device_type: str) -> tuple[Callable, Callable]:
        """(kernel, fail): ``kernel(device_index, stream, *c_args) -> status`` and ``fail(status)``, which
        raises the error for a non-zero status. Resolved once per (op, device type): the one kernel cache."""
        key = (op, device_type)
        found = self._kernels.get(key)
        if found is None:
            override = self._overrides.get(key)
            if override is not None:
                found = (override.kernel, _override_failure(op, device_type))
            else:
                backend = self.backend(Device(device_type))
                fn = backend.kernel(op)
                if fn is None:
                    raise LlaisysError(f"op '{op}' is not implemented by the '{device_type}' backend "
                                       f"({self.backends[device_type].package})")
                found = (fn, _backend_failure(backend, op))
            if self.kernel_wrapper is not None:
                found = (self.kernel_wrapper(op, device_type, found[0]), found[1])
            self._kernels[key] = found
        return found

    def clear_kernels(self) -> None:
        """Forget the resolved kernels (``llaisys.ops`` drops its plans too: ``llaisys.ops.clear_plans``)."""
        self._kernels.clear()

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


def _describe(e: BaseException) -> str:
    return f"{type(e).__name__}: {e}"


def _no_device_reason(backend: Backend) -> str:
    try:
        return backend.no_device_reason().strip()
    except Exception as e:  # a report must not fail because a backend cannot say why
        return _describe(e)


def _backend_failure(backend: Backend, op: str) -> Callable[[int], None]:
    def fail(status: int) -> None:
        backend.raise_status(status, op)
    return fail


def _override_failure(op: str, device_type: str) -> Callable[[int], None]:
    def fail(status: int) -> None:
        raise LlaisysError(f"the kernel override of '{op}' on '{device_type}' failed with status {status}")
    return fail


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


def why_no_device() -> str:
    """Why no device is available, in one line naming each plugin's state (for a "no device" error)."""
    return registry().why_no_device()


def backend_report() -> list[BackendRecord]:
    """One row per discovered plugin: loaded, no device, failed (with why), disabled or shadowed."""
    return list(registry().records)
