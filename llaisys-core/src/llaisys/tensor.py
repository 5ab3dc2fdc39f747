"""Tensor: a strided view (shape, strides in elements, byte offset) of a shared Storage.

A view's metadata never changes, so everything derived from it is computed once, when the
view is made: the element count, the byte extent and data pointer, contiguity, and the
interned ``Layout`` that op frontends validate against (``llaisys.ops`` validates an op once
per combination of argument layouts, then only compares identities).

Sizes are checked with integer arithmetic when a shape is made: element counts, strides
and byte counts all fit in int64, and every view lies inside the storage it views.
"""

from __future__ import annotations

import math
import operator

import numpy as np

from . import transfer
from .abi import INT64_MAX
from .device import Device, as_device
from .dtype import DType, as_dtype, float32
from .errors import LlaisysValueError
from .storage import Storage

_ITEMSIZE = {d: d.itemsize for d in DType}


class Layout:
    """What an op frontend checks about a tensor besides its address; interned, so compared with ``is``."""

    __slots__ = ("device", "dtype", "shape", "contiguous", "writable", "numel", "nbytes")
    device: Device
    dtype: DType
    shape: tuple[int, ...]
    contiguous: bool
    writable: bool
    numel: int
    nbytes: int

    def __repr__(self) -> str:
        return (f"Layout({self.device}, {self.dtype.name}, {self.shape}, contiguous={self.contiguous}, "
                f"writable={self.writable})")


_layouts: dict[tuple, Layout] = {}
MAX_LAYOUTS = 1 << 16  # then start over: tensors keep the Layout they have, op plans for old ones just miss


def _layout(device: Device, dtype: DType, shape: tuple, contiguous: bool, writable: bool, numel: int) -> Layout:
    key = (device.type, device.index, dtype, shape, contiguous, writable)
    found = _layouts.get(key)
    if found is None:
        if len(_layouts) >= MAX_LAYOUTS:
            _layouts.clear()
        found = Layout()
        found.device, found.dtype, found.shape, found.contiguous, found.writable = device, dtype, shape, contiguous, writable
        found.numel, found.nbytes = numel, numel * _ITEMSIZE[dtype]
        _layouts[key] = found
    return found


# -- shapes and strides ----------------------------------------------------------------------------

def _as_int(value, what: str) -> int:
    """An int from an int or numpy integer (not a bool), else a LlaisysValueError naming ``what``."""
    if value.__class__ is int:
        return value
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        raise LlaisysValueError(f"{what} must be an int, got {value!r}")
    return operator.index(value)


def _as_shape(shape, itemsize: int | None = None) -> tuple[int, ...]:
    """A validated shape tuple; its element count, strides and (with ``itemsize``) byte count fit in int64."""
    if shape.__class__ is not tuple:
        if isinstance(shape, (int, np.integer)) and not isinstance(shape, bool):
            shape = (shape,)
        try:
            shape = tuple(shape)
        except TypeError:
            raise LlaisysValueError(f"shape must be an int or a sequence of ints, got {shape!r}") from None
    for s in shape:
        if s.__class__ is not int:
            if isinstance(s, bool) or not isinstance(s, (int, np.integer)):
                raise LlaisysValueError(f"shape entries must be non-negative ints, got {shape!r}")
            shape = tuple(map(int, shape))
            break
    for s in shape:
        if s < 0:
            raise LlaisysValueError(f"shape entries must be non-negative ints, got {shape!r}")
    _check_size(shape, itemsize)
    return shape


def _check_size(shape: tuple[int, ...], itemsize: int | None) -> None:
    # math.prod of Python ints never wraps, so the comparison sees the true size. Dims of size 0 still
    # count as 1 for the strides, which must fit too.
    numel = math.prod(shape)
    nbytes = numel * (itemsize or 1)
    if nbytes <= INT64_MAX and (numel or math.prod(max(s, 1) for s in shape) <= INT64_MAX):
        return
    what = f"{numel} elements" + (f" of {itemsize} bytes" if itemsize else "")
    raise LlaisysValueError(f"shape {shape} is too large: its {what} or its strides exceed the int64 limit "
                            f"({INT64_MAX})")


def contiguous_strides(shape: tuple[int, ...]) -> tuple[int, ...]:
    """Row-major strides in elements (a dim of size 0 counts as 1, as in torch)."""
    strides = [1] * len(shape)
    step = 1
    for i in range(len(shape) - 1, 0, -1):
        step *= shape[i] or 1
        strides[i - 1] = step
    return tuple(strides)


def _is_contiguous(shape, strides) -> bool:
    """Row-major dense (size-1 dims may have any stride; an empty tensor is contiguous)."""
    step = 1
    for s, st in zip(reversed(shape), reversed(strides)):
        if s != 1 and st != step:
            return 0 in shape
        step *= s
    return True


def _extent(shape, strides) -> int:
    """Elements from the first to one past the last element this view can touch (strides are >= 0)."""
    if 0 in shape:
        return 0
    return 1 + sum((s - 1) * st for s, st in zip(shape, strides))


def _view_strides(shape, strides, new_shape):
    """Strides that show the same elements with ``new_shape``, or None (torch's rule)."""
    if math.prod(shape) == 0 or _is_contiguous(shape, strides):
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


# -- the tensor --------------------------------------------------------------------------------------

class Tensor:
    __slots__ = ("_storage", "_offset", "_shape", "_strides", "_dtype", "_layout", "_ptr", "_end", "__weakref__")
    _storage: Storage
    _offset: int  # bytes from the storage's start
    _shape: tuple[int, ...]
    _strides: tuple[int, ...]  # in elements
    _dtype: DType
    _layout: Layout
    _ptr: int  # the data pointer: storage.ptr + offset
    _end: int  # one past the last byte the view can touch

    def __init__(self, storage: Storage, shape, strides, dtype: DType, offset: int = 0):
        """A view of ``storage``; raises unless every element it can touch lies inside the storage."""
        shape, strides = _as_shape(shape, _ITEMSIZE[dtype]), tuple(strides)
        if (len(strides) != len(shape) or not all(isinstance(st, int) and 0 <= st <= INT64_MAX for st in strides)
                or not isinstance(offset, int) or offset < 0):
            raise LlaisysValueError(f"invalid view: shape {shape}, strides {strides}, offset {offset}")
        contiguous = _is_contiguous(shape, strides)
        extent = _extent(shape, strides) * _ITEMSIZE[dtype]
        if offset + extent > storage.nbytes:
            raise LlaisysValueError(f"invalid view: shape {shape} with strides {strides} at byte offset {offset} "
                                    f"reaches byte {offset + extent}, past the {storage.nbytes} bytes of its storage")
        _init(self, storage, shape, strides, dtype, offset, contiguous, math.prod(shape), extent)

    # -- metadata ------------------------------------------------------------------

    shape = property(lambda self: self._shape)
    strides = property(lambda self: self._strides)
    dtype = property(lambda self: self._dtype)
    device = property(lambda self: self._layout.device)
    storage = property(lambda self: self._storage)
    offset = property(lambda self: self._offset)
    ndim = property(lambda self: len(self._shape))
    layout = property(lambda self: self._layout)

    def numel(self) -> int:
        return self._layout.numel

    @property
    def nbytes(self) -> int:
        return self._layout.nbytes

    def data_ptr(self) -> int:
        return self._ptr

    def is_contiguous(self) -> bool:
        return self._layout.contiguous

    def __repr__(self) -> str:
        return f"llaisys.Tensor(shape={self._shape}, dtype={self._dtype.name}, device={self.device})"

    def __len__(self) -> int:
        if not self._shape:
            raise TypeError("len() of a 0-d tensor")
        return self._shape[0]

    # -- views (no copy) -----------------------------------------------------------

    def view(self, *shape) -> Tensor:
        if len(shape) == 1 and not isinstance(shape[0], (int, np.integer)):
            try:
                shape = tuple(shape[0])
            except TypeError:
                raise LlaisysValueError(f"view: expected ints or one sequence of ints, got {shape[0]!r}") from None
        numel = self._layout.numel
        if -1 in shape:
            if shape.count(-1) > 1:
                raise LlaisysValueError(f"view: only one dimension can be -1, got {tuple(shape)}")
            i = shape.index(-1)
            known = math.prod(_as_shape(shape[:i] + (1,) + shape[i + 1:]))
            if known == 0 or numel % known:
                raise LlaisysValueError(f"view: shape {tuple(shape)} is invalid for {numel} elements")
            shape = shape[:i] + (numel // known,) + shape[i + 1:]
        shape = _as_shape(shape)
        if math.prod(shape) != numel:
            raise LlaisysValueError(f"view: shape {shape} is invalid for a tensor of shape {self._shape} "
                                    f"({numel} elements)")

        if self._layout.contiguous:
            strides, contiguous = contiguous_strides(shape), True
        else:
            strides = _view_strides(self._shape, self._strides, shape)
            if strides is None:
                raise LlaisysValueError(f"view: shape {shape} is not compatible with the strides {self._strides} "
                                        f"of this tensor (shape {self._shape}); call .contiguous() first")
            contiguous = _is_contiguous(shape, strides)
        return self._derive(shape, strides, self._offset, contiguous, numel)

    def permute(self, *order) -> Tensor:
        if len(order) == 1 and not isinstance(order[0], (int, np.integer)):
            order = tuple(order[0])
        n = self.ndim
        dims = [o % n if isinstance(o, (int, np.integer)) and not isinstance(o, bool) and -n <= o < n else -1
                for o in order]
        if sorted(dims) != list(range(n)):
            raise LlaisysValueError(f"permute: {tuple(order)} is not a permutation of the {n} dims")
        shape = tuple(self._shape[o] for o in dims)
        strides = tuple(self._strides[o] for o in dims)
        return self._derive(shape, strides, self._offset, _is_contiguous(shape, strides), self._layout.numel)

    def slice(self, dim, start, end) -> Tensor:
        """Elements start <= i < end of ``dim`` (no copy, no step)."""
        if dim.__class__ is not int or start.__class__ is not int or end.__class__ is not int:
            dim, start, end = _as_int(dim, "dim"), _as_int(start, "slice start"), _as_int(end, "slice end")
        old_shape = self._shape
        n = len(old_shape)
        if not -n <= dim < n:
            raise LlaisysValueError(f"dim {dim} is out of range for a {n}-d tensor")
        if dim < 0:
            dim += n
        size = old_shape[dim]
        if not 0 <= start <= end <= size:
            raise LlaisysValueError(f"slice: [{start}, {end}) is out of range for dim {dim} of size {size}")
        shape = old_shape[:dim] + (end - start,) + old_shape[dim + 1:]
        offset = self._offset + start * self._strides[dim] * _ITEMSIZE[self._dtype]
        contiguous = (dim == 0 and self._layout.contiguous) or _is_contiguous(shape, self._strides)
        return self._derive(shape, self._strides, offset, contiguous, math.prod(shape))

    def _derive(self, shape, strides, offset, contiguous, numel) -> Tensor:
        """A view of the same storage whose elements all lie inside this one's (so inside the storage)."""
        t = Tensor.__new__(Tensor)
        itemsize = _ITEMSIZE[self._dtype]
        extent = numel * itemsize if contiguous or not numel else _extent(shape, strides) * itemsize
        _init(t, self._storage, shape, strides, self._dtype, offset, contiguous, numel, extent)
        return t

    # -- copies --------------------------------------------------------------------

    def contiguous(self) -> Tensor:
        if self._layout.contiguous:
            return self
        from . import ops
        out = empty(self._shape, self._dtype, self.device)
        ops.rearrange(out, self)
        return out

    def to(self, device) -> Tensor:
        device = as_device(device)
        if device is self.device:
            return self
        src = self.contiguous()
        out = empty(self._shape, self._dtype, device)
        if src.nbytes:
            transfer.copy(out._storage, out._ptr, src._storage, src._ptr, src.nbytes)
        return out

    def numpy(self) -> np.ndarray:
        """A host copy as a numpy array (bf16 as ``ml_dtypes.bfloat16``)."""
        src = self.contiguous()
        array = np.empty(self._shape, dtype=self._dtype.numpy)
        if src.nbytes:
            transfer.to_host(array.ctypes.data, src._storage, src._ptr, src.nbytes)
        return array

    def load(self, host) -> Tensor:
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
            try:
                host = np.frombuffer(memoryview(host).cast("B"), dtype=np.uint8)
            except TypeError:
                raise LlaisysValueError(f"load: expected a numpy array or a bytes-like buffer, got "
                                        f"{type(host).__name__}") from None
            if host.nbytes != self.nbytes:
                raise LlaisysValueError(f"load: buffer of {host.nbytes} bytes does not fit tensor of "
                                        f"{self.nbytes} bytes")
        target = self if self._layout.contiguous else empty(self._shape, self._dtype, self.device)
        if self.nbytes:
            transfer.from_host(target._storage, target._ptr, host.ctypes.data, self.nbytes)
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


def _init(t: Tensor, storage: Storage, shape, strides, dtype, offset, contiguous, numel, extent) -> None:
    """Fill a view's slots; the caller has checked that ``extent`` bytes at ``offset`` lie in the storage."""
    t._storage = storage
    t._offset = offset
    t._shape = shape
    t._strides = strides
    t._dtype = dtype
    t._layout = _layout(storage.device, dtype, shape, contiguous, not storage.readonly, numel)
    t._ptr = storage.ptr + offset
    t._end = t._ptr + extent  # one past the last byte the view can touch (ops' overlap test)


# -- construction ------------------------------------------------------------------

def empty(shape, dtype=float32, device="cpu") -> Tensor:
    dtype, device = as_dtype(dtype), as_device(device)
    shape = _as_shape(shape, _ITEMSIZE[dtype])
    numel = math.prod(shape)
    storage = Storage.allocate(device, numel * _ITEMSIZE[dtype])
    t = Tensor.__new__(Tensor)
    _init(t, storage, shape, contiguous_strides(shape), dtype, 0, True, numel, storage.nbytes)
    return t


def zeros(shape, dtype=float32, device="cpu") -> Tensor:
    t = empty(shape, dtype, device)
    if t.nbytes:
        t._storage.backend.memset(t.device.index, t._ptr, 0, t.nbytes)
    return t


def from_numpy(array, device="cpu") -> Tensor:
    """A copy of a numpy array (any strides) on ``device``."""
    array = np.asarray(array)
    dtype = as_dtype(array.dtype)
    if not array.flags.c_contiguous:
        array = array.copy(order="C")  # (np.ascontiguousarray would turn a 0-d array into 1-d)
    t = empty(array.shape, dtype, device)
    if t.nbytes:
        transfer.from_host(t._storage, t._ptr, array.ctypes.data, t.nbytes)
    return t


def from_buffer(buffer, dtype, shape, offset: int = 0) -> Tensor:
    """A CPU tensor over ``buffer`` (bytes, mmap, ...) without a copy; keeps ``buffer`` alive."""
    dtype = as_dtype(dtype)
    shape = _as_shape(shape, _ITEMSIZE[dtype])
    offset = _as_int(offset, "from_buffer: offset")
    nbytes = math.prod(shape) * _ITEMSIZE[dtype]
    view = memoryview(buffer)
    if offset < 0 or offset + nbytes > view.nbytes:
        raise LlaisysValueError(f"from_buffer: {nbytes} bytes at offset {offset} exceed the buffer's "
                                f"{view.nbytes} bytes")
    host = np.frombuffer(view.cast("B") if view.ndim != 1 or view.format != "B" else view,
                         dtype=np.uint8, count=nbytes, offset=offset)
    storage = Storage.external(host.ctypes.data if nbytes else 0, nbytes, Device("cpu"), owner=host,
                               readonly=view.readonly)
    return Tensor(storage, shape, contiguous_strides(shape), dtype)
