"""Device names: ``Device("cuda", 1)``, parsed from "cuda:1"; "cuda" means index 0."""

from __future__ import annotations

from .errors import LlaisysValueError


class Device:
    __slots__ = ("type", "index")

    def __init__(self, type: str, index: int = 0):
        if not isinstance(type, str) or not type.isidentifier():
            raise LlaisysValueError(f"invalid device type {type!r}")
        if not isinstance(index, int) or isinstance(index, bool) or index < 0:
            raise LlaisysValueError(f"invalid device index {index!r} for {type!r}")
        self.type = type
        self.index = index

    def __repr__(self) -> str:
        return f"{self.type}:{self.index}"

    __str__ = __repr__

    def __eq__(self, other) -> bool:
        if isinstance(other, str):
            try:
                other = as_device(other)
            except LlaisysValueError:
                return False
        return isinstance(other, Device) and (self.type, self.index) == (other.type, other.index)

    def __hash__(self) -> int:
        return hash((self.type, self.index))


def as_device(value) -> Device:
    """Accept a Device or a string "cpu", "cuda", "cuda:1"."""
    if isinstance(value, Device):
        return value
    if not isinstance(value, str):
        raise LlaisysValueError(f"expected a device or a device string like 'cuda:0', got {value!r}")
    name, sep, index = value.strip().partition(":")
    if sep and not index.isdigit():
        raise LlaisysValueError(f"invalid device string {value!r}: the index must be a number")
    return Device(name, int(index) if sep else 0)
