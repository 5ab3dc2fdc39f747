"""Device names: ``Device("cuda", 1)``, parsed from "cuda:1"; "cuda" means index 0.

Devices are interned: ``Device("cuda", 1) is Device("cuda", 1)``, so the op path compares them
with ``is``. They still compare equal to their string form (``Device("cpu") == "cpu:0"``).
"""

from __future__ import annotations

import operator
import threading

from .errors import LlaisysValueError

_interned: dict[tuple[str, int], Device] = {}
_intern_lock = threading.Lock()


class Device:
    __slots__ = ("type", "index", "_hash")
    type: str
    index: int
    _hash: int

    def __new__(cls, type: str, index: int = 0):
        device = _interned.get((type, index)) if isinstance(type, str) and index.__class__ is int else None
        if device is not None:
            return device
        if not isinstance(type, str) or not type.isidentifier():
            raise LlaisysValueError(f"invalid device type {type!r}")
        try:
            checked = -1 if isinstance(index, bool) else operator.index(index)
        except TypeError:
            checked = -1
        if checked < 0:
            raise LlaisysValueError(f"invalid device index {index!r} for {type!r}")
        index = checked
        with _intern_lock:
            device = _interned.get((type, index))
            if device is None:
                device = object.__new__(cls)
                object.__setattr__(device, "type", type)
                object.__setattr__(device, "index", index)
                object.__setattr__(device, "_hash", hash((type, index)))
                _interned[(type, index)] = device
        return device

    def __setattr__(self, name, value):
        raise AttributeError("llaisys.Device is immutable")

    def __reduce__(self):
        return (Device, (self.type, self.index))

    def __repr__(self) -> str:
        return f"{self.type}:{self.index}"

    __str__ = __repr__

    def __eq__(self, other) -> bool:
        if self is other:
            return True
        if isinstance(other, str):
            try:
                other = as_device(other)
            except LlaisysValueError:
                return False
        return other is self

    def __hash__(self) -> int:
        return self._hash


_parsed: dict[str, Device] = {}  # device strings seen so far


def as_device(value) -> Device:
    """Accept a Device or a string "cpu", "cuda", "cuda:1"."""
    if value.__class__ is Device:
        return value
    device = _parsed.get(value) if value.__class__ is str else None
    if device is not None:
        return device
    if isinstance(value, Device):
        return value
    if not isinstance(value, str):
        raise LlaisysValueError(f"expected a device or a device string like 'cuda:0', got {value!r}")
    name, sep, index = value.strip().partition(":")
    if sep and not index.isdigit():
        raise LlaisysValueError(f"invalid device string {value!r}: the index must be a number")
    device = Device(name, int(index) if sep else 0)
    if len(_parsed) < 1024:
        _parsed[value] = device
    return device
