"""A caching allocator per device, on top of the backend's malloc/free.

Sizes are rounded up to a size class (512 B steps up to 1 MiB, then 2 MiB steps) and
freed blocks wait in a bucket per class, so a steady loop such as a decode step reuses
blocks and calls the backend's malloc only while warming up.
"""

from __future__ import annotations

import threading
from collections import defaultdict

from .errors import LlaisysError

SMALL_STEP = 512
SMALL_LIMIT = 1 << 20
LARGE_STEP = 2 << 20


def size_class(nbytes: int) -> int:
    step = SMALL_STEP if nbytes <= SMALL_LIMIT else LARGE_STEP
    return max(step, -(-nbytes // step) * step)


class CachingAllocator:
    def __init__(self, backend, device):
        self.backend = backend
        self.device = device
        self._free: dict[int, list[int]] = defaultdict(list)  # size class -> cached pointers
        self._lock = threading.Lock()
        self.allocated = 0  # bytes handed out (by size class)
        self.reserved = 0  # bytes held from the backend, handed out or cached
        self.peak_allocated = 0
        self.num_allocs = 0
        self.num_backend_mallocs = 0
        self.num_backend_frees = 0

    def allocate(self, nbytes: int) -> tuple[int, int]:
        """Return (pointer, size class) for at least ``nbytes`` bytes."""
        size = size_class(nbytes)
        with self._lock:
            cached = self._free.get(size)
            ptr = cached.pop() if cached else 0
            if not ptr:
                ptr = self._backend_malloc(size)
            self.num_allocs += 1
            self.allocated += size
            self.peak_allocated = max(self.peak_allocated, self.allocated)
        return ptr, size

    def release(self, ptr: int, size: int) -> None:
        with self._lock:
            self.allocated -= size
            self._free[size].append(ptr)

    def _backend_malloc(self, size: int) -> int:
        try:
            ptr = self.backend.malloc(self.device.index, size)
        except LlaisysError:
            self._empty_cache_locked()  # give cached blocks back and try once more
            ptr = self.backend.malloc(self.device.index, size)
        self.num_backend_mallocs += 1
        self.reserved += size
        return ptr

    def empty_cache(self) -> None:
        with self._lock:
            self._empty_cache_locked()

    def _empty_cache_locked(self) -> None:
        for size, ptrs in self._free.items():
            for ptr in ptrs:
                self.backend.free(self.device.index, ptr)
                self.num_backend_frees += 1
                self.reserved -= size
        self._free.clear()

    def stats(self) -> dict[str, int]:
        with self._lock:
            return {
                "allocated_bytes": self.allocated,
                "reserved_bytes": self.reserved,
                "cached_bytes": self.reserved - self.allocated,
                "peak_allocated_bytes": self.peak_allocated,
                "num_allocs": self.num_allocs,
                "num_backend_mallocs": self.num_backend_mallocs,
                "num_backend_frees": self.num_backend_frees,
            }

    def reset_peak(self) -> None:
        with self._lock:
            self.peak_allocated = self.allocated
