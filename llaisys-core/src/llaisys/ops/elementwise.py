"""Element-wise ops and the strided copy.

Each frontend: look up the plan for its arguments' layouts (validating them the first time,
see ``_dispatch``), test output/input overlap with the data pointers, call the kernel.
``x._end`` is one past the last byte a view can touch, so two views share memory iff
``a._ptr < b._end and b._ptr < a._end``.
"""

from __future__ import annotations

from ctypes import c_int64

from . import _checks as check
from ._dispatch import current_stream_handle, kernel_for, new_plans, remember

MAX_RANK = 16
NUMERICS = check.NUMERICS


_add = new_plans()


def add(c, a, b) -> None:
    """c = a + b (same shape and dtype, contiguous). c may be a or b itself; no other overlap."""
    try:
        kernel, fail, device, code, n = _add[c._layout, a._layout, b._layout]
    except (AttributeError, KeyError):
        kernel, fail, device, code, n = _plan_add(c, a, b)
    c_ptr, a_ptr, b_ptr = c._ptr, a._ptr, b._ptr
    if a_ptr < c._end and c_ptr < a._end and a_ptr != c_ptr:  # (same layouts: the same pointer is the same view)
        check.overlap("add", "c", "a", exact_allowed=True)
    if b_ptr < c._end and c_ptr < b._end and b_ptr != c_ptr:
        check.overlap("add", "c", "b", exact_allowed=True)
    status = kernel(device.index, current_stream_handle(device), code, n, c_ptr, a_ptr, b_ptr)
    if status:
        fail(status)


def _plan_add(c, a, b):
    device = check.tensors("add", c=c, a=a, b=b)
    check.dtype("add", "c", c, check.FLOATS)
    check.same_dtype("add", "c", c, a=a, b=b)
    check.shape("add", "a", a, c.shape)
    check.shape("add", "b", b, c.shape)
    check.contiguous("add", c=c, a=a, b=b)
    check.writable("add", "c", c)
    n = c.numel()
    return remember(_add, (c._layout, a._layout, b._layout), (*kernel_for("add", device, n > 0), device, c.dtype.code, n))


_swiglu = new_plans()


def swiglu(out, gate, up, numerics: str = "exact") -> None:
    """out = up * gate / (1 + exp(-gate)). out may be gate or up itself; no other overlap.
    ``numerics``: "exact" or "hf" (see ``rms_norm``)."""
    try:
        mode = NUMERICS[numerics]
    except (KeyError, TypeError):
        mode = check.numerics("swiglu", numerics)
    try:
        kernel, fail, device, code, n = _swiglu[out._layout, gate._layout, up._layout]
    except (AttributeError, KeyError):
        kernel, fail, device, code, n = _plan_swiglu(out, gate, up)
    o_ptr, g_ptr, u_ptr = out._ptr, gate._ptr, up._ptr
    if g_ptr < out._end and o_ptr < gate._end and g_ptr != o_ptr:
        check.overlap("swiglu", "out", "gate", exact_allowed=True)
    if u_ptr < out._end and o_ptr < up._end and u_ptr != o_ptr:
        check.overlap("swiglu", "out", "up", exact_allowed=True)
    status = kernel(device.index, current_stream_handle(device), code, mode, n, o_ptr, g_ptr, u_ptr)
    if status:
        fail(status)


def _plan_swiglu(out, gate, up):
    device = check.tensors("swiglu", out=out, gate=gate, up=up)
    check.dtype("swiglu", "out", out, check.FLOATS)
    check.same_dtype("swiglu", "out", out, gate=gate, up=up)
    check.shape("swiglu", "gate", gate, out.shape)
    check.shape("swiglu", "up", up, out.shape)
    check.contiguous("swiglu", out=out, gate=gate, up=up)
    check.writable("swiglu", "out", out)
    n = out.numel()
    return remember(_swiglu, (out._layout, gate._layout, up._layout),
                    (*kernel_for("swiglu", device, n > 0), device, out.dtype.code, n))


_rearrange = new_plans()


def rearrange(out, x) -> None:
    """Strided copy: out[i...] = x[i...] for any strides of either (same shape and dtype).

    out may be x itself (the same view: nothing to do); no other overlap.
    """
    try:
        kernel, fail, device, itemsize, ndim, shape = _rearrange[out._layout, x._layout]
    except (AttributeError, KeyError):
        kernel, fail, device, itemsize, ndim, shape = _plan_rearrange(out, x)
    o_ptr, x_ptr = out._ptr, x._ptr
    if x_ptr < out._end and o_ptr < x._end:
        if x_ptr == o_ptr and x._strides == out._strides:
            return  # a copy onto itself
        check.overlap("rearrange", "out", "x", exact_allowed=True)
    status = kernel(device.index, current_stream_handle(device), itemsize, ndim, shape,
                    o_ptr, (c_int64 * ndim)(*out._strides), x_ptr, (c_int64 * ndim)(*x._strides))
    if status:
        fail(status)


def _plan_rearrange(out, x):
    device = check.tensors("rearrange", out=out, x=x)
    check.same_dtype("rearrange", "out", out, x=x)
    check.shape("rearrange", "x", x, out.shape)
    check.writable("rearrange", "out", out)
    if out.ndim > MAX_RANK:
        check.fail("rearrange", f"rank {out.ndim} exceeds the supported {MAX_RANK}")
    return remember(_rearrange, (out._layout, x._layout),
                    (*kernel_for("rearrange", device, out.numel() > 0), device, out.dtype.itemsize, out.ndim,
                     (c_int64 * out.ndim)(*out.shape)))
