"""The installed llaisys-backend-iluvatar on a CoreX machine: its library, its devices (or why there are none),
the runtime it was linked with, and the optional slots (graph capture, stream_wait_event), which CoreX may
not offer: they must work or report LLAISYS_NOT_SUPPORTED, never fail otherwise.

Runs in nox -s "tests(backend='iluvatar')" on a machine with the CoreX SDK; elsewhere the package cannot be
built, and these tests skip saying so. (The op and model tests run on the iluvatar device through the
`device` fixture in that session.)"""

import ctypes
import importlib.metadata
import re
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import llaisys

try:
    importlib.metadata.distribution("llaisys-backend-iluvatar")
except importlib.metadata.PackageNotFoundError:
    pytest.skip("llaisys-backend-iluvatar is not installed (building it needs the CoreX SDK)", allow_module_level=True)
import llaisys_backend_iluvatar as iluvatar  # noqa: E402
from llaisys_backend_iluvatar import plugin  # noqa: E402

HEADER = Path(llaisys.get_include()) / "llaisys" / "backend.h"
OK, NOT_SUPPORTED = 0, 4
H2D, D2H = 1, 2


@pytest.fixture(scope="module")
def lib():
    if not iluvatar.LIBRARY.exists():
        pytest.fail(f"{iluvatar.LIBRARY} is missing from the installed package")
    plugin.load()  # exactly as core loads it
    library = ctypes.CDLL(str(iluvatar.LIBRARY))
    for name in ("last_error", "build_info"):
        getattr(library, f"llaisys_iluvatar_{name}").restype = ctypes.c_char_p
    return library


def call(lib, slot, *args) -> tuple[int, str]:
    status = getattr(lib, f"llaisys_iluvatar_{slot}")(*args)
    return status, lib.llaisys_iluvatar_last_error().decode()


@pytest.fixture(scope="module")
def device_count(lib):
    count = ctypes.c_int(-1)
    status, reason = call(lib, "device_count", ctypes.byref(count))
    assert status == OK, "no device is never an error"
    return count.value, reason


@pytest.fixture(scope="module")
def device(device_count):
    if device_count[0] == 0:
        pytest.skip(f"no usable Iluvatar device: {device_count[1]}")
    return 0


def test_every_slot_of_the_header_is_exported(lib):
    slots = set(re.findall(r"LLAISYS_FN\((\w+)\)\(", HEADER.read_text()))
    missing = sorted(s for s in slots if not hasattr(lib, f"llaisys_iluvatar_{s}"))
    assert not missing, f"not exported: {missing}"
    assert lib.llaisys_iluvatar_api_version() == llaisys.API_VERSION


def test_build_info_names_the_architectures_and_the_warp(lib):
    info = lib.llaisys_iluvatar_build_info().decode()
    assert re.match(r"llaisys Iluvatar CoreX kernels for ivcore\d+( ivcore\d+)*, warp 64, CUDA runtime", info), info


def test_linked_with_the_sdks_runtime_found_through_runpath():
    readelf = shutil.which("readelf")
    if readelf is None:
        pytest.skip("readelf is not installed")
    dynamic = subprocess.run([readelf, "-d", str(iluvatar.LIBRARY)], capture_output=True, text=True).stdout
    assert re.search(r"\(RUNPATH\)\s+Library runpath: \[[^\]]*/lib64\]", dynamic), dynamic
    assert "libcudart.so" in dynamic and "libcublas.so" in dynamic and "cudadevrt" not in dynamic, dynamic


def test_devices_or_the_reason(lib, device_count):
    count, reason = device_count
    rows = {r.name: r for r in llaisys.backend_report()}
    if count == 0:
        assert re.search(r"Iluvatar CoreX (GPU|driver)", reason) and ("/dev/iluvatar" in reason or "ixsmi" in reason
                                                                       or "architectures" in reason), reason
        assert rows["iluvatar"].status == "no device", rows["iluvatar"]
        return
    assert rows["iluvatar"].status == "loaded", rows["iluvatar"]
    assert [d for d in llaisys.available_devices() if d.type == "iluvatar"]
    for attr, check in ((1, lambda v: v == 64), (2, lambda v: v >= 256), (3, lambda v: v > 0)):  # warp, block, SMs
        value = ctypes.c_int64(-1)
        assert call(lib, "device_attribute", 0, attr, ctypes.byref(value))[0] == OK
        assert check(value.value), (attr, value.value)


def _upload(lib, array: np.ndarray) -> ctypes.c_void_p:
    ptr = ctypes.c_void_p()
    assert call(lib, "malloc", 0, ctypes.c_size_t(array.nbytes), ctypes.byref(ptr)) == (OK, "")
    assert call(lib, "memcpy", 0, ptr, array.ctypes.data_as(ctypes.c_void_p), ctypes.c_size_t(array.nbytes), H2D)[0] == OK
    return ptr


def _download(lib, ptr, like: np.ndarray) -> np.ndarray:
    out = np.empty_like(like)
    assert call(lib, "memcpy", 0, out.ctypes.data_as(ctypes.c_void_p), ptr, ctypes.c_size_t(out.nbytes), D2H)[0] == OK
    return out


def test_graph_capture_works_or_is_not_supported(lib, device):
    """add captured on a stream and replayed twice doubles x twice; or the runtime has no graphs, said so."""
    x_host = np.arange(1000, dtype=np.float32)
    x = _upload(lib, x_host)
    stream, graph = ctypes.c_void_p(), ctypes.c_void_p()
    assert call(lib, "stream_create", device, ctypes.byref(stream))[0] == OK
    try:
        status, message = call(lib, "graph_begin_capture", device, stream)
        if status == NOT_SUPPORTED:
            pytest.skip(f"this CoreX runtime has no graph capture (reported as not supported): {message}")
        assert status == OK, message
        assert call(lib, "add", device, stream, 0, ctypes.c_int64(1000), x, x, x)[0] == OK
        status, message = call(lib, "graph_end_capture", device, stream, ctypes.byref(graph))
        assert status in (OK, NOT_SUPPORTED), message
        if status == NOT_SUPPORTED:
            pytest.skip(f"this CoreX runtime cannot instantiate graphs (reported as not supported): {message}")
        for _ in range(2):
            assert call(lib, "graph_launch", device, graph, stream)[0] == OK
        assert call(lib, "stream_synchronize", device, stream)[0] == OK
        np.testing.assert_array_equal(_download(lib, x, x_host), x_host * 4)
        assert call(lib, "graph_destroy", device, graph)[0] == OK
    finally:
        call(lib, "stream_destroy", device, stream)
        call(lib, "free", device, x)


def test_stream_wait_event_works_or_is_not_supported(lib, device):
    event, stream = ctypes.c_void_p(), ctypes.c_void_p()
    assert call(lib, "stream_create", device, ctypes.byref(stream))[0] == OK
    assert call(lib, "event_create", device, ctypes.byref(event))[0] == OK
    try:
        assert call(lib, "event_record", device, event, None)[0] == OK
        status, message = call(lib, "stream_wait_event", device, stream, event)
        assert status in (OK, NOT_SUPPORTED), message
        assert call(lib, "stream_synchronize", device, stream)[0] == OK
    finally:
        call(lib, "event_destroy", device, event)
        call(lib, "stream_destroy", device, stream)


def test_the_wheel_carries_no_sources_or_test_code():
    files = [str(f) for f in importlib.metadata.files("llaisys-backend-iluvatar") or []]
    assert not [f for f in files if "host_exec" in f or f.endswith((".cu", ".cuh", ".h"))], files
    assert sys.modules["llaisys_backend_iluvatar"].PREFIX == "llaisys_iluvatar"
