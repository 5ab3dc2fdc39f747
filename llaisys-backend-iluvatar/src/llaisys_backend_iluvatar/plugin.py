"""The pluggy plugin: a cheap descriptor; the library (and with it CoreX's runtime) loads only when core asks.

The library finds CoreX's libcudart / libcublas through its RUNPATH, the SDK's lib64 folder at build time;
what those need in turn is found the way CoreX arranges it (its environment sets LD_LIBRARY_PATH). Where a
library is missing, the load error says to set LD_LIBRARY_PATH (or to reinstall, if the SDK moved)."""

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
        raise llaisys.LlaisysError(f"{e}; a CoreX runtime library was not found: set "
                                   "LD_LIBRARY_PATH=$COREX_HOME/lib64:$COREX_HOME/lib as CoreX's environment does "
                                   "(or, if the SDK moved since the build, reinstall llaisys-backend-iluvatar)") from e


@llaisys.hookimpl
def llaisys_backends() -> list[llaisys.BackendSpec]:
    return [llaisys.BackendSpec(name="iluvatar", load=load, api_version=llaisys.API_VERSION, priority=0)]
