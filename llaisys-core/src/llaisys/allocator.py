"""A caching allocator per device, on top of the backend's malloc/free.

Sizes are rounded up to a size class and freed blocks wait in a bucket per class, so a
steady loop such as a decode step reuses blocks and calls the backend's malloc only while
warming up. The cache is bounded:

- size classes: 512 B steps up to 1 MiB, then 8 classes per power of two (a request is
  rounded up by at most 12.5%), so nearby sizes share blocks;
- a request may take a cached block of a larger class, up to 25% larger than it needs;
- the cached (free) bytes of a device are capped (``LLAISYS_ALLOCATOR_CACHE_MB``, default
  64, or ``llaisys.set_cache_limit``); past the cap the oldest cached blocks go back to the backend,
  so reserved <= 1.41 x live (rounding and reuse) + the cap;
- a backend malloc that runs out of memory empties the cache and tries once more.

``release`` runs from ``Storage.__del__``, so from any thread and inside a garbage collection
that an allocation triggered while holding the lock: it only appends to a queue (never takes
the lock, never raises), which the next allocation, ``memory_stats`` or ``empty_cache``
drains under the lock.

Graph capture (``llaisys.Graph``): while a thread captures, its allocations come from the graph's own
``GraphPool``. A captured graph writes its blocks at every replay, so they must never serve anyone
else while it lives: a block the capture took belongs to the pool until the graph is destroyed,
whoever frees it and when. Freed during the capture, it serves the capture's later requests of the
same size class (the step reuses memory as an eager run does). The capture itself must not call the
backend's malloc (a GPU forbids it): run the step once eagerly first, so the cache holds its blocks.
"""

from __future__ import annotations

import bisect
import collections
import os
import threading

from .errors import LlaisysError, LlaisysValueError, OutOfMemoryError

SMALL_STEP = 512
SMALL_LIMIT = 1 << 20
DIVISIONS = 8  # size classes per power of two above SMALL_LIMIT
REUSE_SLACK = 4  # a cached block up to size + size / REUSE_SLACK serves a request of this size
CACHE_LIMIT_ENV = "LLAISYS_ALLOCATOR_CACHE_MB"
DEFAULT_CACHE_LIMIT_MB = 64  # per device; serving on an accelerator may want more (freeing there can synchronize)


def size_class(nbytes: int) -> int:
    """The block size that serves a request of ``nbytes`` (> 0)."""
    if nbytes <= SMALL_LIMIT:
        step = SMALL_STEP
    else:  # 2**(k-1) < nbytes <= 2**k: steps of 2**(k-1) / DIVISIONS
        step = (1 << (nbytes - 1).bit_length() - 1) // DIVISIONS
    return max(step, -(-nbytes // step) * step)


class GraphPool:
    """The blocks one graph's capture allocated (see the module docstring)."""

    def __init__(self):
        self.blocks: dict[int, int] = {}  # pointer -> block size, every block the capture took
        self.free: dict[int, list[int]] = {}  # block size -> the pool's blocks not held by a tensor
        self.free_bytes = 0


def default_cache_limit() -> int:
    """Cached bytes allowed per device: LLAISYS_ALLOCATOR_CACHE_MB (a number of MiB, 0 = cache nothing)."""
    text = os.environ.get(CACHE_LIMIT_ENV, "").strip()
    if not text:
        return DEFAULT_CACHE_LIMIT_MB << 20
    try:
        mb = float(text)
    except ValueError:
        mb = -1.0
    if not 0 <= mb < float(1 << 43):
        raise LlaisysValueError(f"{CACHE_LIMIT_ENV}={text!r}: expected a number of MiB >= 0")
    return int(mb * (1 << 20))


class CachingAllocator:
    def __init__(self, backend, device, cache_limit: int | None = None):
        self.backend = backend
        self.device = device
        self.host = backend.host_addressable(device.index)  # what its blocks are (Storage.host)
        self.cache_limit = default_cache_limit() if cache_limit is None else cache_limit
        self._free: dict[int, list[int]] = {}  # size class -> cached pointers (most recently freed last)
        self._classes: list[int] = []  # sorted size classes that have cached blocks
        self._age: dict[int, int] = {}  # cached pointer -> its size, oldest first (for trimming)
        self._released: collections.deque = collections.deque()  # (ptr, size) waiting to be cached
        self._lock = threading.Lock()
        self._capture = threading.local()  # .pool: the GraphPool this thread's capture allocates from
        self._pooled: dict[int, GraphPool] = {}  # pointer -> the pool that owns it
        self._pool_free_bytes = 0  # freed bytes that belong to graph pools (not in the cache)
        self._released_pools: collections.deque = collections.deque()  # pools of destroyed graphs
        self.allocated = 0  # bytes handed out (by block size)
        self.reserved = 0  # bytes held from the backend, handed out or cached
        self.peak_allocated = 0
        self.num_allocs = 0
        self.num_backend_mallocs = 0
        self.num_backend_frees = 0

    def allocate(self, nbytes: int) -> tuple[int, int]:
        """Return (pointer, block size) for at least ``nbytes`` (> 0) bytes."""
        size = size_class(nbytes)
        pool = getattr(self._capture, "pool", None)
        with self._lock:
            if self._released or self._released_pools:
                self._drain()
            if pool is not None:
                return self._allocate_for_graph(pool, size, nbytes)
            bucket = self._free.get(size)
            if bucket:  # the common case in a steady loop: a block of exactly this class
                ptr, block = bucket.pop(), size
                del self._age[ptr]
                if not bucket:
                    self._forget_class(size)
            else:
                ptr, block = self._take_cached(size)
                if not ptr:
                    ptr, block = self._backend_malloc(size, nbytes), size
            self.num_allocs += 1
            self.allocated += block
            if self.allocated > self.peak_allocated:
                self.peak_allocated = self.allocated
        return ptr, block

    def _allocate_for_graph(self, pool: GraphPool, size: int, nbytes: int) -> tuple[int, int]:
        bucket = pool.free.get(size)
        if bucket:
            ptr = bucket.pop()
            pool.free_bytes -= size
            self._pool_free_bytes -= size
        else:
            ptr, block = self._take_cached(size)
            if not ptr:  # (0, 0): nothing cached fits
                ptr, block = self._backend_malloc(size, nbytes), size
            size = block
            pool.blocks[ptr] = size
            self._pooled[ptr] = pool
        self.num_allocs += 1
        self.allocated += size
        self.peak_allocated = max(self.peak_allocated, self.allocated)
        return ptr, size

    def begin_graph_capture(self, pool: GraphPool) -> None:
        """This thread's allocations come from ``pool`` until ``end_graph_capture``."""
        self._capture.pool = pool

    def end_graph_capture(self) -> None:
        self._capture.pool = None

    def release_graph_pool(self, pool: GraphPool) -> None:
        """The graph is gone (called from finalizers too: queued like ``release``). Its free blocks join the
        cache; its blocks still held by tensors are the allocator's again and come back when those die."""
        self._released_pools.append(pool)

    def _dissolve(self, pool: GraphPool) -> None:
        for ptr in pool.blocks:
            del self._pooled[ptr]
        for size, ptrs in pool.free.items():
            for ptr in ptrs:
                self._cache(ptr, size)
        self._pool_free_bytes -= pool.free_bytes
        pool.blocks, pool.free, pool.free_bytes = {}, {}, 0

    def release(self, ptr: int, size: int) -> None:
        """Give a block back. Safe from finalizers and any thread: appends to a queue, never takes the lock."""
        self._released.append((ptr, size))

    # -- the cache (all under the lock) --------------------------------------------------------

    def _drain(self) -> None:
        released = self._released
        while released:
            ptr, size = released.popleft()
            self.allocated -= size
            pool = self._pooled.get(ptr)
            if pool is not None:  # a graph's block stays its graph's
                pool.free.setdefault(size, []).append(ptr)
                pool.free_bytes += size
                self._pool_free_bytes += size
            else:
                self._cache(ptr, size)
        while self._released_pools:  # after the blocks: a block freed just before its pool went is the pool's
            self._dissolve(self._released_pools.popleft())
        if self._cached_bytes() > self.cache_limit:
            self._trim(self.cache_limit)

    def _cache(self, ptr: int, size: int) -> None:
        bucket = self._free.get(size)
        if bucket is None:
            bucket = self._free[size] = []
            bisect.insort(self._classes, size)
        bucket.append(ptr)
        self._age[ptr] = size

    def _cached_bytes(self) -> int:
        return self.reserved - self.allocated - self._pool_free_bytes

    def _forget_class(self, size: int) -> None:
        del self._free[size]
        del self._classes[bisect.bisect_left(self._classes, size)]

    def _take_cached(self, size: int) -> tuple[int, int]:
        classes = self._classes
        i = bisect.bisect_left(classes, size)
        if i == len(classes) or classes[i] > size + size // REUSE_SLACK:
            return 0, 0
        block = classes[i]
        ptr = self._free[block].pop()
        del self._age[ptr]
        if not self._free[block]:
            self._forget_class(block)
        return ptr, block

    def _trim(self, limit: int) -> None:
        """Free the oldest cached blocks until at most ``limit`` bytes are cached."""
        while self._age and self._cached_bytes() > limit:
            ptr, size = next(iter(self._age.items()))
            del self._age[ptr]
            bucket = self._free[size]
            bucket.remove(ptr)
            if not bucket:
                self._forget_class(size)
            self._backend_free(ptr, size)

    def _backend_malloc(self, size: int, nbytes: int) -> int:
        try:
            ptr = self.backend.malloc(self.device.index, size)
        except OutOfMemoryError:
            self._trim(0)  # give every cached block back and try once more
            try:
                ptr = self.backend.malloc(self.device.index, size)
            except OutOfMemoryError as e:
                raise OutOfMemoryError(
                    f"out of memory on {self.device}: asked for {nbytes} bytes (a block of {size}) with "
                    f"{self.allocated} bytes in use by llaisys tensors ({e})") from None
        self.num_backend_mallocs += 1
        self.reserved += size
        return ptr

    def _backend_free(self, ptr: int, size: int) -> None:
        try:
            self.backend.free(self.device.index, ptr)
        except LlaisysError:
            pass  # a backend that cannot free has lost the block either way; keep the books straight
        self.num_backend_frees += 1
        self.reserved -= size

    # -- public face ----------------------------------------------------------------------------

    def empty_cache(self) -> None:
        with self._lock:
            self._drain()
            self._trim(0)

    def set_cache_limit(self, nbytes: int) -> None:
        with self._lock:
            self.cache_limit = nbytes
            self._drain()

    def stats(self) -> dict[str, int]:
        with self._lock:
            self._drain()
            return {
                "allocated_bytes": self.allocated,
                "reserved_bytes": self.reserved,
                "cached_bytes": self._cached_bytes(),
                "graph_pool_free_bytes": self._pool_free_bytes,
                "cache_limit_bytes": self.cache_limit,
                "peak_allocated_bytes": self.peak_allocated,
                "num_allocs": self.num_allocs,
                "num_backend_mallocs": self.num_backend_mallocs,
                "num_backend_frees": self.num_backend_frees,
            }

    def reset_peak(self) -> None:
        with self._lock:
            self._drain()
            self.peak_allocated = self.allocated
