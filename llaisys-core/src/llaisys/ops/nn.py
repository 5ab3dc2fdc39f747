"""The layers of a transformer block (frontends as in ``elementwise``: plan, overlap test, kernel)."""

from __future__ import annotations

import numpy as np

from ..dtype import bfloat16, float32, int8, uint8
from ..tensor import Tensor, from_numpy
from . import _checks as check
from ._dispatch import current_stream_handle, kernel_for, new_plans, remember
from .elementwise import F32_MAX, NUMERICS
from .int8 import INT8_GROUP, int8_shapes
from .quant import FORMATS, QUANT_FORMATS, QUANT_SUPER

_embedding = new_plans()



def _check_block_shapes(op: str, weight, scales, shapes: tuple, weight_is: str, scales_are: str) -> None:
    """A block linear's weight and scales against the (weight, scales) ``shapes`` they must have; the error says
    what they hold (``weight_is``, ``scales_are``)."""
    weight_shape, scales_shape = shapes
    if weight.shape != weight_shape:
        check.fail(op, f"weight has shape {weight.shape}; expected {weight_shape}: {weight_is}")
    if scales.shape != scales_shape:
        check.fail(op, f"scales has shape {scales.shape}; expected {scales_shape}: {scales_are}")

def embedding(out, index, weight) -> None:
    """out[i] = weight[index[i]]; an index outside [0, vocab) raises, never reads wild memory.

    out must share no memory with index or weight.
    """
    try:
        kernel, fail, device, code, n, dim, vocab = _embedding[out._layout, index._layout, weight._layout]
    except (AttributeError, KeyError):
        kernel, fail, device, code, n, dim, vocab = _plan_embedding(out, index, weight)
    o_ptr, o_end, i_ptr, w_ptr = out._ptr, out._end, index._ptr, weight._ptr
    if i_ptr < o_end and o_ptr < index._end:
        check.overlap("embedding", "out", "index")
    if w_ptr < o_end and o_ptr < weight._end:
        check.overlap("embedding", "out", "weight")
    status = kernel(device.index, current_stream_handle(device), code, n, dim, vocab, o_ptr, i_ptr, w_ptr)
    if status:
        fail(status)


def _plan_embedding(out, index, weight):
    op = "embedding"
    device = check.tensors(op, out=out, index=index, weight=weight)
    check.ndim(op, "index", index, 1)
    check.index_tensor(op, "index", index)
    check.ndim(op, "weight", weight, 2)
    check.dtype(op, "weight", weight, check.FLOATS)
    check.same_dtype(op, "weight", weight, out=out)
    check.shape(op, "out", out, (index.shape[0], weight.shape[1]))
    check.contiguous(op, out=out, index=index, weight=weight)
    check.writable(op, "out", out)
    runs = out.numel() > 0 or index.numel() > 0  # (an index into an empty vocab still gets its error)
    return remember(_embedding, (out._layout, index._layout, weight._layout),
                    (*kernel_for(op, device, runs), device, out.dtype.code, index.shape[0], weight.shape[1],
                     weight.shape[0]))


_linear = new_plans()


def linear(out, x, weight, bias=None) -> None:
    """out = x @ weight.T + bias; x [M, K], weight [N, K], bias [N] or None, out [M, N].

    out must share no memory with x, weight or bias.
    """
    try:
        kernel, fail, device, code, m, n, k = _linear[out._layout, x._layout, weight._layout,
                                                      None if bias is None else bias._layout]
    except (AttributeError, KeyError):
        kernel, fail, device, code, m, n, k = _plan_linear(out, x, weight, bias)
    o_ptr, o_end, x_ptr, w_ptr = out._ptr, out._end, x._ptr, weight._ptr
    if x_ptr < o_end and o_ptr < x._end:
        check.overlap("linear", "out", "x")
    if w_ptr < o_end and o_ptr < weight._end:
        check.overlap("linear", "out", "weight")
    if bias is None:
        b_ptr = None
    else:
        b_ptr = bias._ptr
        if b_ptr < o_end and o_ptr < bias._end:
            check.overlap("linear", "out", "bias")
    status = kernel(device.index, current_stream_handle(device), code, m, n, k, o_ptr, x_ptr, w_ptr, b_ptr)
    if status:
        fail(status)


def _plan_linear(out, x, weight, bias):
    op = "linear"
    device = check.tensors(op, out=out, x=x, weight=weight, bias=bias)
    check.dtype(op, "out", out, check.FLOATS)
    check.same_dtype(op, "out", out, x=x, weight=weight, bias=bias)
    check.ndim(op, "x", x, 2)
    check.ndim(op, "weight", weight, 2)
    (m, k), n = x.shape, weight.shape[0]
    check.shape(op, "weight", weight, (n, k))
    if bias is not None:
        check.shape(op, "bias", bias, (n,))
    check.shape(op, "out", out, (m, n))
    check.contiguous(op, out=out, x=x, weight=weight, bias=bias)
    check.writable(op, "out", out)
    key = (out._layout, x._layout, weight._layout, None if bias is None else bias._layout)
    return remember(_linear, key, (*kernel_for(op, device, out.numel() > 0), device, out.dtype.code, m, n, k))


_linear_i8 = new_plans()


def linear_i8(out, x, weight, scales, bias=None) -> None:
    """out = x @ w.T + bias for int8 weights w[n, k] = scale(n, k // 32) * q[n, k], stored in blocks.

    x [M, K] f32 / f16 / bf16; out [M, N] of x's dtype; bias [N] or None. weight and scales are the blocks of
    q (int8 [N, K], values in [-127, 127]) and its bf16 scales, one per row and group of ``INT8_GROUP``
    consecutive k: weight int8 [ceil(N / 16), ceil(K / 32), 8, 16, 4], scales bf16 [ceil(N / 16), ceil(K / 32),
    16] (``llaisys.ops.int8``; ``pack_int8`` makes them). Each row of x is quantized per group of 32 to int8 on
    the fly (scale max|x| / 127, round half to even), the group dot products are exact integers, the rest f32
    (backend.h, ``linear_i8``). A row of out depends on its row of x only. out must share no memory with x,
    weight, scales or bias.
    """
    try:
        kernel, fail, device, code, m, n, k = _linear_i8[out._layout, x._layout, weight._layout, scales._layout,
                                                         None if bias is None else bias._layout]
    except (AttributeError, KeyError):
        kernel, fail, device, code, m, n, k = _plan_linear_i8(out, x, weight, scales, bias)
    o_ptr, o_end, x_ptr, w_ptr, s_ptr = out._ptr, out._end, x._ptr, weight._ptr, scales._ptr
    if x_ptr < o_end and o_ptr < x._end:
        check.overlap("linear_i8", "out", "x")
    if w_ptr < o_end and o_ptr < weight._end:
        check.overlap("linear_i8", "out", "weight")
    if s_ptr < o_end and o_ptr < scales._end:
        check.overlap("linear_i8", "out", "scales")
    if bias is None:
        b_ptr = None
    else:
        b_ptr = bias._ptr
        if b_ptr < o_end and o_ptr < bias._end:
            check.overlap("linear_i8", "out", "bias")
    status = kernel(device.index, current_stream_handle(device), code, m, n, k, o_ptr, x_ptr, w_ptr, s_ptr, b_ptr)
    if status:
        fail(status)


def _plan_linear_i8(out, x, weight, scales, bias):
    op = "linear_i8"
    device = check.tensors(op, out=out, x=x, weight=weight, scales=scales, bias=bias)
    check.dtype(op, "x", x, check.FLOATS)
    check.same_dtype(op, "x", x, out=out, bias=bias)
    check.dtype(op, "weight", weight, (int8,))
    check.dtype(op, "scales", scales, (bfloat16,))
    check.ndim(op, "x", x, 2)
    check.ndim(op, "out", out, 2)
    (m, k), n = x.shape, out.shape[1]
    _check_block_shapes(op, weight, scales, int8_shapes(n, k),
                       f"the int8 blocks of an [N, K] = [{n}, {k}] matrix (N from out, K from x; llaisys.ops.pack_int8 "
                       f"makes them)", f"one bf16 scale per row and group of {INT8_GROUP} consecutive k, in blocks "
                       f"of 16 rows (llaisys.ops.pack_int8 makes them)")
    if bias is not None:
        check.shape(op, "bias", bias, (n,))
    check.shape(op, "out", out, (m, n))
    check.contiguous(op, out=out, x=x, weight=weight, scales=scales, bias=bias)
    check.writable(op, "out", out)
    key = (out._layout, x._layout, weight._layout, scales._layout, None if bias is None else bias._layout)
    return remember(_linear_i8, key, (*kernel_for(op, device, out.numel() > 0), device, out.dtype.code, m, n, k))


_linear_q = new_plans()


def linear_q(out, x, weight, scales, fmt: str, bias=None) -> None:
    """out = x @ w.T + bias for weights w in the block format ``fmt`` (one of ``QUANT_FORMATS``: q8_0, q4_0,
    q4_1, q4_k, q6_k, each holding exactly the values of the ggml type of that name).

    x [M, K] f32 / f16 / bf16; out [M, N] of x's dtype; bias [N] or None. weight and scales are uint8 blocks
    of 16 rows (``llaisys.ops.quant``: ``quant_shapes(fmt, N, K)``, ``pack_quant`` makes them). Each row of x is
    quantized per group of 32 to int8 on the fly (as ``linear_i8`` does), the group dot products are exact
    integers, the rest f32 (backend.h, ``linear_q``). A row of out depends on its row of x only. out must share
    no memory with x, weight, scales or bias.
    """
    try:
        kernel, fail, device, code, fcode, m, n, k = _linear_q[out._layout, x._layout, weight._layout,
                                                               scales._layout, None if bias is None else bias._layout,
                                                               fmt]
    except (AttributeError, KeyError, TypeError):
        kernel, fail, device, code, fcode, m, n, k = _plan_linear_q(out, x, weight, scales, fmt, bias)
    o_ptr, o_end = out._ptr, out._end
    for name, t in (("x", x), ("weight", weight), ("scales", scales), ("bias", bias)):
        if t is not None and t._ptr < o_end and o_ptr < t._end:
            check.overlap("linear_q", "out", name)
    status = kernel(device.index, current_stream_handle(device), code, fcode, m, n, k, o_ptr, x._ptr, weight._ptr,
                    scales._ptr, None if bias is None else bias._ptr)
    if status:
        fail(status)


def _quant_blocks(op, fmt, weight, scales, n, k) -> int:
    """Checks weight and scales as the ``fmt`` blocks of an [n, k] matrix; returns the format's code."""
    if fmt not in QUANT_FORMATS:
        check.fail(op, f"fmt must be one of {', '.join(QUANT_FORMATS)}, got {fmt!r}")
    f = FORMATS[fmt]
    check.dtype(op, "weight", weight, (uint8,))
    check.dtype(op, "scales", scales, (uint8,))
    if f.record == QUANT_SUPER and k % QUANT_SUPER:
        check.fail(op, f"K = {k} is not a multiple of {QUANT_SUPER}, which {fmt} blocks need (its super-blocks)")
    _check_block_shapes(op, weight, scales, f.shapes(n, k),
                       f"the {fmt} blocks of an [N, K] = [{n}, {k}] matrix (llaisys.ops.pack_quant makes them)",
                       f"the {fmt} scale records of an [N, K] = [{n}, {k}] matrix (llaisys.ops.pack_quant makes them)")
    return f.code


def _plan_linear_q(out, x, weight, scales, fmt, bias):
    op = "linear_q"
    device = check.tensors(op, out=out, x=x, weight=weight, scales=scales, bias=bias)
    check.dtype(op, "x", x, check.FLOATS)
    check.same_dtype(op, "x", x, out=out, bias=bias)
    check.ndim(op, "x", x, 2)
    check.ndim(op, "out", out, 2)
    (m, k), n = x.shape, out.shape[1]
    fcode = _quant_blocks(op, fmt, weight, scales, n, k)
    if bias is not None:
        check.shape(op, "bias", bias, (n,))
    check.shape(op, "out", out, (m, n))
    check.contiguous(op, out=out, x=x, weight=weight, scales=scales, bias=bias)
    check.writable(op, "out", out)
    key = (out._layout, x._layout, weight._layout, scales._layout, None if bias is None else bias._layout, fmt)
    return remember(_linear_q, key, (*kernel_for(op, device, out.numel() > 0), device, out.dtype.code, fcode, m, n, k))


_embedding_q = new_plans()


def embedding_q(out, index, weight, scales, fmt: str, vocab: int) -> None:
    """out[i] = row index[i] of the [vocab, dim] matrix stored in the block format ``fmt`` (as ``linear_q``
    takes it: weight and scales the blocks of ``vocab`` rows), decoded to out's dtype (f32 / f16 / bf16: each
    weight computed in f32 as ggml's dequantizer computes it, rounded once). Only the rows asked for are read;
    an index outside [0, vocab) raises. out must share no memory with index, weight or scales.
    """
    try:
        kernel, fail, device, code, fcode, n, dim = _embedding_q[out._layout, index._layout, weight._layout,
                                                                 scales._layout, fmt, vocab]
    except (AttributeError, KeyError, TypeError):
        kernel, fail, device, code, fcode, n, dim = _plan_embedding_q(out, index, weight, scales, fmt, vocab)
    o_ptr, o_end = out._ptr, out._end
    for name, t in (("index", index), ("weight", weight), ("scales", scales)):
        if t._ptr < o_end and o_ptr < t._end:
            check.overlap("embedding_q", "out", name)
    status = kernel(device.index, current_stream_handle(device), code, fcode, n, dim, vocab, o_ptr, index._ptr,
                    weight._ptr, scales._ptr)
    if status:
        fail(status)


def _plan_embedding_q(out, index, weight, scales, fmt, vocab):
    op = "embedding_q"
    device = check.tensors(op, out=out, index=index, weight=weight, scales=scales)
    vocab = check.size(op, "vocab", vocab)
    check.ndim(op, "index", index, 1)
    check.index_tensor(op, "index", index)
    check.ndim(op, "out", out, 2)
    check.dtype(op, "out", out, check.FLOATS)
    n, dim = out.shape
    check.shape(op, "out", out, (index.shape[0], dim))
    fcode = _quant_blocks(op, fmt, weight, scales, vocab, dim)
    check.contiguous(op, out=out, index=index, weight=weight, scales=scales)
    check.writable(op, "out", out)
    runs = out.numel() > 0 or index.numel() > 0
    return remember(_embedding_q, (out._layout, index._layout, weight._layout, scales._layout, fmt, vocab),
                    (*kernel_for(op, device, runs), device, out.dtype.code, fcode, n, dim))


_rms_norm = new_plans()


def rms_norm(out, x, weight, eps: float, numerics: str = "exact") -> None:
    """Per row of x [..., D]: x * weight / sqrt(mean(x^2) + eps). out may be x itself; no other overlap.

    weight [D] has x's dtype (HF's Llama / Qwen2 RMSNorm: x / rms rounded to the dtype before the weight), or
    is float32 with f16 / bf16 x (HF's Gemma RMSNorm, whose weight 1 + w stays in f32: rounded once).

    ``numerics`` (also of rope, self_attention, swiglu): "exact" computes in f32 and rounds once; "hf"
    rounds f16 / bf16 where HF transformers' forward rounds (``llaisys.abi.Numerics``, backend.h).
    """
    try:
        mode = NUMERICS[numerics]
    except (KeyError, TypeError):
        mode = check.numerics("rms_norm", numerics)
    try:
        kernel, fail, device, code, weight_code, rows, dim = _rms_norm[out._layout, x._layout, weight._layout]
    except (AttributeError, KeyError):
        kernel, fail, device, code, weight_code, rows, dim = _plan_rms_norm(out, x, weight)
    if eps.__class__ is not float or not eps >= 0.0:
        eps = check.number("rms_norm", "eps", eps, low=0)
    o_ptr, o_end, x_ptr, w_ptr = out._ptr, out._end, x._ptr, weight._ptr
    if x_ptr < o_end and o_ptr < x._end and x_ptr != o_ptr:
        check.overlap("rms_norm", "out", "x", exact_allowed=True)
    if w_ptr < o_end and o_ptr < weight._end:
        check.overlap("rms_norm", "out", "weight")
    status = kernel(device.index, current_stream_handle(device), code, mode, weight_code, rows, dim, eps, o_ptr, x_ptr,
                    w_ptr)
    if status:
        fail(status)


def _plan_rms_norm(out, x, weight):
    op = "rms_norm"
    device = check.tensors(op, out=out, x=x, weight=weight)
    check.dtype(op, "out", out, check.FLOATS)
    check.same_dtype(op, "out", out, x=x)
    if weight.dtype != float32:  # (an f32 weight goes with any float x)
        check.same_dtype(op, "out", out, weight=weight)
    if x.ndim < 1:
        check.fail(op, "x must have at least one dimension")
    check.shape(op, "weight", weight, (x.shape[-1],))
    check.shape(op, "out", out, x.shape)
    check.contiguous(op, out=out, x=x, weight=weight)
    check.writable(op, "out", out)
    dim = x.shape[-1]
    rows = x.numel() // dim if dim else 0
    return remember(_rms_norm, (out._layout, x._layout, weight._layout),
                    (*kernel_for(op, device, out.numel() > 0), device, out.dtype.code, weight.dtype.code, rows, dim))


_rope = new_plans()


def rope(out, x, pos_ids, theta, scale: float = 1.0, numerics: str = "exact") -> None:
    """Rotary embedding, half-split layout: x [seq, heads, d], pos_ids int64 [seq].

    ``theta`` is the rope base (a number, e.g. 10000.0: the course's ``rope(out, x, pos_ids, theta)``; its plain
    table is built once per device, head dim and base) or an f32 tensor [d/2] of inverse frequencies: a
    rope-scaling variant (llama3, YaRN, ...) is another table of that shape; ``rope_inv_freq(d, theta)`` is
    the plain one. Pair j at position p turns by the f32 angle p * inv_freq[j], its cos and sin times ``scale``
    (YaRN's attention factor; 1 for every other rope), as HF computes them.
    out may be x itself; no other overlap. ``numerics``: "exact" or "hf" (see ``rms_norm``).
    """
    inv_freq = theta if isinstance(theta, Tensor) else _plain_table(x, theta)
    try:
        mode = NUMERICS[numerics]
    except (KeyError, TypeError):
        mode = check.numerics("rope", numerics)
    try:
        kernel, fail, device, code, seq, heads, d = _rope[out._layout, x._layout, pos_ids._layout, inv_freq._layout]
    except (AttributeError, KeyError):
        kernel, fail, device, code, seq, heads, d = _plan_rope(out, x, pos_ids, inv_freq)
    if scale.__class__ is not float or not 0.0 < scale <= F32_MAX:
        scale = check.number("rope", "scale", scale, low=0, low_open=True, high=F32_MAX)
    o_ptr, o_end, x_ptr, p_ptr, f_ptr = out._ptr, out._end, x._ptr, pos_ids._ptr, inv_freq._ptr
    if x_ptr < o_end and o_ptr < x._end and x_ptr != o_ptr:
        check.overlap("rope", "out", "x", exact_allowed=True)
    if p_ptr < o_end and o_ptr < pos_ids._end:
        check.overlap("rope", "out", "pos_ids")
    if f_ptr < o_end and o_ptr < inv_freq._end:
        check.overlap("rope", "out", "theta")
    status = kernel(device.index, current_stream_handle(device), code, mode, seq, heads, d, scale, o_ptr, x_ptr,
                    p_ptr, f_ptr)
    if status:
        fail(status)


_plain_tables: dict = {}  # (device, head dim, theta) -> rope_inv_freq's table on that device
_PLAIN_TABLES_KEPT = 64  # a program uses one or two bases; a loop over many starts the cache afresh


def _plain_table(x, theta) -> Tensor:
    """The plain inverse-frequency table for x's head dim and device at base ``theta``, made once and kept."""
    op = "rope"
    if isinstance(theta, (bool, np.bool_)) or not isinstance(theta, (int, float, np.integer, np.floating)):
        check.fail(op, f"theta must be a number (the rope base, e.g. 10000.0) or an f32 llaisys.Tensor of "
                       f"inverse frequencies [d/2], got {type(theta).__name__}")
    theta = check.number(op, "theta", theta, low=0, low_open=True, high=F32_MAX)
    check.tensors(op, x=x)
    check.ndim(op, "x", x, 3)
    key = (x.device, x.shape[2], theta)
    table = _plain_tables.get(key)
    if table is None:
        if x.shape[2] % 2:
            check.fail(op, f"the head dim of x must be even, got {x.shape[2]}")
        if len(_plain_tables) >= _PLAIN_TABLES_KEPT:
            _plain_tables.clear()
        table = _plain_tables[key] = from_numpy(rope_inv_freq(x.shape[2], theta), device=x.device)
    return table


def _plan_rope(out, x, pos_ids, inv_freq):
    op = "rope"
    device = check.tensors(op, out=out, x=x, pos_ids=pos_ids, theta=inv_freq)
    check.dtype(op, "out", out, check.FLOATS)
    check.same_dtype(op, "out", out, x=x)
    check.ndim(op, "x", x, 3)
    if x.shape[2] % 2:
        check.fail(op, f"the head dim of x must be even, got {x.shape[2]}")
    check.shape(op, "out", out, x.shape)
    check.index_tensor(op, "pos_ids", pos_ids, (x.shape[0],))
    check.dtype(op, "theta", inv_freq, (float32,))  # (the table's errors name the argument as the caller does)
    check.shape(op, "theta", inv_freq, (x.shape[2] // 2,))
    check.contiguous(op, out=out, x=x, pos_ids=pos_ids, theta=inv_freq)
    check.writable(op, "out", out)
    return remember(_rope, (out._layout, x._layout, pos_ids._layout, inv_freq._layout),
                    (*kernel_for(op, device, out.numel() > 0), device, out.dtype.code, *x.shape))


def rope_inv_freq(head_dim: int, theta: float) -> np.ndarray:
    """The plain rope table, f32 [head_dim / 2]: 1 / theta^(2j / head_dim) as HF computes it in f32
    (``1.0 / (theta ** (torch.arange(0, d, 2).float() / d))``: the exponent and the quotient rounded to f32;
    the power here is correctly rounded, where torch's Sleef powf may be 1 ulp off for a few j)."""
    head_dim = check.size("rope_inv_freq", "head_dim", head_dim)
    if head_dim % 2:
        check.fail("rope_inv_freq", f"head_dim must be even, got {head_dim}")
    theta = check.number("rope_inv_freq", "theta", theta, low=0, low_open=True)
    exponent = np.arange(0, head_dim, 2, dtype=np.float32) / np.float32(head_dim)
    power = np.power(np.float64(np.float32(theta)), exponent.astype(np.float64)).astype(np.float32)
    return np.float32(1.0) / power


_attention = new_plans()


def self_attention(out, q, k, v, scale: float, numerics: str = "exact") -> None:
    """Causal GQA attention, mask aligned bottom-right (query i sees key j iff j <= i + S - L).

    q [L, H, d], k [S, Hkv, d], v [S, Hkv, dv], out [L, H, dv]; head h reads kv head h // (H / Hkv).
    out may be q or v itself (same elements, so same shape); no other overlap. ``numerics``: "exact" or
    "hf" (see ``rms_norm``).
    """
    try:
        mode = NUMERICS[numerics]
    except (KeyError, TypeError):
        mode = check.numerics("self_attention", numerics)
    try:
        kernel, fail, device, code, sizes = _attention[out._layout, q._layout, k._layout, v._layout]
    except (AttributeError, KeyError):
        kernel, fail, device, code, sizes = _plan_self_attention(out, q, k, v)
    if scale.__class__ is not float or scale != scale:
        scale = check.number("self_attention", "scale", scale)
    o_ptr, o_end, q_ptr, k_ptr, v_ptr = out._ptr, out._end, q._ptr, k._ptr, v._ptr
    if q_ptr < o_end and o_ptr < q._end and not (q_ptr == o_ptr and q._shape == out._shape):
        check.overlap("self_attention", "out", "q", exact_allowed=True)
    if k_ptr < o_end and o_ptr < k._end:
        check.overlap("self_attention", "out", "k")
    if v_ptr < o_end and o_ptr < v._end and not (v_ptr == o_ptr and v._shape == out._shape):
        check.overlap("self_attention", "out", "v", exact_allowed=True)
    status = kernel(device.index, current_stream_handle(device), code, mode, *sizes, scale, o_ptr, q_ptr, k_ptr, v_ptr)
    if status:
        fail(status)


def _plan_self_attention(out, q, k, v):
    op = "self_attention"
    device = check.tensors(op, out=out, q=q, k=k, v=v)
    check.dtype(op, "out", out, check.FLOATS)
    check.same_dtype(op, "out", out, q=q, k=k, v=v)
    for name, t in (("q", q), ("k", k), ("v", v), ("out", out)):
        check.ndim(op, name, t, 3)
    (seq_q, heads, d), (seq_k, kv_heads) = q.shape, k.shape[:2]
    check.shape(op, "k", k, (seq_k, kv_heads, d))
    check.shape(op, "v", v, (seq_k, kv_heads, v.shape[2]))
    check.shape(op, "out", out, (seq_q, heads, v.shape[2]))
    if kv_heads == 0 or heads % kv_heads:
        check.fail(op, f"the {heads} query heads must be a multiple of the {kv_heads} kv heads")
    if seq_k < seq_q:
        check.fail(op, f"k has {seq_k} positions, fewer than the {seq_q} queries")
    if d == 0 and out.numel():
        check.fail(op, "the head dim d of q and k is 0: attention needs d >= 1")
    check.contiguous(op, out=out, q=q, k=k, v=v)
    check.writable(op, "out", out)
    sizes = (seq_q, seq_k, heads, kv_heads, d, v.shape[2])
    return remember(_attention, (out._layout, q._layout, k._layout, v._layout),
                    (*kernel_for(op, device, out.numel() > 0), device, out.dtype.code, sizes))
