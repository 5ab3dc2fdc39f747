"""DLPack export (``Tensor.__dlpack__``) and import (``from_dlpack``), legacy and versioned (1.x).

Zero-copy both ways: the producer's memory stays alive until the consumer calls the
managed tensor's deleter; a capsule that is never consumed calls it when it dies.
"""

from __future__ import annotations

import ctypes
import itertools
import math
from ctypes import POINTER, Structure, c_char_p, c_int, c_int64, c_uint8, c_uint16, c_uint32, c_uint64, c_void_p

from .abi import INT64_MAX
from .backend import DLPACK_CPU, DLPACK_CUDA
from .device import Device
from .dtype import from_dlpack_code
from .errors import LlaisysValueError
from .plugins import registry
from .storage import Storage

DLPACK_CUDA_HOST = 3
FLAG_READ_ONLY = 1
MAX_NDIM = 64


class DLDevice(Structure):
    _fields_ = [("device_type", c_int), ("device_id", c_int)]


class DLDataType(Structure):
    _fields_ = [("code", c_uint8), ("bits", c_uint8), ("lanes", c_uint16)]


class DLTensor(Structure):
    _fields_ = [("data", c_void_p), ("device", DLDevice), ("ndim", c_int), ("dtype", DLDataType),
                ("shape", POINTER(c_int64)), ("strides", POINTER(c_int64)), ("byte_offset", c_uint64)]


class DLManagedTensor(Structure):
    pass


_Deleter = ctypes.CFUNCTYPE(None, c_void_p)
DLManagedTensor._fields_ = [("dl_tensor", DLTensor), ("manager_ctx", c_void_p), ("deleter", _Deleter)]


class DLPackVersion(Structure):
    _fields_ = [("major", c_uint32), ("minor", c_uint32)]


class DLManagedTensorVersioned(Structure):
    _fields_ = [("version", DLPackVersion), ("manager_ctx", c_void_p), ("deleter", _Deleter),
                ("flags", c_uint64), ("dl_tensor", DLTensor)]


# Capsule C API, taking raw PyObject* so a dying capsule is never re-referenced.
_api = ctypes.pythonapi
_CapsuleDestructor = ctypes.CFUNCTYPE(None, c_void_p)
_capsule_new = ctypes.PYFUNCTYPE(ctypes.py_object, c_void_p, c_char_p, _CapsuleDestructor)(("PyCapsule_New", _api))
_capsule_is_valid = ctypes.PYFUNCTYPE(c_int, c_void_p, c_char_p)(("PyCapsule_IsValid", _api))
_capsule_get_pointer = ctypes.PYFUNCTYPE(c_void_p, c_void_p, c_char_p)(("PyCapsule_GetPointer", _api))
_capsule_set_name = ctypes.PYFUNCTYPE(c_int, ctypes.py_object, c_char_p)(("PyCapsule_SetName", _api))
_capsule_is_valid_obj = ctypes.PYFUNCTYPE(c_int, ctypes.py_object, c_char_p)(("PyCapsule_IsValid", _api))
_capsule_get_pointer_obj = ctypes.PYFUNCTYPE(c_void_p, ctypes.py_object, c_char_p)(("PyCapsule_GetPointer", _api))

LEGACY, VERSIONED = b"dltensor", b"dltensor_versioned"
USED_LEGACY, USED_VERSIONED = b"used_dltensor", b"used_dltensor_versioned"

# Exported tensors alive in some consumer: key -> (managed struct, shape, strides, tensor)
_exports: dict[int, tuple] = {}
_keys = itertools.count(1)


def _export_releaser(struct_type):
    @_Deleter
    def release(managed_ptr):
        _exports.pop(ctypes.cast(managed_ptr, POINTER(struct_type)).contents.manager_ctx, None)
    return release


_release_legacy = _export_releaser(DLManagedTensor)
_release_versioned = _export_releaser(DLManagedTensorVersioned)


def _capsule_destructor(name, struct_type):
    @_CapsuleDestructor
    def destroy(capsule):
        if _capsule_is_valid(capsule, name):  # never consumed: release it ourselves
            managed = ctypes.cast(_capsule_get_pointer(capsule, name), POINTER(struct_type)).contents
            managed.deleter(ctypes.addressof(managed))
    return destroy


_destroy_legacy = _capsule_destructor(LEGACY, DLManagedTensor)
_destroy_versioned = _capsule_destructor(VERSIONED, DLManagedTensorVersioned)


def dlpack_device(device: Device) -> tuple[int, int]:
    backend = registry().backend(device)
    return (backend.dlpack_device_type, device.index)


def to_dlpack(tensor, max_version=None, dl_device=None, copy=None):
    if copy:
        raise BufferError("llaisys exports DLPack without copying; copy=True is not supported")
    if dl_device is not None and tuple(dl_device) != dlpack_device(tensor.device):
        raise BufferError(f"cannot export a {tensor.device} tensor to DLPack device {tuple(dl_device)}")
    versioned = max_version is not None and tuple(max_version) >= (1, 0)
    managed = DLManagedTensorVersioned() if versioned else DLManagedTensor()
    shape = (c_int64 * max(tensor.ndim, 1))(*tensor.shape)
    strides = (c_int64 * max(tensor.ndim, 1))(*tensor.strides)
    dl = managed.dl_tensor
    dl.data = tensor.data_ptr() or None
    dl.device = DLDevice(*dlpack_device(tensor.device))
    dl.ndim = tensor.ndim
    code, bits = tensor.dtype.dlpack
    dl.dtype = DLDataType(code, bits, 1)
    dl.shape = ctypes.cast(shape, POINTER(c_int64))
    dl.strides = ctypes.cast(strides, POINTER(c_int64))
    dl.byte_offset = 0
    key = next(_keys)
    managed.manager_ctx = key
    managed.deleter = _release_versioned if versioned else _release_legacy
    if versioned:
        managed.version = DLPackVersion(1, 0)
        managed.flags = FLAG_READ_ONLY if tensor.storage.readonly else 0
    _exports[key] = (managed, shape, strides, tensor)
    if versioned:
        return _capsule_new(ctypes.addressof(managed), VERSIONED, _destroy_versioned)
    return _capsule_new(ctypes.addressof(managed), LEGACY, _destroy_legacy)


class _ImportedMemory:
    """Owns a consumed DLPack tensor: calls the producer's deleter when the last view dies."""

    def __init__(self, managed_ptr: int, deleter):
        self._managed_ptr = managed_ptr
        self._deleter = deleter

    def __del__(self):
        if self._deleter:
            self._deleter(self._managed_ptr)


def from_dlpack(obj):
    """A llaisys tensor sharing memory with ``obj`` (torch, numpy, ... or a DLPack capsule)."""
    from .tensor import Tensor, contiguous_strides

    if hasattr(obj, "__dlpack__"):
        try:
            capsule = obj.__dlpack__(max_version=(1, 0))
        except TypeError:  # a producer that predates DLPack 1.0
            capsule = obj.__dlpack__()
    else:
        capsule = obj
    if _capsule_is_valid_obj(capsule, VERSIONED):
        ptr = _capsule_get_pointer_obj(capsule, VERSIONED)
        managed: DLManagedTensorVersioned | DLManagedTensor = ctypes.cast(ptr, POINTER(DLManagedTensorVersioned)).contents
        if managed.version.major != 1:
            raise LlaisysValueError(f"unsupported DLPack major version {managed.version.major}")
        readonly = bool(managed.flags & FLAG_READ_ONLY)
        _capsule_set_name(capsule, USED_VERSIONED)
    elif _capsule_is_valid_obj(capsule, LEGACY):
        ptr = _capsule_get_pointer_obj(capsule, LEGACY)
        managed = ctypes.cast(ptr, POINTER(DLManagedTensor)).contents
        readonly = False
        _capsule_set_name(capsule, USED_LEGACY)
    else:
        raise LlaisysValueError(f"from_dlpack: {type(obj).__name__} is not a DLPack tensor or an unused capsule")
    owner = _ImportedMemory(ptr, managed.deleter)  # from here on, the deleter runs exactly once

    dl = managed.dl_tensor
    dtype = from_dlpack_code(dl.dtype.code, dl.dtype.bits, dl.dtype.lanes)
    if not 0 <= dl.ndim <= MAX_NDIM:
        raise LlaisysValueError(f"from_dlpack: ndim {dl.ndim} is outside [0, {MAX_NDIM}]")
    shape = tuple(dl.shape[i] for i in range(dl.ndim))
    if any(s < 0 for s in shape):
        raise LlaisysValueError(f"from_dlpack: negative sizes in shape {shape}")
    strides = tuple(dl.strides[i] for i in range(dl.ndim)) if dl.strides else contiguous_strides(shape)
    if any(s < 0 for s in strides):
        raise LlaisysValueError(f"from_dlpack: negative strides {strides} are not supported; pass a copy")
    device = _device_from_dlpack(dl.device.device_type, dl.device.device_id)
    numel = math.prod(shape)
    extent = 1 + sum((n - 1) * s for n, s in zip(shape, strides)) if numel else 0
    nbytes = extent * dtype.itemsize
    if numel > INT64_MAX or nbytes > INT64_MAX:
        raise LlaisysValueError(f"from_dlpack: shape {shape} with strides {strides} spans {nbytes} bytes, "
                                f"beyond the int64 limit")
    if numel and not dl.data:
        raise LlaisysValueError(f"from_dlpack: a tensor of shape {shape} has a null data pointer")
    host = dl.device.device_type in (DLPACK_CPU, DLPACK_CUDA_HOST)
    storage = Storage.external((dl.data or 0) + dl.byte_offset, nbytes, device, owner, readonly=readonly,
                               host=True if host else None)
    return Tensor(storage, shape, strides, dtype)


def _device_from_dlpack(device_type: int, device_id: int) -> Device:
    if device_type in (DLPACK_CPU, DLPACK_CUDA_HOST):
        return Device("cpu")
    reg = registry()
    for name in reg.backends:
        if name != "cpu" and reg.backend(Device(name)).dlpack_device_type == device_type:
            return Device(name, device_id)
    kind = "cuda" if device_type == DLPACK_CUDA else f"DLPack device type {device_type}"
    raise LlaisysValueError(f"from_dlpack: no loaded llaisys backend handles {kind} memory")
