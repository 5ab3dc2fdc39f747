"""Batched LoRA adapters (Punica's SGMV): every row of a batch may run with another adapter, or with none.

A layer's LoRA update for row m with adapter slot s = adapters[m] is scales[s] * (x[m] @ A[s].T) @ B[s], made in
two steps around the base layer's output:

    lora_shrink(h, x, a, adapters, scales)     h [M, R] f32 = scales[s] * (x[m] @ a[s].T)   (0 where s = -1)
    lora_expand(out, h, b, adapters)           out[m] += h[m] @ b[s], in place               (untouched where s = -1)

with the adapters stacked in slots: a [S, R, K] (A, zero rows padding a lower rank to R), b [S, R, N] (B
transposed, so that a row's update is a sum of rows of b), scales f32 [S] (alpha / rank). adapters is int64 [M],
each row's slot in [0, S) or -1; a value outside [-1, S) raises (on an accelerator at the next synchronizing call),
never a read outside the stacks. A row's arithmetic depends only on its own data and the sizes: the same bits alone,
in any batch and on any number of threads (backend.h ``lora_shrink``, ``lora_expand``).
Frontends as in ``elementwise``: plan, overlap test, kernel.
"""

from __future__ import annotations

from ..dtype import float32
from . import _checks as check
from ._dispatch import current_stream_handle, kernel_for, new_plans, remember

_shrink = new_plans()


def lora_shrink(h, x, a, adapters, scales) -> None:
    """h [M, R] float32 = per row m with s = adapters[m]:

        h[m, r] = scales[s] * sum_k x[m, k] * a[s, r, k]      (s >= 0; rows with s == -1 get h[m, :] = 0)

    x [M, K] float32 / float16 / bfloat16; a [S, R, K] of x's dtype (S adapter slots, R the rank, zero-padded rows
    allowed); adapters int64 [M] (each row's slot, -1 = no adapter); scales float32 [S]. The products are summed in
    f32 in an order fixed by K, then multiplied by the scale. An adapter outside [-1, S) raises (an accelerator
    reports it at the next synchronizing call). All tensors contiguous; h shares no memory with the others. M = 0
    does nothing.
    """
    try:
        kernel, fail, device, code, m, k, r, s = _shrink[h._layout, x._layout, a._layout, adapters._layout,
                                                        scales._layout]
    except (AttributeError, KeyError):
        kernel, fail, device, code, m, k, r, s = _plan_shrink(h, x, a, adapters, scales)
    h_ptr, h_end = h._ptr, h._end
    for name, t in (("x", x), ("a", a), ("adapters", adapters), ("scales", scales)):
        if t._ptr < h_end and h_ptr < t._end:
            check.overlap("lora_shrink", "h", name)
    status = kernel(device.index, current_stream_handle(device), code, m, k, r, s, h_ptr, x._ptr, a._ptr,
                    adapters._ptr, scales._ptr)
    if status:
        fail(status)


def _plan_shrink(h, x, a, adapters, scales):
    op = "lora_shrink"
    device = check.tensors(op, h=h, x=x, a=a, adapters=adapters, scales=scales)
    check.dtype(op, "x", x, check.FLOATS)
    check.same_dtype(op, "x", x, a=a)
    check.dtype(op, "h", h, (float32,))
    check.dtype(op, "scales", scales, (float32,))
    check.ndim(op, "x", x, 2)
    check.ndim(op, "a", a, 3)
    (m, k), (s, r) = x.shape, a.shape[:2]
    if a.shape[2] != k:
        check.fail(op, f"a has shape {a.shape}; expected (S, R, K) = ({s}, {r}, {k}) (K from x)")
    check.index_tensor(op, "adapters", adapters, (m,))
    check.shape(op, "scales", scales, (s,))
    check.shape(op, "h", h, (m, r))
    check.contiguous(op, h=h, x=x, a=a, adapters=adapters, scales=scales)
    check.writable(op, "h", h)
    # (M > 0 with R = 0 still checks the adapters: a wrong slot is an error whatever the sizes)
    return remember(_shrink, (h._layout, x._layout, a._layout, adapters._layout, scales._layout),
                    (*kernel_for(op, device, m > 0), device, x.dtype.code, m, k, r, s))


_expand = new_plans()


def lora_expand(out, h, b, adapters) -> None:
    """out [M, N] += h @ b[s] per row, in place: for each row m with s = adapters[m] >= 0 and every n,

        out[m, n] = round(out[m, n] + sum_r h[m, r] * b[s, r, n])

    the sum in f32 with r ascending, then one add to out's value and one rounding to out's dtype; rows with
    s == -1 are left untouched (not even rewritten). h [M, R] float32 (``lora_shrink``'s); b [S, R, N] of out's
    dtype (float32 / float16 / bfloat16; B transposed: a row's update is a sum of rows of b); adapters int64 [M].
    An adapter outside [-1, S) raises (an accelerator reports it at the next synchronizing call). All tensors
    contiguous; out shares no memory with h, b or adapters. M = 0 does nothing.
    """
    try:
        kernel, fail, device, code, m, r, n, s = _expand[out._layout, h._layout, b._layout, adapters._layout]
    except (AttributeError, KeyError):
        kernel, fail, device, code, m, r, n, s = _plan_expand(out, h, b, adapters)
    o_ptr, o_end = out._ptr, out._end
    for name, t in (("h", h), ("b", b), ("adapters", adapters)):
        if t._ptr < o_end and o_ptr < t._end:
            check.overlap("lora_expand", "out", name)
    status = kernel(device.index, current_stream_handle(device), code, m, r, n, s, o_ptr, h._ptr, b._ptr,
                    adapters._ptr)
    if status:
        fail(status)


def _plan_expand(out, h, b, adapters):
    op = "lora_expand"
    device = check.tensors(op, out=out, h=h, b=b, adapters=adapters)
    check.dtype(op, "out", out, check.FLOATS)
    check.same_dtype(op, "out", out, b=b)
    check.dtype(op, "h", h, (float32,))
    check.ndim(op, "out", out, 2)
    check.ndim(op, "b", b, 3)
    (m, n), (s, r) = out.shape, b.shape[:2]
    if b.shape[2] != n:
        check.fail(op, f"b has shape {b.shape}; expected (S, R, N) = ({s}, {r}, {n}) (N from out)")
    check.shape(op, "h", h, (m, r))
    check.index_tensor(op, "adapters", adapters, (m,))
    check.contiguous(op, out=out, h=h, b=b, adapters=adapters)
    check.writable(op, "out", out)
    # (M > 0 with R = 0 or N = 0 still checks the adapters)
    return remember(_expand, (out._layout, h._layout, b._layout, adapters._layout),
                    (*kernel_for(op, device, m > 0), device, out.dtype.code, m, r, n, s))
