"""Backend discovery: entry points -> pluggy hooks -> one Backend per device type.

Hooks are called once per process. Each entry point is loaded and called on its own,
so one broken plugin is recorded in ``backend_report()`` while every other loads. A plugin
built for another major version of the backend ABI is refused, the reason naming both
versions and what to rebuild (backend.h: the versioning policy).

Kernels are resolved once per (op, device type): a plugin's override, else the backend's
own, else (a partial backend) the CPU backend's through ``llaisys.fallback``;
``capabilities(device)`` says which for every op slot.
"""

from __future__ import annotations

import dataclasses
import importlib.metadata
import os
import threading
import warnings
from collections.abc import Callable

import pluggy

from . import abi
from ._version import __version__ as CORE_VERSION
from .abi import API_VERSION, OP_SLOTS, split_version, version_text
from .backend import Backend
from .device import Device, as_device
from .errors import (
    ApiVersionError,
    BackendUnavailableError,
    LlaisysError,
    LlaisysValueError,
    LlaisysWarning,
    NotSupportedError,
)

PROJECT = "llaisys"
ENTRY_POINT_GROUP = "llaisys.backends"
ENV_FILTER = "LLAISYS_BACKENDS"
# Device types with a llaisys backend package (installed from its folder of the llaisys source tree)
KNOWN_PACKAGES = {"cpu": "llaisys-backend-cpu", "cuda": "llaisys-backend-cuda", "iluvatar": "llaisys-backend-iluvatar"}

# Where an op runs on a device (Registry.op_source, llaisys.capabilities)
NATIVE, OVERRIDE, FALLBACK, UNAVAILABLE = "native", "override", "fallback", "unavailable"

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
            for spec in specs:  # a plugin's mistake is its own failure, in one line, never discovery's
                if not isinstance(spec, BackendSpec):
                    raise TypeError(f"its llaisys_backends hook returned {_short(spec)} in its list, not a "
                                    f"llaisys.BackendSpec")
                if not isinstance(spec.name, str) or not spec.name.isidentifier():
                    raise ValueError(f"its BackendSpec names the device type {spec.name!r}, which is not an identifier")
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
                returned = impl.function() or []
                if not isinstance(returned, (list, tuple)):
                    raise TypeError(f"its {hook_name} hook returned {_short(returned)}, not a list")
                results.extend(returned)
        return results

    def _load_spec(self, spec: BackendSpec, package: str, version: str):
        record = BackendRecord(spec.name, package, version, "failed", priority=spec.priority)
        self.records.append(record)
        record.reason = _version_refusal(spec.api_version, package, version)
        if record.reason:
            return
        try:
            backend = spec.load()
            native_version = getattr(backend, "api_version", abi.API_VERSION)  # a compiled library's own
            record.reason = _version_refusal(native_version, package, version)
            if record.reason:
                return
            record.devices = backend.device_count()
        except ApiVersionError as e:  # NativeLibrary refuses another major before binding anything
            record.reason = _version_refusal(e.version, package, version)
            return
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
        if split_version(native_version)[1] < abi.API_MINOR:
            record.reason = (f"built for API {version_text(native_version)} (core: "
                             f"{version_text(abi.API_VERSION)}): the slots added since are missing")
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
        """The kernel for (op, device type): a plugin's override, else the backend's, else the CPU fallback's."""
        return self.launcher(op, device_type)[0]

    def launcher(self, op: str, device_type: str) -> tuple[Callable, Callable]:
        """(kernel, fail): ``kernel(device_index, stream, *c_args) -> status`` and ``fail(status)``, which
        raises the error for a non-zero status. Resolved once per (op, device type): the one kernel cache.
        An op the device's backend lacks runs on the CPU backend (``llaisys.fallback``); where it cannot
        (LLAISYS_FALLBACK=0, no CPU backend), NotSupportedError says why."""
        key = (op, device_type)
        found = self._kernels.get(key)
        if found is None:
            found = self._resolve(op, device_type)
            self._kernels[key] = found
        return found

    def _resolve(self, op: str, device_type: str) -> tuple[Callable, Callable]:
        wrap = self.kernel_wrapper
        found = self._own_kernel(op, device_type)
        if found is not None:
            return found if wrap is None else (wrap(op, device_type, found[0]), found[1])
        refusal = self._no_fallback(op, device_type)
        if refusal:
            raise NotSupportedError(refusal)
        from . import fallback

        cpu = self._own_kernel(op, "cpu")
        assert cpu is not None  # (_no_fallback checked it)
        return fallback.launcher(self.backend(Device(device_type)), op, device_type, cpu[0], cpu[1], wrap)

    def _own_kernel(self, op: str, device_type: str) -> tuple[Callable, Callable] | None:
        """(kernel, fail) of a plugin's override of op on device_type, else of its backend; None if neither."""
        override = self._overrides.get((op, device_type))
        if override is not None:
            return override.kernel, _override_failure(op, device_type)
        backend = self.backend(Device(device_type))
        fn = backend.kernel(op)
        return None if fn is None else (fn, _backend_failure(backend, op))

    def _no_fallback(self, op: str, device_type: str) -> str:
        """Why op, which device_type's backend lacks, cannot run on the CPU backend instead ("" if it can)."""
        from . import fallback

        missing = f"op '{op}' is not implemented by the '{device_type}' backend ({self.backends[device_type].package})"
        if device_type == "cpu":
            return missing
        if not fallback.enabled():
            return f"{missing}, and {fallback.ENV}=0 forbids running it on the cpu backend"
        if "cpu" not in self.backends:
            return f"{missing}, and no cpu backend is loaded to run it instead ({self._why_missing('cpu')})"
        if self._own_kernel(op, "cpu") is None:
            return f"{missing}, nor by the cpu backend"
        return ""

    def op_source(self, op: str, device_type: str) -> str:
        """Where op runs on device_type: "native", "override" (a plugin's kernel), "fallback" (the CPU
        backend's kernel) or "unavailable"."""
        if op not in OP_SLOTS:
            raise LlaisysValueError(f"unknown op {op!r}; the op slots are {', '.join(OP_SLOTS)}")
        if (op, device_type) in self._overrides:
            return OVERRIDE
        if self.backend(Device(device_type)).kernel(op) is not None:
            return NATIVE
        return UNAVAILABLE if self._no_fallback(op, device_type) else FALLBACK

    def capabilities(self, device) -> dict[str, str]:
        """Per op slot of llaisys.abi.OP_SLOTS, where it runs on ``device`` (``op_source``)."""
        device = as_device(device)
        self.backend(device)  # raises, saying why, for a device that is not there
        return {op: self.op_source(op, device.type) for op in OP_SLOTS}

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


def _short(value) -> str:
    """A value a plugin returned, as an error names it: its repr (cut short) and type."""
    text = repr(value)
    return f"{text[:40]}{'...' if len(text) > 40 else ''} (a {type(value).__name__})"


def _describe(e: BaseException) -> str:
    return f"{type(e).__name__}: {e}"


def _version_refusal(found, package: str, version: str) -> str:
    """Why a backend built for the backend API ``found`` (an ``api_version()`` value) cannot load ("" if it
    can: the same major version), in one line naming both versions and what to rebuild."""
    if isinstance(found, bool) or not isinstance(found, int):
        return f"{package} {version} declares the backend API version {found!r}, not an int (llaisys.API_VERSION)"
    major = split_version(found)[0]
    if major == abi.API_MAJOR:
        return ""
    ours = version_text(abi.API_VERSION)
    if major > abi.API_MAJOR:
        remedy = (f"upgrade llaisys-core to a release that speaks API {major}.x, or install a {package} built for "
                  f"API {abi.API_MAJOR}.x")
    elif package in KNOWN_PACKAGES.values():
        remedy = f"rebuild it against this llaisys-core: pip install --force-reinstall ./{package} (llaisys source tree)"
    else:
        remedy = f"rebuild {package} against llaisys-core {CORE_VERSION} (API {ours}) and reinstall it"
    return (f"{package} {version} was built for the llaisys backend API {version_text(found)}, but llaisys-core "
            f"{CORE_VERSION} speaks API {ours} (another major version: incompatible); {remedy}")


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


def capabilities(device) -> dict[str, str]:
    """Per op slot, where it runs on ``device``: "native" (its backend's kernel), "override" (a plugin's
    kernel), "fallback" (the CPU backend's kernel: ``llaisys.fallback``) or "unavailable" (neither:
    LLAISYS_FALLBACK=0, or no CPU backend)."""
    return registry().capabilities(device)


def backend_report() -> list[BackendRecord]:
    """One row per discovered plugin: loaded, no device, failed (with why), disabled or shadowed."""
    return list(registry().records)
