"""The caching allocator and the backend runtime (memcpy, memset, streams)."""

import ctypes

import numpy as np
import pytest

import llaisys
from llaisys.allocator import size_class
from llaisys.native import MemcpyKind
from llaisys.plugins import registry


def test_size_classes():
    assert size_class(1) == 512 and size_class(512) == 512 and size_class(513) == 1024
    assert size_class(1 << 20) == 1 << 20
    assert size_class((1 << 20) + 1) == (1 << 20) + (1 << 17)  # above 1 MiB: 8 classes per power of two


def test_freed_block_is_reused_without_backend_malloc(device):
    t = llaisys.empty((1000, 37), llaisys.float32, device)
    ptr = t.data_ptr()
    del t
    before = llaisys.memory_stats(device)
    u = llaisys.empty((37, 1000), llaisys.float32, device)
    after = llaisys.memory_stats(device)
    assert u.data_ptr() == ptr
    assert after["num_backend_mallocs"] == before["num_backend_mallocs"]
    assert after["num_allocs"] == before["num_allocs"] + 1


def test_stats_track_allocation_and_empty_cache(device):
    llaisys.empty_cache(device)
    base = llaisys.memory_stats(device)
    llaisys.reset_peak_memory_stats(device)
    t = llaisys.empty((3 << 20,), llaisys.uint8, device)
    s = llaisys.memory_stats(device)
    assert s["allocated_bytes"] == base["allocated_bytes"] + size_class(3 << 20)
    assert s["peak_allocated_bytes"] >= s["allocated_bytes"]
    assert s["reserved_bytes"] >= s["allocated_bytes"]
    del t
    s = llaisys.memory_stats(device)
    assert s["allocated_bytes"] == base["allocated_bytes"] and s["cached_bytes"] >= size_class(3 << 20)
    llaisys.empty_cache(device)
    s = llaisys.memory_stats(device)
    assert s["cached_bytes"] == 0 and s["num_backend_frees"] > base["num_backend_frees"]


def test_steady_loop_makes_no_backend_mallocs(device):
    def step():
        a = llaisys.empty((1, 1536), llaisys.bfloat16, device)
        b = llaisys.empty((1, 8960), llaisys.bfloat16, device)
        return a, b
    step()
    before = llaisys.memory_stats(device)["num_backend_mallocs"]
    for _ in range(50):
        step()
    assert llaisys.memory_stats(device)["num_backend_mallocs"] == before


def test_views_keep_storage_alive(device):
    t = llaisys.from_numpy(np.arange(100, dtype=np.float32), device)
    v = t.slice(0, 10, 20)
    del t
    llaisys.empty((100,), llaisys.float32, device)  # would take the block if it had been freed
    np.testing.assert_array_equal(v.numpy(), np.arange(10, 20, dtype=np.float32))


@pytest.mark.parametrize("nbytes", [1, 4097, 1 << 20])
def test_memcpy_round_trips(device, nbytes):
    backend = registry().backend(device)
    host = np.random.default_rng(0).integers(0, 256, nbytes, dtype=np.uint8)
    back = np.zeros_like(host)
    pinned = backend.malloc_host(nbytes)
    a = backend.malloc(device.index, nbytes)
    b = backend.malloc(device.index, nbytes)
    try:
        backend.memcpy(device.index, a, host.ctypes.data, nbytes, MemcpyKind.H2D)
        backend.memcpy(device.index, b, a, nbytes, MemcpyKind.D2D)
        stream = backend.stream_create(device.index)
        backend.memcpy_async(device.index, pinned, b, nbytes, MemcpyKind.D2H, stream)
        backend.stream_synchronize(device.index, stream)
        backend.stream_destroy(device.index, stream)
        ctypes.memmove(back.ctypes.data, pinned, nbytes)
        np.testing.assert_array_equal(back, host)
        backend.memset(device.index, a, 0, nbytes)
        backend.memcpy(device.index, back.ctypes.data, a, nbytes, MemcpyKind.D2H)
        assert not back.any()
    finally:
        backend.free(device.index, a)
        backend.free(device.index, b)
        backend.free_host(pinned)
    backend.synchronize(device.index)


def test_runtime_errors_are_reported_not_crashes():
    backend = registry().backend("cpu")
    with pytest.raises(llaisys.LlaisysValueError, match="memcpy kind"):
        backend.memcpy(0, 0, 0, 0, 9)
    with pytest.raises(llaisys.LlaisysError, match="one device"):
        backend.malloc(1, 16)


def test_to_device_and_back(device):
    x = np.arange(60, dtype=np.float32).reshape(3, 4, 5)
    t = llaisys.from_numpy(x).permute(2, 0, 1).to(device)
    assert t.device == device
    np.testing.assert_array_equal(t.to("cpu").numpy(), x.transpose(2, 0, 1))


def test_stream_context(device):
    s = llaisys.Stream(device)
    with llaisys.stream(s):
        t = llaisys.from_numpy(np.arange(4, dtype=np.float32), device).view(2, 2).permute(1, 0).contiguous()
    s.synchronize()
    llaisys.synchronize(device)
    np.testing.assert_array_equal(t.numpy(), [[0, 2], [1, 3]])
