"""The pluggy plugin: a cheap descriptor; the library is opened only when core loads it."""

import llaisys
from llaisys.backend import DLPACK_CPU

from . import LIBRARY


def _load() -> llaisys.NativeBackend:
    if not LIBRARY.exists():
        raise FileNotFoundError(f"{LIBRARY} is missing: the package was installed without its compiled kernels")
    return llaisys.NativeBackend("cpu", LIBRARY, prefix="llaisys_cpu", dlpack_device_type=DLPACK_CPU)


@llaisys.hookimpl
def llaisys_backends():
    return [llaisys.BackendSpec(name="cpu", load=_load, api_version=llaisys.API_VERSION, priority=0)]
