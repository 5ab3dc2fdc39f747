"""The caching allocator's public face."""

from __future__ import annotations

from .device import as_device
from .errors import LlaisysValueError
from .plugins import registry


def memory_stats(device="cpu") -> dict[str, int]:
    """allocated/reserved/cached bytes, the cache limit, the peak, and counts of allocations and backend calls."""
    return registry().allocator(as_device(device)).stats()


def empty_cache(device="cpu") -> None:
    """Return every cached, unused block of ``device`` to its backend."""
    registry().allocator(as_device(device)).empty_cache()


def set_cache_limit(nbytes: int, device="cpu") -> None:
    """Keep at most ``nbytes`` of freed blocks cached for ``device`` (the oldest go back to the backend first).

    The default comes from LLAISYS_ALLOCATOR_CACHE_MB (64 MiB if unset); 0 caches nothing.
    """
    if isinstance(nbytes, bool) or not isinstance(nbytes, int) or nbytes < 0:
        raise LlaisysValueError(f"set_cache_limit: nbytes must be an int >= 0, got {nbytes!r}")
    registry().allocator(as_device(device)).set_cache_limit(nbytes)


def reset_peak_memory_stats(device="cpu") -> None:
    registry().allocator(as_device(device)).reset_peak()


def mem_info(device) -> tuple[int, int] | None:
    """(free bytes, total bytes) of ``device`` as its backend reports them now, or None where the backend
    has no memory-info slot (``supports("mem_info")`` is False). Blocks the caching allocator keeps count
    as used: ``empty_cache(device)`` first to count them free."""
    device = as_device(device)
    return registry().backend(device).mem_info(device.index)
