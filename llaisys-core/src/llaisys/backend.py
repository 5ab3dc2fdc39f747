"""What a backend plugin provides: a device runtime and kernels, behind one object."""

from __future__ import annotations

import ctypes
from pathlib import Path

from .native import MemcpyKind, NativeLibrary

DLPACK_CPU = 1
DLPACK_CUDA = 2


class Backend:
    """Base class of the object a ``BackendSpec.load()`` returns.

    Device pointers, host pointers and stream handles are plain ints; ``stream=None``
    is the default stream. ``kernel(op)`` returns ``fn(device_index, stream, *op_args)``
    (op args exactly as the ``llaisys.ops`` frontend received them, already validated)
    or None when the backend does not implement ``op``.
    """

    name: str = "?"
    dlpack_device_type: int = DLPACK_CUDA

    def device_count(self) -> int: raise NotImplementedError
    def malloc(self, device_index: int, nbytes: int) -> int: raise NotImplementedError
    def free(self, device_index: int, ptr: int) -> None: raise NotImplementedError
    def malloc_host(self, nbytes: int) -> int: raise NotImplementedError
    def free_host(self, ptr: int) -> None: raise NotImplementedError
    def memset(self, device_index: int, ptr: int, value: int, nbytes: int, stream=None) -> None:
        raise NotImplementedError
    def memcpy(self, device_index: int, dst: int, src: int, nbytes: int, kind: MemcpyKind) -> None:
        raise NotImplementedError
    def memcpy_async(self, device_index: int, dst: int, src: int, nbytes: int, kind: MemcpyKind,
                     stream) -> None: raise NotImplementedError
    def stream_create(self, device_index: int) -> int: raise NotImplementedError
    def stream_destroy(self, device_index: int, stream: int) -> None: raise NotImplementedError
    def stream_synchronize(self, device_index: int, stream) -> None: raise NotImplementedError
    def synchronize(self, device_index: int) -> None: raise NotImplementedError
    def kernel(self, op: str): return None


class NativeBackend(Backend):
    """A backend whose runtime and kernels live in one shared library (see ``llaisys.native``)."""

    def __init__(self, name: str, library: str | Path, prefix: str, dlpack_device_type: int = DLPACK_CUDA):
        self.name = name
        self.dlpack_device_type = dlpack_device_type
        self.lib = NativeLibrary(library, prefix)
        self.api_version = self.lib.api_version

    def device_count(self) -> int:
        count = ctypes.c_int(0)
        self.lib.call("device_count", ctypes.byref(count))
        return count.value

    def malloc(self, device_index, nbytes):
        ptr = ctypes.c_void_p()
        self.lib.call("malloc", device_index, nbytes, ctypes.byref(ptr))
        return ptr.value or 0

    def free(self, device_index, ptr):
        self.lib.call("free", device_index, ptr)

    def malloc_host(self, nbytes):
        ptr = ctypes.c_void_p()
        self.lib.call("malloc_host", nbytes, ctypes.byref(ptr))
        return ptr.value or 0

    def free_host(self, ptr):
        self.lib.call("free_host", ptr)

    def memset(self, device_index, ptr, value, nbytes, stream=None):
        self.lib.call("memset", device_index, ptr, value, nbytes, stream)

    def memcpy(self, device_index, dst, src, nbytes, kind):
        self.lib.call("memcpy", device_index, dst, src, nbytes, int(kind))

    def memcpy_async(self, device_index, dst, src, nbytes, kind, stream):
        self.lib.call("memcpy_async", device_index, dst, src, nbytes, int(kind), stream)

    def stream_create(self, device_index):
        stream = ctypes.c_void_p()
        self.lib.call("stream_create", device_index, ctypes.byref(stream))
        return stream.value or 0

    def stream_destroy(self, device_index, stream):
        self.lib.call("stream_destroy", device_index, stream)

    def stream_synchronize(self, device_index, stream):
        self.lib.call("stream_synchronize", device_index, stream)

    def synchronize(self, device_index):
        self.lib.call("device_synchronize", device_index)

    def kernel(self, op):
        return self.lib.kernel(op)
