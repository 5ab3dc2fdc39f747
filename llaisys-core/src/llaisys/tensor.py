"""Tensor: a strided view (shape, strides in elements, byte offset) of a shared Storage."""

from __future__ import annotations

import ctypes
import math

import numpy as np

from .device import Device, as_device
from .dtype import DType, as_dtype, float32
from .errors import LlaisysValueError
from .native import MemcpyKind
from .storage import Storage


def _as_shape(shape) -> tuple[int, ...]:
    if isinstance(shape, (int, np.integer)):
        shape = (shape,)
    try:
        shape = tuple(shape)
    except TypeError:
        raise LlaisysValueError(f"shape must be an int or a sequence of ints, got {shape!r}") from None
    for s in shape:
        if not isinstance(s, (int, np.integer)) or isinstance(s, bool) or s < 0:
            raise LlaisysValueError(f"shape entries must be non-negative ints, got {shape!r}")
    return tuple(int(s) for s in shape)


def contiguous_strides(shape: tuple[int, ...]) -> tuple[int, ...]:
    strides, step = [], 1
    for s in reversed(shape):
        strides.append(step)
        step *= max(s, 1)
    return tuple(reversed(strides))


def _view_strides(shape, strides, new_shape):
    """Strides that show the same elements with ``new_shape``, or None (torch's rule)."""
    if math.prod(shape) == 0 or contiguous_strides(shape) == _normalised(shape, strides):
        return contiguous_strides(new_shape)
    new_strides = [0] * len(new_shape)
    view_d = len(new_shape) - 1
    chunk_base_stride = strides[-1]
    tensor_numel = view_numel = 1
    for tensor_d in range(len(shape) - 1, -1, -1):
        tensor_numel *= shape[tensor_d]
        if tensor_d == 0 or (shape[tensor_d - 1] != 1 and strides[tensor_d - 1] != tensor_numel * chunk_base_stride):
            while view_d >= 0 and (view_numel < tensor_numel or new_shape[view_d] == 1):
                new_strides[view_d] = view_numel * chunk_base_stride
                view_numel *= new_shape[view_d]
                view_d -= 1
            if view_numel != tensor_numel:
                return None
            if tensor_d > 0:
                chunk_base_stride = strides[tensor_d - 1]
                tensor_numel = view_numel = 1
    return tuple(new_strides) if view_d == -1 else None


def _normalised(shape, strides):
    """Strides with size-1 dims replaced by their contiguous value (they never matter)."""
    ref = contiguous_strides(shape)
    return tuple(r if s == 1 else st for s, st, r in zip(shape, strides, ref))


class Tensor:
    __slots__ = ("_storage", "_offset", "_shape", "_strides", "_dtype", "__weakref__")

    def __init__(self, storage: Storage, shape, strides, dtype: DType, offset: int = 0):
        self._storage = storage
        self._offset = offset  # bytes
        self._shape = shape
        self._strides = strides
        self._dtype = dtype

    # -- metadata ------------------------------------------------------------------

    shape = property(lambda self: self._shape)
    strides = property(lambda self: self._strides)
    dtype = property(lambda self: self._dtype)
    device = property(lambda self: self._storage.device)
    storage = property(lambda self: self._storage)
    offset = property(lambda self: self._offset)
    ndim = property(lambda self: len(self._shape))

    def numel(self) -> int:
        return math.prod(self._shape)

    @property
    def nbytes(self) -> int:
        return self.numel() * self._dtype.itemsize

    def data_ptr(self) -> int:
        return self._storage.ptr + self._offset

    def is_contiguous(self) -> bool:
        return self.numel() == 0 or _normalised(self._shape, self._strides) == contiguous_strides(self._shape)

    def __repr__(self) -> str:
        return f"llaisys.Tensor(shape={self._shape}, dtype={self._dtype.name}, device={self.device})"

    def __len__(self) -> int:
        if not self._shape:
            raise TypeError("len() of a 0-d tensor")
        return self._shape[0]

    # -- views (no copy) -----------------------------------------------------------

    def _dim(self, dim: int) -> int:
        if not isinstance(dim, int) or not -self.ndim <= dim < self.ndim:
            raise LlaisysValueError(f"dim {dim!r} is out of range for a {self.ndim}-d tensor")
        return dim % self.ndim

    def view(self, *shape) -> "Tensor":
        if len(shape) == 1 and not isinstance(shape[0], (int, np.integer)):
            shape = tuple(shape[0])
        shape = list(shape)
        if shape.count(-1) > 1:
            raise LlaisysValueError(f"view: only one dimension can be -1, got {tuple(shape)}")
        if -1 in shape:
            known = math.prod(s for s in shape if s != -1)
            if known == 0 or self.numel() % known:
                raise LlaisysValueError(f"view: shape {tuple(shape)} is invalid for {self.numel()} elements")
            shape[shape.index(-1)] = self.numel() // known
        shape = _as_shape(shape)
        if math.prod(shape) != self.numel():
            raise LlaisysValueError(f"view: shape {shape} is invalid for a tensor of shape {self._shape} "
                                    f"({self.numel()} elements)")
        strides = _view_strides(self._shape, self._strides, shape)
        if strides is None:
            raise LlaisysValueError(f"view: shape {shape} is not compatible with the strides {self._strides} "
                                    f"of this tensor (shape {self._shape}); call .contiguous() first")
        return Tensor(self._storage, shape, strides, self._dtype, self._offset)

    def permute(self, *order) -> "Tensor":
        if len(order) == 1 and not isinstance(order[0], (int, np.integer)):
            order = tuple(order[0])
        if sorted(o % self.ndim if isinstance(o, int) and -self.ndim <= o < self.ndim else -1
                  for o in order) != list(range(self.ndim)):
            raise LlaisysValueError(f"permute: {order} is not a permutation of the {self.ndim} dims")
        order = [o % self.ndim for o in order]
        return Tensor(self._storage, tuple(self._shape[o] for o in order),
                      tuple(self._strides[o] for o in order), self._dtype, self._offset)

    def slice(self, dim: int, start: int, end: int) -> "Tensor":
        dim = self._dim(dim)
        size = self._shape[dim]
        if not (isinstance(start, int) and isinstance(end, int) and 0 <= start <= end <= size):
            raise LlaisysValueError(f"slice: [{start}, {end}) is out of range for dim {dim} of size {size}")
        shape = self._shape[:dim] + (end - start,) + self._shape[dim + 1:]
        offset = self._offset + start * self._strides[dim] * self._dtype.itemsize
        return Tensor(self._storage, shape, self._strides, self._dtype, offset)

    # -- copies --------------------------------------------------------------------

    def contiguous(self) -> "Tensor":
        if self.is_contiguous():
            return self
        from . import ops
        out = empty(self._shape, self._dtype, self.device)
        ops.rearrange(out, self)
        return out

    def to(self, device) -> "Tensor":
        device = as_device(device)
        if device == self.device:
            return self
        src = self.contiguous()
        out = empty(self._shape, self._dtype, device)
        if src.nbytes:
            _copy_bytes(out, src)
        return out

    def numpy(self) -> np.ndarray:
        """A host copy as a numpy array (bf16 as ``ml_dtypes.bfloat16``)."""
        src = self.contiguous()
        array = np.empty(self._shape, dtype=self._dtype.numpy)
        if src.nbytes:
            _copy_to_host(array.ctypes.data, src)
        return array

    def load(self, host) -> "Tensor":
        """Copy a host array (same dtype and number of elements) or a bytes-like buffer into this tensor."""
        if self._storage.readonly:
            raise LlaisysValueError("load: this tensor's memory is read-only")
        if isinstance(host, np.ndarray):
            if host.dtype != self._dtype.numpy:
                raise LlaisysValueError(f"load: array dtype {host.dtype} does not match tensor dtype "
                                        f"{self._dtype.name}")
            if host.size != self.numel():
                raise LlaisysValueError(f"load: array of shape {host.shape} does not fit tensor of shape "
                                        f"{self._shape}")
            host = np.ascontiguousarray(host)
        else:
            host = np.frombuffer(memoryview(host).cast("B"), dtype=np.uint8)
            if host.nbytes != self.nbytes:
                raise LlaisysValueError(f"load: buffer of {host.nbytes} bytes does not fit tensor of "
                                        f"{self.nbytes} bytes")
        target = self if self.is_contiguous() else empty(self._shape, self._dtype, self.device)
        if self.nbytes:
            _copy_from_host(target, host.ctypes.data)
        if target is not self:
            from . import ops
            ops.rearrange(self, target)
        return self

    # -- interop -------------------------------------------------------------------

    def __dlpack__(self, stream=None, max_version=None, dl_device=None, copy=None):
        from .dlpack import to_dlpack
        return to_dlpack(self, max_version=max_version, dl_device=dl_device, copy=copy)

    def __dlpack_device__(self):
        from .dlpack import dlpack_device
        return dlpack_device(self.device)

    def debug(self, max_elements: int = 64) -> None:
        """Print metadata and (a head of) the values, from any device."""
        print(f"Tensor shape={self._shape} strides={self._strides} dtype={self._dtype.name} "
              f"device={self.device} offset={self._offset} contiguous={self.is_contiguous()}")
        values = self.numpy()
        with np.printoptions(threshold=max_elements, edgeitems=3):
            print(values.astype(np.float32) if self._dtype.is_floating_point else values)


# -- construction ------------------------------------------------------------------

def empty(shape, dtype=float32, device="cpu") -> Tensor:
    shape, dtype, device = _as_shape(shape), as_dtype(dtype), as_device(device)
    storage = Storage.allocate(device, math.prod(shape) * dtype.itemsize)
    return Tensor(storage, shape, contiguous_strides(shape), dtype)


def zeros(shape, dtype=float32, device="cpu") -> Tensor:
    t = empty(shape, dtype, device)
    if t.nbytes:
        t.storage.backend.memset(t.device.index, t.data_ptr(), 0, t.nbytes)
    return t


def from_numpy(array, device="cpu") -> Tensor:
    """A copy of a numpy array (any strides) on ``device``."""
    array = np.asarray(array)
    dtype = as_dtype(array.dtype)
    if not array.flags.c_contiguous:
        array = array.copy(order="C")  # (np.ascontiguousarray would turn a 0-d array into 1-d)
    t = empty(array.shape, dtype, device)
    if t.nbytes:
        _copy_from_host(t, array.ctypes.data)
    return t


def from_buffer(buffer, dtype, shape, offset: int = 0) -> Tensor:
    """A CPU tensor over ``buffer`` (bytes, mmap, ...) without a copy; keeps ``buffer`` alive."""
    dtype, shape = as_dtype(dtype), _as_shape(shape)
    nbytes = math.prod(shape) * dtype.itemsize
    view = memoryview(buffer)
    if offset < 0 or offset + nbytes > view.nbytes:
        raise LlaisysValueError(f"from_buffer: {nbytes} bytes at offset {offset} exceed the buffer's "
                                f"{view.nbytes} bytes")
    host = np.frombuffer(view.cast("B") if view.ndim != 1 or view.format != "B" else view,
                         dtype=np.uint8, count=nbytes, offset=offset)
    storage = Storage.external(host.ctypes.data if nbytes else 0, nbytes, Device("cpu"), owner=host,
                               readonly=view.readonly)
    return Tensor(storage, shape, contiguous_strides(shape), dtype)


def _copy_bytes(dst: Tensor, src: Tensor) -> None:
    """Contiguous ``src`` -> contiguous ``dst`` of the same size, across devices."""
    if src.device.type == "cpu":
        _copy_from_host(dst, src.data_ptr())
    elif dst.device.type == "cpu":
        _copy_to_host(dst.data_ptr(), src)
    elif src.device.type == dst.device.type and src.device.index == dst.device.index:
        src.storage.backend.memcpy(src.device.index, dst.data_ptr(), src.data_ptr(), src.nbytes, MemcpyKind.D2D)
    else:  # between two accelerators: through the host
        staging = np.empty(src.nbytes, dtype=np.uint8)
        _copy_to_host(staging.ctypes.data, src)
        _copy_from_host(dst, staging.ctypes.data)


def _copy_from_host(dst: Tensor, host_ptr: int) -> None:
    if dst.device.type == "cpu":
        ctypes.memmove(dst.data_ptr(), host_ptr, dst.nbytes)
    else:
        dst.storage.backend.memcpy(dst.device.index, dst.data_ptr(), host_ptr, dst.nbytes, MemcpyKind.H2D)


def _copy_to_host(host_ptr: int, src: Tensor) -> None:
    if src.device.type == "cpu":
        ctypes.memmove(host_ptr, src.data_ptr(), src.nbytes)
    else:
        src.storage.backend.memcpy(src.device.index, host_ptr, src.data_ptr(), src.nbytes, MemcpyKind.D2H)
