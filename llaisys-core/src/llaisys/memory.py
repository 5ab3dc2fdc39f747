"""The caching allocator's public face."""

from __future__ import annotations

from .device import as_device
from .plugins import registry


def memory_stats(device="cpu") -> dict[str, int]:
    """allocated/reserved/cached/peak bytes and counts of allocations and backend mallocs/frees."""
    return registry().allocator(as_device(device)).stats()


def empty_cache(device="cpu") -> None:
    """Return every cached, unused block of ``device`` to its backend."""
    registry().allocator(as_device(device)).empty_cache()


def reset_peak_memory_stats(device="cpu") -> None:
    registry().allocator(as_device(device)).reset_peak()
