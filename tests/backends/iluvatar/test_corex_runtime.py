"""The shared runtime in the Iluvatar CoreX configuration, through host execution at warp 64 (the warp-64
build of tests/backends/cuda/host_exec is compat.h's CoreX branch, built for ivcore20): what llaisys says
when a CoreX machine has no usable GPU, which devices it refuses and why, and the optional slots a CoreX
runtime may lack reporting LLAISYS_NOT_SUPPORTED instead of failing.

The emulated machine is set through the environment (llaisys_host_exec.h): no device, a compute capability,
a threads-per-block limit, runtime calls that answer cudaErrorNotSupported. This checks the backend's own
logic on CoreX's terms; what CoreX's runtime really answers is checked on a CoreX machine
(test_iluvatar_package.py through nox -s "tests(backend='iluvatar')")."""

import glob
import shutil

import pytest
import torch
from backends.cuda.host_exec.device import HostExecDevice, out

NOT_SUPPORTED = 4
pytestmark = [pytest.mark.skipif(shutil.which("g++") is None, reason="host execution needs g++ (with libasan / libubsan)"),
              pytest.mark.slow]  # the warp-64 host-execution build (cached; minutes of CPU)


def corex_device(**env: str) -> HostExecDevice:
    return HostExecDevice(64, **env)


@pytest.fixture
def make_device():
    devices = []

    def make(**env: str) -> HostExecDevice:
        devices.append(corex_device(**env))
        return devices[-1]

    yield make
    for device in devices:
        device.close()


def test_the_build_says_what_it_is(make_device):
    device = make_device()
    info = device.string("build_info")
    assert info.startswith("llaisys Iluvatar CoreX kernels for ivcore20, warp 64"), info


def test_no_device_names_the_device_nodes_and_ixsmi(make_device):
    """CoreX's runtime answers cudaErrorNoDevice when the driver's /dev/iluvatar* nodes are missing (a
    container started without them): zero devices, not an error, and the reason says where to look."""
    device = make_device(LLAISYS_HOST_EXEC_DEVICES="0")
    status, message, (count,) = device.call("device_count", out("int"))
    assert status == 0 and count == 0
    assert message.startswith("no Iluvatar CoreX GPU: the runtime reports none"), message
    if glob.glob("/dev/iluvatar*"):
        assert "exists: ixsmi lists the GPUs the driver sees" in message, message
    else:
        assert "there is no /dev/iluvatar* device node" in message and "ixsmi" in message, message
    status, message, _ = device.call("malloc", 0, 16, out("ptr"), check=False)
    assert status == 1 and "no device 0" in message


@pytest.mark.parametrize("capability,usable,reason", [
    ("80", True, ""),  # ivcore20: what this build is for
    ("71", False, "compute capability 7.1) is not among this build's architectures (ivcore20): rebuild with "
                  "LLAISYS_ILUVATAR_ARCH=ivcore11"),
    ("70", False, "rebuild with LLAISYS_ILUVATAR_ARCH=ivcore10"),
    ("75", True, ""),  # a capability the table does not name is let through: the launch decides
], ids=["ivcore20", "ivcore11", "ivcore10", "unknown"])
def test_a_device_of_another_architecture_is_refused_by_name(make_device, capability, usable, reason):
    device = make_device(LLAISYS_HOST_EXEC_CC=capability)
    _, message, (count,) = device.call("device_count", out("int"))
    assert count == (1 if usable else 0), message
    assert reason in message


def test_a_device_with_small_blocks_is_refused(make_device):
    device = make_device(LLAISYS_HOST_EXEC_MAX_THREADS="128")
    _, message, (count,) = device.call("device_count", out("int"))
    assert count == 0 and "allows 128 threads per block, the kernels need 256" in message, message


def test_adaptive_blocks_stay_within_the_device_limit(make_device):
    """argmax and sample would take 1024 threads for this vocabulary; on a device allowing 256 they take 256
    (whole warps of 64) and still find the right token."""
    device = make_device(LLAISYS_HOST_EXEC_MAX_THREADS="256")
    assert device.call("device_count", out("int"))[2][0] == 1
    vals = torch.randn(10_000, generator=torch.Generator().manual_seed(7))
    vals[6_543] = 9.0
    x = device.upload(vals)
    idx, val = device.empty((1,), torch.int64, -1), device.empty((1,), torch.float32)
    device.call("argmax", 0, None, 0, 10_000, idx.ptr, val.ptr, x.ptr)
    assert int(device.download(idx)[0]) == 6_543 and float(device.download(val)[0]) == 9.0
    token = device.empty((1,), torch.int64, -1)
    device.call("sample", 0, None, 0, 10_000, token.ptr, x.ptr, 1.0, 1, 1.0, 3)  # top_k = 1: the argmax
    assert int(device.download(token)[0]) == 6_543


def test_graph_capture_missing_from_the_runtime_is_not_supported(make_device):
    """Graph capture is optional: where CoreX's runtime answers cudaErrorNotSupported the slot reports
    LLAISYS_NOT_SUPPORTED, and the stream goes on working eagerly."""
    device = make_device(LLAISYS_HOST_EXEC_UNSUPPORTED="graphs")
    _, _, (stream,) = device.call("stream_create", 0, out("ptr"))
    try:
        status, message, _ = device.call("graph_begin_capture", 0, stream, check=False)
        assert status == NOT_SUPPORTED and "cudaErrorNotSupported" in message, message
        x = device.upload(torch.ones(64))
        device.call("add", 0, stream, 0, 64, x.ptr, x.ptr, x.ptr)
        device.call("stream_synchronize", 0, stream)
        assert torch.equal(device.download(x), torch.full((64,), 2.0))
    finally:
        device.call("stream_destroy", 0, stream)


def test_stream_wait_event_missing_from_the_runtime_is_not_supported(make_device):
    device = make_device(LLAISYS_HOST_EXEC_UNSUPPORTED="wait_event")
    _, _, (event,) = device.call("event_create", 0, out("ptr"))
    try:
        device.call("event_record", 0, event, None)
        status, message, _ = device.call("stream_wait_event", 0, None, event, check=False)
        assert status == NOT_SUPPORTED and "cudaStreamWaitEvent" in message, message
        device.call("event_synchronize", 0, event)  # events themselves still work
    finally:
        device.call("event_destroy", 0, event)
