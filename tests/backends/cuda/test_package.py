"""The installed llaisys-backend-cuda: its library, how it reports a machine without an NVIDIA GPU, and
what the wheel carries. Skips where the package is not installed; the no-GPU checks skip where a GPU is
present (the op tests then run on cuda through the `device` fixture)."""

import ctypes
import importlib.metadata
import re
import shutil
import subprocess

import pytest

import llaisys
from llaisys import abi

cuda_backend = pytest.importorskip("llaisys_backend_cuda", reason="llaisys-backend-cuda is not installed")
from llaisys_backend_cuda import plugin  # noqa: E402

NO_DEVICE_REASONS = r"no NVIDIA driver|no NVIDIA GPU|NVIDIA driver too old"


@pytest.fixture(scope="module")
def lib():
    if not cuda_backend.LIBRARY.exists():
        pytest.fail(f"{cuda_backend.LIBRARY} is missing from the installed package")
    plugin.load()  # resolves cudart / cuBLAS (RUNPATH or preload) exactly as core does
    library = ctypes.CDLL(str(cuda_backend.LIBRARY))
    library.llaisys_cuda_last_error.restype = ctypes.c_char_p
    library.llaisys_cuda_build_info.restype = ctypes.c_char_p
    return library


@pytest.fixture(scope="module")
def device_count(lib):
    count = ctypes.c_int(-1)
    assert lib.llaisys_cuda_device_count(ctypes.byref(count)) == 0, "no GPU is never an error"
    return count.value, lib.llaisys_cuda_last_error().decode()


def test_every_slot_of_the_header_is_exported(lib):
    # llaisys.abi: the header's slots (test_abi_header.py), less the ops this backend does not implement yet
    slots = set(abi.RUNTIME_SLOTS) | set(abi.OP_SLOTS) - {"moe_linear_i8"}
    assert {"device_count", "malloc", "self_attention", "graph_launch"} <= slots
    missing = sorted(s for s in slots if not hasattr(lib, f"llaisys_cuda_{s}"))
    assert not missing, f"not exported: {missing}"
    assert lib.llaisys_cuda_api_version() == llaisys.API_VERSION


def test_build_info_names_the_architectures(lib):
    info = lib.llaisys_cuda_build_info().decode()
    assert re.search(r"sm_\d+", info) and "warp 32" in info, info


def test_no_gpu_is_zero_devices_with_the_reason(device_count):
    count, reason = device_count
    if count > 0:
        pytest.skip(f"{count} GPU(s) present")
    assert count == 0 and re.search(NO_DEVICE_REASONS, reason), reason


def test_slots_fail_cleanly_without_a_device(lib, device_count):
    if device_count[0] > 0:
        pytest.skip("a GPU is present")
    ptr = ctypes.c_void_p()
    assert lib.llaisys_cuda_malloc(0, 64, ctypes.byref(ptr)) == 1
    assert "no device 0" in lib.llaisys_cuda_last_error().decode()
    assert lib.llaisys_cuda_add(0, None, 0, ctypes.c_int64(4), None, None, None) == 1


def test_llaisys_reports_the_backend_without_a_device(device_count):
    if device_count[0] > 0:
        pytest.skip("a GPU is present")
    rows = {r.name: r for r in llaisys.backend_report()}
    assert rows["cuda"].status == "no device", rows["cuda"]
    assert all(d.type != "cuda" for d in llaisys.available_devices())
    with pytest.raises(llaisys.BackendUnavailableError, match="llaisys-backend-cuda"):
        llaisys.empty((1,), device="cuda")


def test_runpath_points_into_the_nvidia_wheels():
    readelf = shutil.which("readelf")
    if readelf is None:
        pytest.skip("readelf is not installed")
    dynamic = subprocess.run([readelf, "-d", str(cuda_backend.LIBRARY)], capture_output=True, text=True).stdout
    assert "RUNPATH" in dynamic and "$ORIGIN/../nvidia/cu13/lib" in dynamic, dynamic
    assert "libcudart.so.13" in dynamic and "libcublas.so.13" in dynamic


def test_the_wheel_carries_no_test_code():
    files = [str(f) for f in importlib.metadata.files("llaisys-backend-cuda") or []]
    assert any(f.endswith("libllaisys_cuda.so") for f in files) or cuda_backend.LIBRARY.exists()
    assert not [f for f in files if "host_exec" in f or f.endswith((".cu", ".cuh"))]
