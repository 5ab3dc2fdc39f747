"""Giving freed memory back to the system when the engine goes idle.

A large request (a big grammar with many forks, ``n`` × log-probabilities, long prompts) allocates hundreds of
MiB in many small pieces; when it ends, glibc's malloc keeps most of them in its arenas (the heap's top cannot
shrink past a live block, and the thread arenas are trimmed only at their top), so the server's RSS stays near its
peak although nothing uses it. ``malloc_trim(0)`` releases every free page of every arena (``madvise``), the
remedy glibc offers; it costs a few milliseconds, so the engine calls it once each time it runs out of work, never
between steps. Elsewhere (musl, macOS) there is nothing to call and this does nothing.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
from collections.abc import Callable


@functools.cache
def _malloc_trim() -> Callable[[int], int] | None:
    name = ctypes.util.find_library("c")
    if name is None:
        return None
    try:
        return ctypes.CDLL(name).malloc_trim
    except (OSError, AttributeError):  # not glibc
        return None


def return_free_memory() -> bool:
    """Give the C heap's free pages back to the system; whether there was a way to."""
    trim = _malloc_trim()
    if trim is None:
        return False
    trim(0)
    return True
