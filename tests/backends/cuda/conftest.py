"""Fixtures for the CUDA backend's tests that need no GPU (they run in every session, CI's CPU one included:
they check the kernel sources, not a device).

``host_exec`` is the backend's own sources compiled by g++ for host execution (host_exec/), once per warp
size (32 as NVIDIA, 64 as Iluvatar CoreX), under AddressSanitizer and UBSan, each in a child process that
lives for the whole session.
"""

import shutil

import pytest
from host_exec.device import HostExecDevice

WARPS = [32, 64]


@pytest.fixture(scope="session", params=WARPS, ids=lambda w: f"warp{w}")
def host_exec(request):
    if shutil.which("g++") is None:
        pytest.skip("host execution needs g++ (with libasan / libubsan)")
    device = HostExecDevice(request.param)
    yield device
    device.close()


@pytest.fixture
def dev(host_exec):
    """The session's host-execution device; every tensor a test uploads is freed after it."""
    yield host_exec
    host_exec.free_all()
