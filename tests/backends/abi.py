"""A backend's shared library bound straight from the ABI tables, for the ABI probes.

The probes call the exported C functions with ctypes, below core's Python layer, so they see exactly what
a library answers. Signatures, slot kinds ([required] / [optional] / [op]) and the codes come from
``llaisys.abi``, the Python mirror of llaisys/backend.h that tests/core/test_abi_header.py checks against
the header (the one parser of the header); nothing here restates the ABI by hand.
"""

from __future__ import annotations

import ctypes
import importlib
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from llaisys import abi


@dataclass(frozen=True)
class LibrarySpec:
    """A compiled backend the probes run against: its package (exposing LIBRARY) and export prefix."""

    name: str          # device type
    package: str       # import name of the package; its LIBRARY attribute is the library's path
    prefix: str        # exports are <prefix>_<slot>
    missing_ops: tuple[str, ...] = ()  # the [op] slots it does not implement (yet); every other one is exported


# One line per native backend package (a new backend adds its own).
GPU_MISSING_OPS = ("moe_linear_i8",)  # int8 experts have a CPU kernel only (so far)
NATIVE_BACKENDS = [
    LibrarySpec("cpu", "llaisys_backend_cpu", "llaisys_cpu"),
    LibrarySpec("cuda", "llaisys_backend_cuda", "llaisys_cuda", missing_ops=GPU_MISSING_OPS),
    LibrarySpec("iluvatar", "llaisys_backend_iluvatar", "llaisys_iluvatar", missing_ops=GPU_MISSING_OPS),
]


@dataclass(frozen=True)
class Slot:
    kind: str          # "REQUIRED", "OPTIONAL" or "OP"
    restype: object
    argtypes: tuple


def _tables() -> tuple[dict[str, Slot], dict[str, int]]:
    slots = {name: Slot(kind.name, restype, tuple(args)) for name, (kind, restype, args) in abi.RUNTIME_SLOTS.items()}
    for op, args in abi.OP_SLOTS.items():
        slots[op] = Slot("OP", ctypes.c_int, (*abi.OP_LEADING_ARGS, *args))
    codes = {prefix + member.name: int(member) for _, enum, prefix in abi.ENUMS for member in enum}
    codes["LLAISYS_API_VERSION"] = abi.API_VERSION
    return slots, codes


SLOTS, CODES = _tables()
OK, INVALID_ARGUMENT, RUNTIME_ERROR, OUT_OF_MEMORY, NOT_SUPPORTED = (
    abi.Status.OK, abi.Status.INVALID_ARGUMENT, abi.Status.RUNTIME_ERROR, abi.Status.OUT_OF_MEMORY, abi.Status.NOT_SUPPORTED)


def status_name(status: int) -> str:
    return f"LLAISYS_{abi.Status(status).name}" if status in abi.Status._value2member_map_ else f"status {status}"


class Library:
    """The exports of one backend library, typed from the ABI tables."""

    def __init__(self, backend: LibrarySpec):
        package = importlib.import_module(backend.package)
        self.backend = backend
        self.path = Path(package.LIBRARY)
        self.lib = ctypes.CDLL(str(self.path))

    def has(self, slot: str) -> bool:
        return hasattr(self.lib, f"{self.backend.prefix}_{slot}")

    def fn(self, slot: str):
        f = getattr(self.lib, f"{self.backend.prefix}_{slot}")
        f.restype, f.argtypes = SLOTS[slot].restype, SLOTS[slot].argtypes
        return f

    def __call__(self, slot: str, *args):
        return self.fn(slot)(*args)

    def last_error(self) -> str:
        return (self("last_error") or b"").decode(errors="replace")

    def check(self, slot: str, *args) -> None:
        status = self(slot, *args)
        assert status == OK, f"{slot}: {status_name(status)}: {self.last_error()}"

    def device_count(self) -> int:
        count = ctypes.c_int(-1)
        self.check("device_count", ctypes.byref(count))
        return count.value

    def expect(self, status: int, wanted: int, *words: str) -> str:
        """Asserts a failed call's status and that its message names every word; returns the message."""
        message = self.last_error()
        assert status == wanted, f"{status_name(status)} instead of {status_name(wanted)} ({message!r})"
        for word in words:
            assert word in message, f"the message {message!r} does not name {word!r}"
        return message

    def finish(self, status: int, device: int = 0) -> int:
        """The status of a call, or of the next synchronize if the call itself was queued fine (an
        asynchronous backend may report bad data there)."""
        return status if status != OK else self("device_synchronize", device)


class DeviceBuffers:
    """Device memory for a probe: numpy arrays uploaded with the library's own malloc / memcpy."""

    def __init__(self, lib: Library, device: int = 0):
        self.lib, self.device, self.ptrs = lib, device, []

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        for ptr in self.ptrs:
            self.lib("free", self.device, ptr)

    def alloc(self, nbytes: int) -> int:
        ptr = ctypes.c_void_p()
        self.lib.check("malloc", self.device, max(nbytes, 1), ctypes.byref(ptr))
        self.ptrs.append(ptr.value)
        return ptr.value

    def upload(self, array: np.ndarray) -> int:
        array = np.ascontiguousarray(array)
        ptr = self.alloc(array.nbytes)
        self.lib.check("memcpy", self.device, ptr, array.ctypes.data, array.nbytes, CODES["LLAISYS_MEMCPY_H2D"])
        return ptr

    def download(self, ptr: int, like: np.ndarray) -> np.ndarray:
        out = np.empty_like(like)
        self.lib.check("memcpy", self.device, out.ctypes.data, ptr, out.nbytes, CODES["LLAISYS_MEMCPY_D2H"])
        return out
