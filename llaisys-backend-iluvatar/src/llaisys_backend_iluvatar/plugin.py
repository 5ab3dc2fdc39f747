"""The pluggy plugin: a cheap descriptor; the library (and with it CoreX's runtime) loads only when core asks.

The library finds CoreX's libcudart / libcublas through its RUNPATH, the SDK's lib64 folder at build time.
If the SDK has moved since, the load fails and the error says to set LD_LIBRARY_PATH (or to reinstall)."""

from __future__ import annotations

import llaisys
from llaisys.backend import DLPACK_CUDA  # CoreX tensors are CUDA tensors to DLPack (and to CoreX's torch)

from . import LIBRARY, PREFIX


def load() -> llaisys.NativeBackend:
    if not LIBRARY.exists():
        raise FileNotFoundError(f"{LIBRARY} is missing: the package was installed without its compiled kernels "
                                "(reinstall it where the CoreX SDK is: pip install ./llaisys-backend-iluvatar)")
    try:
        return llaisys.NativeBackend("iluvatar", LIBRARY, prefix=PREFIX, dlpack_device_type=DLPACK_CUDA)
    except llaisys.LlaisysError as e:
        if "cannot load" not in str(e):
            raise
        raise llaisys.LlaisysError(f"{e}; CoreX's runtime libraries were not found where they were at build time: "
                                   "set LD_LIBRARY_PATH=$COREX_HOME/lib64, or reinstall llaisys-backend-iluvatar "
                                   "against the SDK as it is now") from e


@llaisys.hookimpl
def llaisys_backends():
    return [llaisys.BackendSpec(name="iluvatar", load=load, api_version=llaisys.API_VERSION, priority=0)]
