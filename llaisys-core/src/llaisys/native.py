"""Compiled backends: a shared library bound with ctypes from the tables of ``llaisys.abi``.

A backend library exports ``<prefix>_<slot>`` for the slots of ``llaisys/backend.h`` (the C
header core ships: ``get_include()``). Required slots must all be there or the library does
not load; a missing optional slot makes its capability "not supported"; a missing operator
runs on the CPU backend (``llaisys.fallback``) or is reported as not implemented when first used.
A library built for another major version of the ABI is refused (``ApiVersionError``); one built
for an older minor loads, without the slots added since (``llaisys.abi.SLOT_SINCE``).
"""

from __future__ import annotations

import ctypes
from ctypes import c_int, c_int64, c_size_t, c_void_p
from pathlib import Path

from . import abi
from ._version import __version__ as CORE_VERSION
from .abi import (
    CAPABILITIES,
    OP_LEADING_ARGS,
    OP_SLOTS,
    REQUIRED,
    RUNTIME_SLOTS,
    UNIQUE_ID_BYTES,
    DeviceAttr,
    MemcpyKind,
    Numerics,
    Status,
)
from .backend import DLPACK_CUDA, Backend
from .errors import ApiVersionError, LlaisysError, LlaisysValueError, NotSupportedError, OutOfMemoryError

__all__ = ["MemcpyKind", "NativeBackend", "NativeLibrary", "Numerics", "Status", "get_include"]

_STATUS_ERRORS: dict[int, type[LlaisysError]] = {
    Status.INVALID_ARGUMENT: LlaisysValueError, Status.OUT_OF_MEMORY: OutOfMemoryError,
    Status.NOT_SUPPORTED: NotSupportedError}


def get_include() -> str:
    """The folder that holds ``llaisys/backend.h``, the C ABI header (pass it to the compiler with -I)."""
    return str(Path(__file__).with_name("include"))


class NativeLibrary:
    """A backend's shared library with its runtime slots bound and its status codes turned into exceptions."""

    def __init__(self, path: str | Path, prefix: str):
        self.path = str(path)
        self.prefix = prefix
        try:
            self._lib = ctypes.CDLL(self.path)
        except OSError as e:
            raise LlaisysError(f"cannot load native library {self.path}: {e}") from e
        version = self._bind("api_version", c_int, [])
        # the version first: a library of another major may lack (or misname) required slots
        self.api_version = version() if version is not None else abi.API_VERSION
        if version is not None and abi.split_version(self.api_version)[0] != abi.API_MAJOR:
            raise ApiVersionError(
                f"{self.path} was built for llaisys backend API {abi.version_text(self.api_version)}, but "
                f"llaisys-core {CORE_VERSION} speaks API {abi.version_text(abi.API_VERSION)} (another major "
                f"version: incompatible); rebuild it against this llaisys-core's llaisys/backend.h "
                f"(llaisys.get_include()), or use a llaisys-core of API {abi.split_version(self.api_version)[0]}.x",
                self.api_version)
        self.slots = {name: self._bind(name, restype, argtypes) for name, (_, restype, argtypes) in RUNTIME_SLOTS.items()}
        missing = [f"{prefix}_{name}" for name, (kind, _, _) in RUNTIME_SLOTS.items()
                   if kind is REQUIRED and self.slots[name] is None]
        if missing:
            raise LlaisysError(f"{self.path} does not export the required slot(s) {', '.join(missing)} "
                               f"of llaisys/backend.h (built for another llaisys API version or another prefix?)")

    def _bind(self, name: str, restype, argtypes):
        """The export of slot ``name`` with its types set; None if missing, or if the slot is newer than the minor
        version the library was built for (a function of that name is then not the slot: backend.h)."""
        if name != "api_version" and not abi.slot_in(name, self.api_version):
            return None
        fn = getattr(self._lib, f"{self.prefix}_{name}", None)
        if fn is not None:
            fn.restype = restype
            fn.argtypes = argtypes
        return fn

    def exports(self, slot: str) -> bool:
        return self.slots.get(slot) is not None

    def last_error(self) -> str:
        return (self.slots["last_error"]() or b"").decode(errors="replace")

    def raise_status(self, status: int, what: str):
        cls = _STATUS_ERRORS.get(status, LlaisysError)
        raise cls(f"{what}: {self.last_error() or f'failed with status {status}'}")

    def call(self, slot: str, *args) -> None:
        status = self.slots[slot](*args)
        if status:
            self.raise_status(status, f"{self.prefix}_{slot}")

    def kernel(self, op: str):
        """The operator's export with its argument types set, or None if the library lacks it."""
        return self._bind(op, c_int, [*OP_LEADING_ARGS, *OP_SLOTS[op]])


class NativeBackend(Backend):
    """A backend whose runtime and kernels live in one shared library exporting ``<prefix>_<slot>``."""

    def __init__(self, name: str, library: str | Path, prefix: str, dlpack_device_type: int = DLPACK_CUDA):
        self.name = name
        self.dlpack_device_type = dlpack_device_type
        self.lib = NativeLibrary(library, prefix)
        self.api_version = self.lib.api_version
        self._attributes: dict[tuple[int, int], int | None] = {}

    # -- required runtime ----------------------------------------------------------------------

    def device_count(self) -> int:
        count = c_int(0)
        self.lib.call("device_count", ctypes.byref(count))
        return count.value

    def no_device_reason(self) -> str:
        return self.lib.last_error()

    def malloc(self, device_index, nbytes):
        ptr = c_void_p()
        self.lib.call("malloc", device_index, nbytes, ctypes.byref(ptr))
        return ptr.value or 0

    def free(self, device_index, ptr):
        self.lib.call("free", device_index, ptr)

    def memset(self, device_index, ptr, value, nbytes, stream=None):
        self.lib.call("memset", device_index, ptr, value, nbytes, stream)

    def memcpy(self, device_index, dst, src, nbytes, kind):
        self.lib.call("memcpy", device_index, dst, src, nbytes, int(kind))

    def memcpy_async(self, device_index, dst, src, nbytes, kind, stream):
        self.lib.call("memcpy_async", device_index, dst, src, nbytes, int(kind), stream)

    def stream_create(self, device_index):
        return self._create("stream_create", device_index)

    def stream_destroy(self, device_index, stream):
        self.lib.call("stream_destroy", device_index, stream)

    def stream_synchronize(self, device_index, stream):
        self.lib.call("stream_synchronize", device_index, stream)

    def synchronize(self, device_index):
        self.lib.call("device_synchronize", device_index)

    def kernel(self, op):
        return self.lib.kernel(op)

    def raise_status(self, status, what):
        self.lib.raise_status(status, f"{self.lib.prefix}_{what}")

    def _create(self, slot: str, *args) -> int:
        handle = c_void_p()
        self.lib.call(slot, *args, ctypes.byref(handle))
        return handle.value or 0

    # -- optional capabilities -------------------------------------------------------------------

    def supports(self, capability):
        super().supports(capability)  # rejects unknown names
        return all(self.lib.exports(slot) for slot in CAPABILITIES[capability])

    def _optional(self, capability: str, slot: str, *args) -> None:
        if not self.supports(capability):
            self._unsupported(capability)
        self.lib.call(slot, *args)

    def device_attribute(self, device_index, attr):
        key = (device_index, int(attr))
        if key not in self._attributes:  # attributes do not change while the process runs
            value = None
            if self.supports("device_attributes"):
                out = c_int64(0)
                status = self.lib.slots["device_attribute"](device_index, int(attr), ctypes.byref(out))
                if status == Status.OK:
                    value = out.value
                elif status != Status.NOT_SUPPORTED:
                    self.lib.raise_status(status, f"{self.lib.prefix}_device_attribute({DeviceAttr(attr).name})")
            self._attributes[key] = value
        return self._attributes[key]

    def device_name(self, device_index):
        if not self.supports("device_name"):
            return super().device_name(device_index)
        buf = ctypes.create_string_buffer(256)
        self.lib.call("device_name", device_index, buf, len(buf))
        return buf.value.decode(errors="replace")

    def mem_info(self, device_index):
        if not self.supports("mem_info"):
            return None
        free, total = c_size_t(0), c_size_t(0)
        self.lib.call("mem_info", device_index, ctypes.byref(free), ctypes.byref(total))
        return free.value, total.value

    def build_info(self):
        return (self.lib.slots["build_info"]() or b"").decode(errors="replace") if self.supports("build_info") else ""

    def malloc_host(self, nbytes):
        if not self.supports("pinned_host"):
            self._unsupported("pinned_host")
        return self._create("malloc_host", nbytes)

    def free_host(self, ptr):
        self._optional("pinned_host", "free_host", ptr)

    def memcpy_peer(self, dst_device, dst, src_device, src, nbytes, stream=None):
        self._optional("peer_copy", "memcpy_peer", dst_device, dst, src_device, src, nbytes, stream)

    def event_create(self, device_index):
        if not self.supports("events"):
            self._unsupported("events")
        return self._create("event_create", device_index)

    def event_destroy(self, device_index, event):
        self._optional("events", "event_destroy", device_index, event)

    def event_record(self, device_index, event, stream=None):
        self._optional("events", "event_record", device_index, event, stream)

    def event_synchronize(self, device_index, event):
        self._optional("events", "event_synchronize", device_index, event)

    def stream_wait_event(self, device_index, stream, event):
        self._optional("events", "stream_wait_event", device_index, stream, event)

    def event_elapsed_ms(self, device_index, start, end):
        ms = ctypes.c_float(0.0)
        self._optional("event_timing", "event_elapsed_ms", device_index, start, end, ctypes.byref(ms))
        return ms.value

    def graph_begin_capture(self, device_index, stream):
        self._optional("graphs", "graph_begin_capture", device_index, stream)

    def graph_end_capture(self, device_index, stream):
        if not self.supports("graphs"):
            self._unsupported("graphs")
        return self._create("graph_end_capture", device_index, stream)

    def graph_launch(self, device_index, graph, stream=None):
        self._optional("graphs", "graph_launch", device_index, graph, stream)

    def graph_destroy(self, device_index, graph):
        self._optional("graphs", "graph_destroy", device_index, graph)


    def comm_unique_id(self, device_index):
        buf = ctypes.create_string_buffer(UNIQUE_ID_BYTES)
        self._optional("collectives", "comm_unique_id", device_index, buf)
        return buf.raw

    def comm_create(self, device_index, unique_id, rank, world_size, timeout_ms):
        if not self.supports("collectives"):
            self._unsupported("collectives")
        if len(unique_id) != UNIQUE_ID_BYTES:
            raise LlaisysValueError(f"a unique id has {UNIQUE_ID_BYTES} bytes, got {len(unique_id)}")
        return self._create("comm_create", device_index, ctypes.create_string_buffer(bytes(unique_id), UNIQUE_ID_BYTES),
                            rank, world_size, timeout_ms)

    def comm_destroy(self, comm):
        self._optional("collectives", "comm_destroy", comm)

    def comm_abort(self, comm, reason):
        self._optional("collectives", "comm_abort", comm, ctypes.create_string_buffer(reason.encode(errors="replace")))

    def comm_all_reduce(self, device_index, stream, comm, dtype_code, n, out, src):
        self._optional("collectives", "comm_all_reduce", device_index, stream, comm, dtype_code, n, out, src)

    def comm_all_gather(self, device_index, stream, comm, nbytes, out, src):
        self._optional("collectives", "comm_all_gather", device_index, stream, comm, nbytes, out, src)

    def comm_broadcast(self, device_index, stream, comm, nbytes, data, root):
        self._optional("collectives", "comm_broadcast", device_index, stream, comm, nbytes, data, root)
