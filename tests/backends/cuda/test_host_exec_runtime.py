"""The CUDA backend's runtime slots (runtime.cu, context.cu) on the emulated device of host execution:
devices, memory, streams, events, graph capture and replay, and what may not happen during a capture.

The emulation runs stream work at once, so these tests check the backend's bookkeeping (contexts, handles,
error records, argument checks), not asynchrony; tools/gpu_check.sh runs the real thing.
"""

import pytest
import torch
from host_exec.device import HostExecDevice, SlotError, out

pytestmark = pytest.mark.slow  # compiles the CUDA sources under ASan for host execution (cached; minutes of CPU)
H2D, D2H, D2D = 1, 2, 3
ATTR_HOST_ADDRESSABLE, ATTR_WARP_SIZE, ATTR_MAX_THREADS, ATTR_SM_COUNT, ATTR_TOTAL_MEMORY = 0, 1, 2, 3, 4
ATTR_COMPUTE_CAPABILITY, ATTR_MAX_SHARED = 5, 6


def test_device_count_and_attributes(dev):
    _, _, (count,) = dev.call("device_count", out("int"))
    assert count == 1
    values = {attr: dev.call("device_attribute", 0, attr, out("int64"))[2][0] for attr in range(7)}
    assert values[ATTR_WARP_SIZE] == dev.warp
    assert values[ATTR_HOST_ADDRESSABLE] == 0
    assert values[ATTR_MAX_THREADS] == 1024 and values[ATTR_SM_COUNT] > 0 and values[ATTR_TOTAL_MEMORY] > 0
    assert values[ATTR_COMPUTE_CAPABILITY] == 80 and values[ATTR_MAX_SHARED] >= 48 * 1024
    status, message, _ = dev.call("device_attribute", 0, 99, out("int64"), check=False)
    assert status == 4 and "attribute 99" in message
    _, _, (name,) = dev.call("device_name", 0, out("bytes", 64), 64)
    assert name.split(b"\0")[0] == f"host execution (warp {dev.warp})".encode()
    _, _, (free, total) = dev.call("mem_info", 0, out("size"), out("size"))
    assert 0 < free <= total


def test_a_device_that_does_not_exist_is_an_invalid_argument(dev):
    status, message, _ = dev.call("malloc", 1, 16, out("ptr"), check=False)
    assert status == 1 and "no device 1" in message
    status, message, _ = dev.call("stream_create", -1, out("ptr"), check=False)
    assert status == 1


def test_memory_copies_and_memset_on_a_stream(dev):
    _, _, (stream,) = dev.call("stream_create", 0, out("ptr"))
    try:
        src = dev.upload(torch.arange(64, dtype=torch.float32))
        dst = dev.empty((64,), torch.float32)
        dev.call("memcpy_async", 0, dst.ptr, src.ptr, 64 * 4, D2D, stream)
        dev.call("memset", 0, dst.ptr, 0, 16, stream)  # the first four floats become 0
        dev.call("stream_synchronize", 0, stream)
        want = torch.arange(64, dtype=torch.float32)
        want[:4] = 0
        assert torch.equal(dev.download(dst), want)
        _, _, (zero_ptr,) = dev.call("malloc", 0, 0, out("ptr"))
        assert zero_ptr is None  # malloc(0) is NULL
        dev.call("free", 0, None)  # free(NULL) is a no-op
        status, message, _ = dev.call("memcpy", 0, dst.ptr, src.ptr, 4, 7, check=False)
        assert status == 1 and "memcpy kind 7" in message
    finally:
        dev.call("stream_destroy", 0, stream)


def test_pinned_host_memory(dev):
    _, _, (ptr,) = dev.call("malloc_host", 4096, out("ptr"))
    assert ptr and ptr % 64 == 0
    dev.call("free_host", ptr)


def test_events_order_and_time(dev):
    _, _, (stream,) = dev.call("stream_create", 0, out("ptr"))
    _, _, (start,) = dev.call("event_create", 0, out("ptr"))
    _, _, (end,) = dev.call("event_create", 0, out("ptr"))
    try:
        dev.call("event_record", 0, start, stream)
        x = dev.upload(torch.ones(4096))
        dev.call("add", 0, stream, 0, 4096, x.ptr, x.ptr, x.ptr)
        dev.call("event_record", 0, end, stream)
        dev.call("stream_wait_event", 0, None, end)
        dev.call("event_synchronize", 0, end)
        _, _, (ms,) = dev.call("event_elapsed_ms", 0, start, end, out("float"))
        assert ms >= 0.0
        assert torch.equal(dev.download(x), torch.full((4096,), 2.0))
    finally:
        for e in (start, end):
            dev.call("event_destroy", 0, e)
        dev.call("stream_destroy", 0, stream)


def test_graph_replays_the_captured_ops_with_the_current_data(dev):
    """Capture rms_norm -> linear -> attention -> sample on a stream, then replay after changing the inputs
    in place: the replay reads the new data through the captured pointers."""
    _, _, (stream,) = dev.call("stream_create", 0, out("ptr"))
    dim, vocab = 16, 40
    x = dev.upload(torch.randn(1, dim))
    w_norm, w_head = dev.upload(torch.rand(dim) + 0.5), dev.upload(torch.randn(vocab, dim))
    kv = dev.upload(torch.randn(9, 2, dim))
    h, att = dev.empty((1, dim), torch.float32), dev.empty((1, 2, dim // 2), torch.float32)
    logits = dev.empty((1, vocab), torch.float32)
    token = dev.empty((1,), torch.int64, -1)

    def step(s):
        dev.call("rms_norm", 0, s, 0, 0, 0, 1, dim, 1e-6, h.ptr, x.ptr, w_norm.ptr)
        dev.call("self_attention", 0, s, 0, 0, 1, 9, 2, 2, dim // 2, dim // 2, 0.5, att.ptr, h.ptr, kv.ptr, kv.ptr)
        dev.call("linear", 0, s, 0, 1, vocab, dim, logits.ptr, att.ptr, w_head.ptr, None)
        dev.call("sample", 0, s, 0, vocab, token.ptr, logits.ptr, 0.8, 5, 0.9, 1234)

    try:
        dev.call("graph_begin_capture", 0, stream)
        step(stream)
        _, _, (graph,) = dev.call("graph_end_capture", 0, stream, out("ptr"))
        for trial in range(3):
            new_x = torch.randn(1, dim, generator=torch.Generator().manual_seed(trial))
            staged = dev.upload(new_x)
            dev.call("memcpy_async", 0, x.ptr, staged.ptr, dim * 4, D2D, stream)
            dev.call("graph_launch", 0, graph, stream)
            dev.call("stream_synchronize", 0, stream)
            from_graph = (dev.download(logits).clone(), int(dev.download(token)[0]))
            step(None)  # the same ops, eagerly, on the same data
            assert torch.equal(dev.download(logits), from_graph[0]) and int(dev.download(token)[0]) == from_graph[1]
        dev.call("graph_destroy", 0, graph)
    finally:
        dev.call("stream_destroy", 0, stream)


def test_nothing_synchronises_or_allocates_during_a_capture(dev):
    _, _, (stream,) = dev.call("stream_create", 0, out("ptr"))
    try:
        dev.call("graph_begin_capture", 0, stream)
        for slot, args in [("stream_synchronize", (0, stream)), ("device_synchronize", (0,)),
                           ("malloc", (0, 64, out("ptr")))]:
            status, message, _ = dev.call(slot, *args, check=False)
            assert status != 0 and "capturing" in message, (slot, message)
        _, _, (graph,) = dev.call("graph_end_capture", 0, stream, out("ptr"))
        dev.call("graph_destroy", 0, graph)
    finally:
        dev.call("stream_destroy", 0, stream)


def test_the_default_stream_cannot_be_captured(dev):
    with pytest.raises(SlotError) as info:
        dev.call("graph_begin_capture", 0, None)
    assert info.value.status == 1 and "stream_create" in info.value.message


@pytest.mark.parametrize("warp,env,usable,reason", [
    (32, {"LLAISYS_HOST_EXEC_CC": "86"}, True, ""),  # sm_80 machine code runs on 8.6
    (32, {"LLAISYS_HOST_EXEC_CC": "90"}, False, "not among this build's architectures (sm_80): rebuild with "
                                                "LLAISYS_CUDA_ARCHS=90"),
    (32, {"LLAISYS_HOST_EXEC_WARP": "64"}, False, "has warps of 64 threads, this build's kernels assume 32"),
    (64, {"LLAISYS_HOST_EXEC_WARP": "32"}, False, "has warps of 32 threads, this build's kernels assume 64"),
], ids=["sm_86", "sm_90", "warp64_device", "warp32_device"])
def test_devices_the_build_cannot_run_are_left_out_with_the_reason(warp, env, usable, reason):
    """A GPU without machine code or PTX for it in this build, or with another warp size (CoreX's 64 for a
    32-lane build and back), is not counted; device_count's last_error says why and what to rebuild with.
    (The warp-64 build is the CoreX configuration: its architectures are checked in tests/backends/iluvatar.)"""
    device = HostExecDevice(warp, **env)
    try:
        _, message, (count,) = device.call("device_count", out("int"))
        assert count == (1 if usable else 0)
        assert reason in message
        if not usable:
            status, message, _ = device.call("malloc", 0, 16, out("ptr"), check=False)
            assert status == 1 and "no device 0" in message
    finally:
        device.close()


def test_collectives_without_nccl_are_not_supported_and_say_what_to_install(dev):
    """collectives.cu opens NCCL (CoreX's library on Iluvatar) at run time, not at load: the emulated machine
    has none, so the backend loads and its collectives answer NOT_SUPPORTED naming what to install."""
    status, message, _ = dev.call("comm_unique_id", 0, out("bytes", 128), check=False)
    assert status == 4 and "NCCL" in message, message
    assert ("nvidia-nccl-cu13" if dev.warp == 32 else "CoreX SDK") in message, message
    status, message, _ = dev.call("comm_create", 0, b"\0" * 128, 0, 1, 1000, out("ptr"), check=False)
    assert status == 4 and "NCCL" in message, message
