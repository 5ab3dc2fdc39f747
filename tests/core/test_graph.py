"""llaisys.Graph on the CPU backend: capture, replay with new inputs, the capture rules, and the allocator's
graph pool (memory a captured graph writes is never handed to anyone else while the graph lives)."""

import numpy as np
import pytest

import llaisys
from llaisys import ops


def _step(a, b):
    """A small step with temporaries: out = (a + b) + a, through a tensor freed inside the step."""
    tmp = llaisys.empty(a.shape, a.dtype, a.device)
    ops.add(tmp, a, b)
    out = llaisys.empty(a.shape, a.dtype, a.device)
    ops.add(out, tmp, a)
    return out


def test_cpu_supports_graphs(monkeypatch):
    assert llaisys.graphs_supported("cpu")
    monkeypatch.setenv("LLAISYS_GRAPHS", "0")
    assert not llaisys.graphs_supported("cpu")
    monkeypatch.delenv("LLAISYS_GRAPHS")
    monkeypatch.setenv("LLAISYS_CUDA_GRAPHS", "0")  # another device type's switch
    assert llaisys.graphs_supported("cpu")
    monkeypatch.setenv("LLAISYS_CPU_GRAPHS", "0")
    assert not llaisys.graphs_supported("cpu")


def test_replay_reads_new_inputs_and_writes_the_same_outputs():
    rng = np.random.default_rng(0)
    a = llaisys.from_numpy(rng.standard_normal(256).astype(np.float32))
    b = llaisys.from_numpy(rng.standard_normal(256).astype(np.float32))
    _step(a, b)  # warm-up: the cache now holds the step's blocks
    graph = llaisys.Graph("cpu")
    with graph.capture():
        out = _step(a, b)
    assert not np.array_equal(out.numpy(), a.numpy() * 2 + b.numpy()), "capture must not run the ops"
    for _ in range(3):
        new_a = rng.standard_normal(256).astype(np.float32)
        a.load(new_a)
        graph.replay()
        np.testing.assert_array_equal(out.numpy(), (new_a + b.numpy()) + new_a)
    graph.close()


def test_blocks_of_a_graph_are_never_handed_out_while_it_lives():
    # Start from an empty cache: blocks cached by earlier tests can fill it near its limit, and then the trim
    # that follows the graph's close frees the graph's returning blocks too (the last check then fails).
    llaisys.empty_cache("cpu")
    a = llaisys.from_numpy(np.ones(4096, np.float32))
    b = llaisys.from_numpy(np.full(4096, 2.0, np.float32))
    _step(a, b)
    pooled_before = llaisys.memory_stats("cpu")["graph_pool_free_bytes"]  # other graphs of this process
    graph = llaisys.Graph("cpu")
    with graph.capture():
        out = _step(a, b)
    captured_ptrs = {out.data_ptr()}
    del out  # the caller drops the output: its block still belongs to the graph
    others = [llaisys.empty((4096,), llaisys.float32) for _ in range(8)]
    assert not captured_ptrs & {t.data_ptr() for t in others}
    graph.replay()  # writes its blocks; none of `others` may change
    for t in others:
        t.load(np.zeros(4096, np.float32))
    graph.replay()
    assert all(not t.numpy().any() for t in others)
    del others
    graph.close()
    stats = llaisys.memory_stats("cpu")
    assert stats["graph_pool_free_bytes"] == pooled_before
    reused = [llaisys.empty((4096,), llaisys.float32) for _ in range(8)]  # the graph's blocks serve again
    assert captured_ptrs & {t.data_ptr() for t in reused}


def test_capture_without_warm_up_names_the_rule():
    # an empty cache: the capture would need the backend's malloc
    a = llaisys.from_numpy(np.ones(12345, np.float32))
    llaisys.empty_cache("cpu")
    graph = llaisys.Graph("cpu")
    with pytest.raises(llaisys.LlaisysError, match="captures a graph"):
        with graph.capture():
            _step(a, a)
    with pytest.raises(llaisys.NotSupportedError, match="already captured"):
        with graph.capture():
            pass
    out = _step(a, a)  # the thread is not capturing any more
    np.testing.assert_array_equal(out.numpy(), np.full(12345, 3.0, np.float32))


def test_a_synchronous_copy_inside_a_capture_is_refused():
    a = llaisys.from_numpy(np.ones(8, np.float32))
    graph = llaisys.Graph("cpu")
    with pytest.raises(llaisys.LlaisysError, match="captures a graph"):
        with graph.capture():
            a.load(np.zeros(8, np.float32))
    np.testing.assert_array_equal(a.numpy(), np.ones(8, np.float32))


def test_replay_before_capture_is_an_error():
    with pytest.raises(llaisys.NotSupportedError, match="not been captured"):
        llaisys.Graph("cpu").replay()


def test_a_graph_pool_takes_new_blocks_at_their_size_class():
    """Where a backend lets a capture allocate (the allocator does not forbid it), a cache miss gets a
    block of the request's size class, owned by the pool."""
    from llaisys.allocator import CachingAllocator, GraphPool, size_class

    class HostBackend:  # malloc / free on the host, as a backend that allows allocation while capturing
        def __init__(self):
            self.sizes, self.buffers = [], {}

        def host_addressable(self, index):
            return True

        def malloc(self, index, nbytes):
            self.sizes.append(nbytes)
            buffer = np.empty(nbytes, np.uint8)
            self.buffers[buffer.ctypes.data] = buffer
            return buffer.ctypes.data

        def free(self, index, ptr):
            del self.buffers[ptr]

    backend = HostBackend()
    allocator = CachingAllocator(backend, llaisys.Device("cpu"), cache_limit=1 << 20)
    pool = GraphPool()
    allocator.begin_graph_capture(pool)
    ptr, size = allocator.allocate(5000)
    allocator.end_graph_capture()
    assert size == size_class(5000) and backend.sizes == [size]
    assert pool.blocks == {ptr: size}
    allocator.release(ptr, size)
    assert allocator.stats()["graph_pool_free_bytes"] == size  # freed, but still the graph's
    assert allocator.allocate(5000)[0] != ptr  # so an allocation outside the capture gets another block
