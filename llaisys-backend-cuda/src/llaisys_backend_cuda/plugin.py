"""The pluggy plugin: a cheap descriptor; the library (and with it the CUDA runtime) loads only when core asks.

The library finds libcudart / libcublas through its RUNPATH ($ORIGIN/../nvidia/cu13/lib: the NVIDIA
wheels in site-packages) or the system's library path. Where neither works (an editable install, a
relocated package), they are preloaded from any nvidia/cu13/lib folder on sys.path and the load retried.
NCCL (collectives) is opened by the library itself when a communicator is first made: $LLAISYS_NCCL_LIBRARY,
else the nvidia-nccl-cu13 wheel beside the package, else the library path. The plugin sets
LLAISYS_NCCL_LIBRARY to the wheel's copy when it is unset and the wheel is installed, so an editable install
(whose library does not sit in site-packages) finds it too.
"""

from __future__ import annotations

import ctypes
import importlib.util
import os
from pathlib import Path

import llaisys
from llaisys.backend import DLPACK_CUDA

from . import LIBRARY, PREFIX

# in dependency order: cuBLAS needs cuBLASLt
RUNTIME_LIBRARIES = ("libcudart.so.13", "libcublasLt.so.13", "libcublas.so.13")


def wheel_library_dirs() -> list[Path]:
    """The nvidia/cu13/lib folders of the installed NVIDIA wheels."""
    spec = importlib.util.find_spec("nvidia")
    if spec is None or not spec.submodule_search_locations:
        return []
    return [Path(p) / "cu13" / "lib" for p in spec.submodule_search_locations if (Path(p) / "cu13" / "lib").is_dir()]


def preload_runtime_libraries() -> list[str]:
    """Load cudart and cuBLAS from the wheels into the process (global symbols); returns what was loaded."""
    loaded = []
    for name in RUNTIME_LIBRARIES:
        for folder in wheel_library_dirs():
            if (folder / name).is_file():
                ctypes.CDLL(str(folder / name), mode=ctypes.RTLD_GLOBAL)
                loaded.append(str(folder / name))
                break
    return loaded


def wheel_nccl() -> Path | None:
    """libnccl.so.2 of the nvidia-nccl-cu13 wheel, if installed."""
    spec = importlib.util.find_spec("nvidia")
    for folder in (spec.submodule_search_locations or []) if spec else []:
        if (Path(folder) / "nccl" / "lib" / "libnccl.so.2").is_file():
            return Path(folder) / "nccl" / "lib" / "libnccl.so.2"
    return None


def load() -> llaisys.NativeBackend:
    if "LLAISYS_NCCL_LIBRARY" not in os.environ and (nccl := wheel_nccl()) is not None:
        os.environ["LLAISYS_NCCL_LIBRARY"] = str(nccl)  # (read when the first communicator is made)
    if not LIBRARY.exists():
        raise FileNotFoundError(f"{LIBRARY} is missing: the package was installed without its compiled kernels")
    try:
        return llaisys.NativeBackend("cuda", LIBRARY, prefix=PREFIX, dlpack_device_type=DLPACK_CUDA)
    except llaisys.LlaisysError as first_error:
        if not preload_runtime_libraries():
            raise llaisys.LlaisysError(f"{first_error}; the CUDA runtime was not found either: "
                                       f"pip install nvidia-cuda-runtime nvidia-cublas") from first_error
    return llaisys.NativeBackend("cuda", LIBRARY, prefix=PREFIX, dlpack_device_type=DLPACK_CUDA)


@llaisys.hookimpl
def llaisys_backends() -> list[llaisys.BackendSpec]:
    return [llaisys.BackendSpec(name="cuda", load=load, api_version=llaisys.API_VERSION, priority=0)]
