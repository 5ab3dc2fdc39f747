"""A backend's shared library bound straight from llaisys/backend.h, for the ABI probes.

The probes call the exported C functions with ctypes, below core's Python layer, so they see exactly what
a library answers. Signatures, slot kinds ([required] / [optional] / [op]) and the codes come from parsing
the header that core ships; nothing here restates the ABI by hand.
"""

from __future__ import annotations

import ctypes
import importlib
import re
from dataclasses import dataclass
from pathlib import Path

import numpy as np

import llaisys

HEADER = Path(llaisys.get_include()) / "llaisys" / "backend.h"


@dataclass(frozen=True)
class LibrarySpec:
    """A compiled backend the probes run against: its package (exposing LIBRARY) and export prefix."""

    name: str          # device type
    package: str       # import name of the package; its LIBRARY attribute is the library's path
    prefix: str        # exports are <prefix>_<slot>
    all_ops: bool      # whether every [op] slot of the header must be exported


# One line per native backend package (a new backend adds its own).
NATIVE_BACKENDS = [
    LibrarySpec("cpu", "llaisys_backend_cpu", "llaisys_cpu", all_ops=True),
    LibrarySpec("iluvatar", "llaisys_backend_iluvatar", "llaisys_iluvatar", all_ops=True),
]


@dataclass(frozen=True)
class Slot:
    kind: str          # "REQUIRED", "OPTIONAL" or "OP"
    restype: object
    argtypes: tuple


def _ctype(c_type: str):
    c_type = " ".join(c_type.replace("const ", "").split())
    if c_type.endswith("*"):
        return ctypes.c_char_p if c_type == "char*" else ctypes.c_void_p
    return {"int": ctypes.c_int, "int64_t": ctypes.c_int64, "uint64_t": ctypes.c_uint64, "size_t": ctypes.c_size_t,
            "double": ctypes.c_double, "float": ctypes.c_float}[c_type]


def _parse_header() -> tuple[dict[str, Slot], dict[str, int]]:
    text = HEADER.read_text()
    text = re.sub(r"/\*.*?\*/", "", text, flags=re.S)
    slots = {}
    for kind, ret, name, args in re.findall(r"LLAISYS_(REQUIRED|OPTIONAL|OP)\s+([\w\s\*]+?)\s*LLAISYS_FN\((\w+)\)"
                                            r"\s*\(([^)]*)\)\s*;", text):
        params = [] if args.strip() == "void" else [a.strip() for a in args.split(",")]
        argtypes = tuple(_ctype(re.sub(r"\w+$", "", p).strip()) for p in params)
        ret = " ".join(ret.split())
        restype = ctypes.c_char_p if ret == "const char*" else _ctype(ret)
        slots[name] = Slot(kind, restype, argtypes)
    codes = {name: int(value) for name, value in re.findall(r"\b(LLAISYS_[A-Z0-9_]+)\s*=\s*(\d+)", text)}
    codes["LLAISYS_API_VERSION"] = int(re.search(r"#define LLAISYS_API_VERSION (\d+)", text).group(1))
    return slots, codes


SLOTS, CODES = _parse_header()
OK, INVALID_ARGUMENT, RUNTIME_ERROR, OUT_OF_MEMORY, NOT_SUPPORTED = (
    CODES[f"LLAISYS_{s}"] for s in ("OK", "INVALID_ARGUMENT", "RUNTIME_ERROR", "OUT_OF_MEMORY", "NOT_SUPPORTED"))


def status_name(status: int) -> str:
    names = {v: k for k, v in CODES.items() if k in ("LLAISYS_OK", "LLAISYS_INVALID_ARGUMENT", "LLAISYS_RUNTIME_ERROR",
                                                     "LLAISYS_OUT_OF_MEMORY", "LLAISYS_NOT_SUPPORTED")}
    return names.get(status, f"status {status}")


class Library:
    """The exports of one backend library, typed from the header."""

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
