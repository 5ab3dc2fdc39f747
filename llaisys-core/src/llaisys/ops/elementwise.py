"""Element-wise ops and the strided copy.

Each frontend: look up the plan for its arguments' layouts (validating them the first time,
see ``_dispatch``), test output/input overlap with the data pointers, call the kernel.
``x._end`` is one past the last byte a view can touch, so two views share memory iff
``a._ptr < b._end and b._ptr < a._end``.
"""

from __future__ import annotations

from ctypes import c_int64

import numpy as np

from . import _checks as check
from ._dispatch import current_stream_handle, kernel_for, new_plans, remember

MAX_RANK = 16
NUMERICS = check.NUMERICS
F32_MAX = float(np.finfo(np.float32).max)


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


_scale = new_plans()


def scale(out, x, factor: float) -> None:
    """out = x * factor (same shape and dtype, contiguous), in f32 with factor rounded to f32, rounded once.
    out may be x itself; no other overlap."""
    try:
        kernel, fail, device, code, n = _scale[out._layout, x._layout]
    except (AttributeError, KeyError):
        kernel, fail, device, code, n = _plan_scale(out, x)
    if factor.__class__ is not float or not -F32_MAX <= factor <= F32_MAX:
        factor = check.number("scale", "factor", factor, -F32_MAX, F32_MAX)
    o_ptr, x_ptr = out._ptr, x._ptr
    if x_ptr < out._end and o_ptr < x._end and x_ptr != o_ptr:
        check.overlap("scale", "out", "x", exact_allowed=True)
    status = kernel(device.index, current_stream_handle(device), code, n, factor, o_ptr, x_ptr)
    if status:
        fail(status)


def _plan_scale(out, x):
    device = check.tensors("scale", out=out, x=x)
    check.dtype("scale", "out", out, check.FLOATS)
    check.same_dtype("scale", "out", out, x=x)
    check.shape("scale", "x", x, out.shape)
    check.contiguous("scale", out=out, x=x)
    check.writable("scale", "out", out)
    n = out.numel()
    return remember(_scale, (out._layout, x._layout), (*kernel_for("scale", device, n > 0), device, out.dtype.code, n))


_glu_plans = {"swiglu": new_plans(), "geglu_tanh": new_plans()}


def swiglu(out, gate, up, numerics: str = "exact") -> None:
    """out = up * gate / (1 + exp(-gate)) (SiLU-gated: Qwen2, Llama, ...). out may be gate or up itself; no
    other overlap. ``numerics``: "exact" or "hf" (see ``rms_norm``; hf rounds silu(gate) before the product)."""
    _glu("swiglu", out, gate, up, numerics)


def geglu_tanh(out, gate, up, numerics: str = "exact") -> None:
    """out = up * gelu_tanh(gate), gelu_tanh(x) = x / 2 * (1 + tanh(sqrt(2 / pi) * (x + 0.044715 x^3))) (HF's
    ``gelu_pytorch_tanh``: Gemma). out may be gate or up itself; no other overlap. ``numerics``: "exact" or
    "hf" (see ``rms_norm``; hf rounds gelu_tanh(gate) before the product, as HF's act_fn(gate) * up does)."""
    _glu("geglu_tanh", out, gate, up, numerics)


def _glu(op: str, out, gate, up, numerics: str) -> None:
    """A gated linear unit: out = act(gate) * up, element-wise (same shape and dtype, contiguous)."""
    try:
        mode = NUMERICS[numerics]
    except (KeyError, TypeError):
        mode = check.numerics(op, numerics)
    try:
        kernel, fail, device, code, n = _glu_plans[op][out._layout, gate._layout, up._layout]
    except (AttributeError, KeyError):
        kernel, fail, device, code, n = _plan_glu(op, out, gate, up)
    o_ptr, g_ptr, u_ptr = out._ptr, gate._ptr, up._ptr
    if g_ptr < out._end and o_ptr < gate._end and g_ptr != o_ptr:
        check.overlap(op, "out", "gate", exact_allowed=True)
    if u_ptr < out._end and o_ptr < up._end and u_ptr != o_ptr:
        check.overlap(op, "out", "up", exact_allowed=True)
    status = kernel(device.index, current_stream_handle(device), code, mode, n, o_ptr, g_ptr, u_ptr)
    if status:
        fail(status)


def _plan_glu(op: str, out, gate, up):
    device = check.tensors(op, out=out, gate=gate, up=up)
    check.dtype(op, "out", out, check.FLOATS)
    check.same_dtype(op, "out", out, gate=gate, up=up)
    check.shape(op, "gate", gate, out.shape)
    check.shape(op, "up", up, out.shape)
    check.contiguous(op, out=out, gate=gate, up=up)
    check.writable(op, "out", out)
    n = out.numel()
    return remember(_glu_plans[op], (out._layout, gate._layout, up._layout),
                    (*kernel_for(op, device, n > 0), device, out.dtype.code, n))


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
