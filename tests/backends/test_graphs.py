"""ABI probes of graph capture (backend.h's optional graph slots), for every native backend that has them:
ops queued on a captured stream are recorded, not run; graph_launch replays them in order, reading the
buffers' contents at replay; the capture rules (no allocation, free, synchronization or synchronous copy
on the capturing thread) are enforced; a recorded op that fails at replay is reported by graph_launch.
"""

import ctypes

import numpy as np
import pytest
from abi import CODES, INVALID_ARGUMENT, OK, DeviceBuffers

F32 = CODES["LLAISYS_F32"]
H2D, D2D = CODES["LLAISYS_MEMCPY_H2D"], CODES["LLAISYS_MEMCPY_D2D"]
GRAPH_SLOTS = ["graph_begin_capture", "graph_end_capture", "graph_launch", "graph_destroy"]


@pytest.fixture
def graphs(on_device):
    if not all(on_device.has(n) for n in GRAPH_SLOTS):
        pytest.skip(f"{on_device.backend.name} has no graph capture (optional slots)")
    return on_device


class Captured:
    """A stream of `lib` and the graph captured on it."""

    def __init__(self, lib):
        self.lib, self.stream, self.graph = lib, ctypes.c_void_p(), ctypes.c_void_p()
        lib.check("stream_create", 0, ctypes.byref(self.stream))

    def begin(self):
        self.lib.check("graph_begin_capture", 0, self.stream)

    def end(self):
        self.lib.check("graph_end_capture", 0, self.stream, ctypes.byref(self.graph))

    def launch(self) -> int:
        status = self.lib("graph_launch", 0, self.graph, self.stream)
        return status if status != OK else self.lib("stream_synchronize", 0, self.stream)

    def close(self):
        if self.graph.value:
            self.lib.check("graph_destroy", 0, self.graph)
        self.lib.check("stream_destroy", 0, self.stream)


def test_recorded_ops_run_only_at_replay_and_read_current_data(graphs):
    rng = np.random.default_rng(0)
    a, b = rng.standard_normal(64, dtype=np.float32), rng.standard_normal(64, dtype=np.float32)
    with DeviceBuffers(graphs) as buf:
        pa, pb, pc, pd = buf.upload(a), buf.upload(b), buf.upload(np.zeros(64, np.float32)), buf.alloc(256)
        g = Captured(graphs)
        try:
            g.begin()
            graphs.check("add", 0, g.stream, F32, 64, pc, pa, pb)   # c = a + b
            graphs.check("add", 0, g.stream, F32, 64, pd, pc, pa)   # d = c + a
            g.end()
            assert not buf.download(pc, a).any(), "a captured op must not run during the capture"
            for _ in range(3):  # new inputs each replay, as a decode step gets a new token
                a = rng.standard_normal(64, dtype=np.float32)
                graphs.check("memcpy", 0, pa, a.ctypes.data, a.nbytes, H2D)
                assert g.launch() == OK, graphs.last_error()
                np.testing.assert_array_equal(buf.download(pd, a), (a + b) + a)
        finally:
            g.close()


def test_copies_and_memset_on_the_stream_are_recorded(graphs):
    src = np.arange(16, dtype=np.float32)
    with DeviceBuffers(graphs) as buf:
        ps, pd, pz = buf.upload(src), buf.upload(np.zeros(16, np.float32)), buf.upload(np.ones(16, np.float32))
        g = Captured(graphs)
        try:
            g.begin()
            graphs.check("memcpy_async", 0, pd, ps, src.nbytes, D2D, g.stream)
            graphs.check("memset", 0, pz, 0, src.nbytes, g.stream)
            g.end()
            np.testing.assert_array_equal(buf.download(pz, src), np.ones(16, np.float32))
            assert g.launch() == OK, graphs.last_error()
            np.testing.assert_array_equal(buf.download(pd, src), src)
            np.testing.assert_array_equal(buf.download(pz, src), np.zeros(16, np.float32))
        finally:
            g.close()


def test_rearrange_keeps_its_shape_after_the_callers_arrays_are_gone(graphs):
    x = np.arange(12, dtype=np.float32).reshape(3, 4)
    with DeviceBuffers(graphs) as buf:
        px, py = buf.upload(x), buf.alloc(x.nbytes)
        g = Captured(graphs)
        try:
            g.begin()
            shape, dst_strides, src_strides = ((ctypes.c_int64 * 2)(*v) for v in ((4, 3), (3, 1), (1, 4)))
            graphs.check("rearrange", 0, g.stream, 4, 2, shape, py, dst_strides, px, src_strides)  # y = x.T
            g.end()
            for array in (shape, dst_strides, src_strides):  # the caller reuses its arrays
                ctypes.memset(array, 0xff, ctypes.sizeof(array))
            del shape, dst_strides, src_strides
            assert g.launch() == OK, graphs.last_error()
            np.testing.assert_array_equal(buf.download(py, x.T.copy()), x.T)
        finally:
            g.close()


def test_the_default_stream_cannot_be_captured(graphs):
    status = graphs("graph_begin_capture", 0, None)
    graphs.expect(status, INVALID_ARGUMENT, "default stream")


@pytest.mark.parametrize("call", ["malloc", "memcpy", "device_synchronize"])
def test_the_capturing_thread_may_not_allocate_copy_or_synchronize(graphs, call):
    with DeviceBuffers(graphs) as buf:
        dst = buf.alloc(16)
        host = np.zeros(4, np.float32)
        g = Captured(graphs)
        try:
            g.begin()
            status = {
                "malloc": lambda: graphs("malloc", 0, 64, ctypes.byref(ctypes.c_void_p())),
                "memcpy": lambda: graphs("memcpy", 0, dst, host.ctypes.data, 16, H2D),
                "device_synchronize": lambda: graphs("device_synchronize", 0),
            }[call]()
            graphs.expect(status, INVALID_ARGUMENT, "capture")
            g.end()
            assert g.launch() == OK  # an empty graph
            if call == "malloc":  # allowed again once the capture ended
                ptr = ctypes.c_void_p()
                graphs.check("malloc", 0, 64, ctypes.byref(ptr))
                graphs.check("free", 0, ptr)
        finally:
            g.close()


def test_a_recorded_op_failing_at_replay_is_reported_by_graph_launch(graphs):
    vocab, dim = 4, 8
    with DeviceBuffers(graphs) as buf:
        index = np.array([1], np.int64)
        pidx, pw, pout = buf.upload(index), buf.upload(np.ones((vocab, dim), np.float32)), buf.alloc(dim * 4)
        g = Captured(graphs)
        try:
            g.begin()
            graphs.check("embedding", 0, g.stream, F32, 1, dim, vocab, pout, pidx, pw)
            g.end()
            assert g.launch() == OK
            bad = np.array([vocab], np.int64)  # out of range, seen only by the replayed kernel
            graphs.check("memcpy", 0, pidx, bad.ctypes.data, 8, H2D)
            graphs.expect(g.launch(), INVALID_ARGUMENT, "embedding")
        finally:
            g.close()
