"""Group-quantized weights (GPTQ, AWQ) kept in their width: the layout of ``linear_gq``, its numpy helpers and its
frontend.

A weight matrix w [N, K] is stored as unsigned ``bits``-bit codes q (bits 4 or 8), and per row and group of
``group_size`` consecutive k an f16 scale s and an unsigned zero point z of the same range as q:

    w[n, k] = (q[n, k] - z[n, k // group_size]) * s[n, k // group_size]

(GPTQ and AWQ write exactly these; a symmetric checkpoint's z is 2^(bits - 1), 8 for 4 bits). (q - z) * s is
exact in f32 (an integer below 2^8 times an f16), so the dequantized weights are exact. ``linear_gq`` multiplies
them with the activations as they are (f32, f16 or bf16, never rounded to integers; unlike ``linear_q`` /
``linear_i8``), so a model computes what the same model with the exactly dequantized weights computes, up to the
f32 summation order.

The blocks (backend.h, ``linear_gq``), with P = 32 / bits codes per 32-bit word, G = K / group_size and NB =
ceil(N / 16):

    weight uint8 [NB, K / P, 64]:  bytes 4 r .. 4 r + 3 of weight[b, j] are a little-endian 32-bit word holding
                                   q[16 b + r, P j + i] at bits [bits i, bits (i + 1)), i < P
    scales f16  [NB, G, 16]:       scales[b, g, r] = s[16 b + r, g]
    zeros uint8 [NB, G, 16]:       zeros[b, g, r] = z[16 b + r, g]

Rows past N are zero (q, s and z). Each block of 16 rows is one sequential stream, and every 64 bytes hold the
same P consecutive k of 16 rows: a vector load takes rows as lanes (16 lanes on AVX-512, two loads of 8 on AVX2),
and one shift and mask per step brings the next k of every row into its lane. K is a multiple of 32; group_size
is a multiple of 32 that divides K, or -1 (or K): one group per row (GPTQ's group size -1).

desc_act (GPTQ's act order: g_idx[k] is the group of column k, not k // group_size): the loader sorts the columns
by group once (``gq_perm``), packs q with its columns in that order, and passes the order as ``perm`` (int32 or
int64 [K]): column k of the packed weight then multiplies x[m, perm[k]]. The kernels read x through perm
themselves: no separate pass over x, and the weight is never permuted again.
"""

from __future__ import annotations

import numpy as np

from ..dtype import float16, int32, int64, uint8
from . import _checks as check
from ._dispatch import current_stream_handle, kernel_for, new_plans, remember

GQ_BITS = (4, 8)  # code widths linear_gq takes
GQ_BLOCK_ROWS = 16  # weight rows per block
GQ_K_MULTIPLE = 32  # K (and every group size but K itself) is a multiple of this
_F16 = np.dtype("<f2")


def gq_group_size(k: int, group_size: int) -> int:
    """The group size in k for a checkpoint's ``group_size`` (-1: one group of all K); ValueError unless K is a
    multiple of 32 and the group size a multiple of 32 dividing K (or K itself)."""
    if isinstance(group_size, (bool, np.bool_)) or not isinstance(group_size, (int, np.integer)):
        raise ValueError(f"group_size must be an int, got {group_size!r}")
    if isinstance(k, (bool, np.bool_)) or not isinstance(k, (int, np.integer)) or k < 0:
        raise ValueError(f"K must be an int >= 0, got {k!r}")
    k, gs = int(k), int(group_size)
    if k % GQ_K_MULTIPLE:
        raise ValueError(f"K = {k} must be a multiple of {GQ_K_MULTIPLE}")
    if gs == -1 or (gs == k and k > 0):
        return k
    if gs <= 0 or gs % GQ_K_MULTIPLE:
        raise ValueError(f"group_size = {gs} must be -1 (one group per row), K, or a positive multiple of "
                         f"{GQ_K_MULTIPLE}")
    if k % gs:
        raise ValueError(f"group_size = {gs} does not divide K = {k}")
    return gs


def _bits(bits) -> int:
    if isinstance(bits, (bool, np.bool_)) or not isinstance(bits, (int, np.integer)) or int(bits) not in GQ_BITS:
        raise ValueError(f"bits must be 4 or 8, got {bits!r}")
    return int(bits)


def _groups(k: int, gs: int) -> int:
    return k // gs if gs else 0


def gq_shapes(n: int, k: int, bits: int, group_size: int) -> tuple[tuple[int, int, int], tuple[int, int, int],
                                                                    tuple[int, int, int]]:
    """(weight shape, scales shape, zeros shape) of the blocks of an [n, k] matrix: uint8 [NB, K / P, 64],
    f16 [NB, G, 16], uint8 [NB, G, 16] (P = 32 / bits, G = K / group size, NB = ceil(n / 16))."""
    bits, gs = _bits(bits), gq_group_size(k, group_size)
    blocks, groups = -(-int(n) // GQ_BLOCK_ROWS), _groups(int(k), gs)
    return ((blocks, int(k) * bits // 32, 64), (blocks, groups, GQ_BLOCK_ROWS), (blocks, groups, GQ_BLOCK_ROWS))


def _blocked(rows: np.ndarray, out: np.ndarray) -> None:
    """out [NB, *rest, 16] = rows [N, *rest] in blocks of 16 rows, rows past N zero."""
    from .quant import blocked  # (quant re-exports this module's helpers)
    blocked(rows, out)


def pack_gq(q: np.ndarray, scales: np.ndarray, zeros: np.ndarray, bits: int, group_size: int, *,
            out_weight: np.ndarray | None = None, out_scales: np.ndarray | None = None,
            out_zeros: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The blocks of ``linear_gq`` (weight uint8 [NB, K / P, 64], scales f16 [NB, G, 16], zeros uint8 [NB, G, 16]:
    ``gq_shapes``) of the [N, K] matrix w[n, k] = (q[n, k] - zeros[n, k // gs]) * scales[n, k // gs].

    q: uint8 [N, K], the unpacked codes, each in [0, 2^bits) (GPTQ's qweight / AWQ's qweight unpacked, in the
    column order the kernel will read: with desc_act, sorted by group, see ``gq_perm``); scales: f16 [N, G]; zeros:
    uint8 [N, G], each in [0, 2^bits) (symmetric checkpoints: 2^(bits - 1)); bits: 4 or 8; group_size: a multiple
    of 32 dividing K, or -1 (or K) for one group per row; K a multiple of 32. Note the [N, ...] orientation: a
    GPTQ / AWQ checkpoint stores its tensors as [K, N] (in_features first), so transpose them first.
    Writes into ``out_weight`` / ``out_scales`` / ``out_zeros`` when given (C-contiguous arrays of those shapes,
    e.g. a slice of blocks of a larger weight, or an mmap), else into new arrays; returns the three.
    Raises ValueError naming the argument that is wrong."""
    bits = _bits(bits)
    q, scales, zeros = np.asarray(q), np.asarray(scales), np.asarray(zeros)
    if q.ndim != 2 or q.dtype != np.uint8:
        raise ValueError(f"pack_gq: q must be uint8 [N, K], got {q.dtype} {q.shape}")
    n, k = q.shape
    try:
        gs = gq_group_size(k, group_size)
    except ValueError as e:
        raise ValueError(f"pack_gq: {e}") from None
    groups, top = _groups(k, gs), (1 << bits) - 1
    if scales.shape != (n, groups) or scales.dtype != np.float16:
        raise ValueError(f"pack_gq: scales must be float16 [N, G] = {(n, groups)}, got {scales.dtype} {scales.shape}")
    if zeros.shape != (n, groups) or zeros.dtype != np.uint8:
        raise ValueError(f"pack_gq: zeros must be uint8 [N, G] = {(n, groups)}, got {zeros.dtype} {zeros.shape}")
    if bits < 8:
        if q.size and q.max() > top:
            raise ValueError(f"pack_gq: q must lie in [0, {top}] for {bits}-bit codes (max {q.max()})")
        if zeros.size and zeros.max() > top:
            raise ValueError(f"pack_gq: zeros must lie in [0, {top}] for {bits}-bit codes (max {zeros.max()})")
    shapes = gq_shapes(n, k, bits, gs if k else -1)
    outs = []
    for name, given, shape, dtype in (("weight", out_weight, shapes[0], np.uint8),
                                      ("scales", out_scales, shapes[1], _F16), ("zeros", out_zeros, shapes[2], np.uint8)):
        if given is None:
            given = np.empty(shape, dtype)
        elif given.shape != shape or given.dtype != dtype or not given.flags.c_contiguous:
            raise ValueError(f"pack_gq: out_{name} must be C-contiguous {np.dtype(dtype).name} {shape}, got "
                             f"{given.dtype} {given.shape}")
        outs.append(given)
    out_weight, out_scales, out_zeros = outs
    words = k * bits // 32
    if bits == 4:  # byte j of a row = codes 2 j (low nibble) and 2 j + 1 (high nibble): little-endian words
        row_bytes = np.ascontiguousarray(q[:, 0::2]) | (q[:, 1::2] << np.uint8(4))
    else:
        row_bytes = np.ascontiguousarray(q)
    # each row's words as f16 pairs (the blocks are moved as 2-byte items), blocked: [NB, words, 16, 2]
    target = out_weight.view(_F16).reshape(shapes[0][0], words, GQ_BLOCK_ROWS, 2)
    rows = row_bytes.view(_F16).reshape(n, words, 2)
    _blocked_tail(rows, target)
    _blocked(np.ascontiguousarray(scales).view(_F16), out_scales)
    _blocked(np.ascontiguousarray(zeros), out_zeros)
    return out_weight, out_scales, out_zeros


def _blocked_tail(rows: np.ndarray, out: np.ndarray) -> None:
    """out [NB, words, 16, 2] = rows [N, words, 2] in blocks of 16 rows (the 2 halves of each word kept)."""
    from .quant import blocked
    blocked(rows, out, tail=1)


def unpack_gq(weight: np.ndarray, scales: np.ndarray, zeros: np.ndarray, n: int, k: int, bits: int,
              group_size: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The inverse of ``pack_gq``: (q uint8 [n, k], scales f16 [n, G], zeros uint8 [n, G])."""
    bits = _bits(bits)
    shapes = gq_shapes(n, k, bits, group_size)
    for name, a, shape in (("weight", weight, shapes[0]), ("scales", scales, shapes[1]), ("zeros", zeros, shapes[2])):
        if a.shape != shape:
            raise ValueError(f"unpack_gq: {name} of an [{n}, {k}] matrix has shape {shape}, got {a.shape}")
    blocks, words = shapes[0][:2]
    row_bytes = np.ascontiguousarray(np.ascontiguousarray(weight).reshape(blocks, words, GQ_BLOCK_ROWS, 4)
                                     .transpose(0, 2, 1, 3)).reshape(blocks * GQ_BLOCK_ROWS, words * 4)[:n]
    if bits == 4:
        q = np.empty((n, k), np.uint8)
        q[:, 0::2], q[:, 1::2] = row_bytes & np.uint8(0x0F), row_bytes >> np.uint8(4)
    else:
        q = np.ascontiguousarray(row_bytes)
    per_row = lambda a: np.ascontiguousarray(a.transpose(0, 2, 1).reshape(blocks * GQ_BLOCK_ROWS, -1)[:n])  # noqa: E731
    return q, per_row(np.asarray(scales).view(_F16)).view(np.float16), per_row(np.asarray(zeros))


def dequantize_gq(q: np.ndarray, scales: np.ndarray, zeros: np.ndarray, group_size: int) -> np.ndarray:
    """float32 [N, K] weights (q - z) * s of pack_gq's arguments (exact: every value is an f32 number)."""
    n, k = q.shape
    gs = gq_group_size(k, group_size)
    per_k = lambda a: np.repeat(np.asarray(a).astype(np.float32), gs, axis=1)  # noqa: E731
    return (q.astype(np.float32) - per_k(zeros)) * per_k(scales)


def gq_perm(g_idx: np.ndarray, group_size: int) -> np.ndarray:
    """The column order of a desc_act (act-order) GPTQ checkpoint: perm int32 [K] with g_idx[perm] sorted (stable),
    so that columns perm[gs j : gs (j + 1)] are group j. Pack q[:, perm] (and keep the scales and zeros as they
    are: group j's), then pass perm to linear_gq. ValueError unless every group holds exactly group_size columns."""
    g_idx = np.asarray(g_idx)
    if g_idx.ndim != 1 or g_idx.dtype.kind not in "iu":
        raise ValueError(f"gq_perm: g_idx must be a 1-d integer array, got {g_idx.dtype} {g_idx.shape}")
    k = g_idx.shape[0]
    gs = gq_group_size(k, group_size)
    perm = np.argsort(g_idx, kind="stable").astype(np.int32)
    if k and not np.array_equal(g_idx[perm], np.arange(k) // gs):
        raise ValueError(f"gq_perm: g_idx does not give each of the {k // gs} groups exactly {gs} columns")
    return perm


# ---- the op ---------------------------------------------------------------------------------------------------

_linear_gq = new_plans()


def linear_gq(out, x, weight, scales, zeros, bits: int, group_size: int, bias=None, perm=None) -> None:
    """out = x @ w.T + bias for group-quantized weights w[n, k] = (q[n, k] - z[n, g]) * s[n, g], g = k // group_size
    (GPTQ, AWQ), with x used as it is (not rounded to integers): the result is that of the exactly dequantized
    weights, summed in f32.

    x [M, K] f32 / f16 / bf16 (K a multiple of 32); out [M, N] of x's dtype; bias [N] or None. weight, scales, zeros:
    the blocks of ``pack_gq`` (``gq_shapes(N, K, bits, group_size)``: uint8 [NB, K / P, 64], f16 [NB, G, 16], uint8
    [NB, G, 16]). bits: 4 or 8. group_size: a multiple of 32 dividing K, or -1 (or K) for one group per row.
    perm: None, or int32 / int64 [K] (desc_act, ``gq_perm``): weight column k multiplies x[m, perm[k]]; a value
    outside [0, K) raises (on an accelerator at the next synchronizing call). Each output is summed in f32 in an
    order fixed by K and group_size, rounded once: a row of out depends on its row of x only (the same bits alone
    or in a batch). out must share no memory with the other arguments.
    """
    try:
        if bits.__class__ is not int or group_size.__class__ is not int:  # (32.0 would find 32's plan)
            raise TypeError
        kernel, fail, device, code, nbits, gs, pcode, m, n, k = _linear_gq[
            out._layout, x._layout, weight._layout, scales._layout, zeros._layout,
            None if bias is None else bias._layout, None if perm is None else perm._layout, bits, group_size]
    except (AttributeError, KeyError, TypeError):
        kernel, fail, device, code, nbits, gs, pcode, m, n, k = _plan_linear_gq(out, x, weight, scales, zeros, bits,
                                                                               group_size, bias, perm)
    o_ptr, o_end = out._ptr, out._end
    for name, t in (("x", x), ("weight", weight), ("scales", scales), ("zeros", zeros), ("bias", bias),
                    ("perm", perm)):
        if t is not None and t._ptr < o_end and o_ptr < t._end:
            check.overlap("linear_gq", "out", name)
    status = kernel(device.index, current_stream_handle(device), code, nbits, gs, pcode, m, n, k, o_ptr, x._ptr,
                    weight._ptr, scales._ptr, zeros._ptr, None if bias is None else bias._ptr,
                    None if perm is None else perm._ptr)
    if status:
        fail(status)


def _plan_linear_gq(out, x, weight, scales, zeros, bits, group_size, bias, perm):
    op = "linear_gq"
    device = check.tensors(op, out=out, x=x, weight=weight, scales=scales, zeros=zeros, bias=bias, perm=perm)
    if isinstance(bits, (bool, np.bool_)) or not isinstance(bits, (int, np.integer)) or int(bits) not in GQ_BITS:
        check.fail(op, f"bits must be 4 or 8, got {bits!r}")
    check.dtype(op, "x", x, check.FLOATS)
    check.same_dtype(op, "x", x, out=out, bias=bias)
    check.ndim(op, "x", x, 2)
    check.ndim(op, "out", out, 2)
    (m, k), n = x.shape, out.shape[1]
    if k % GQ_K_MULTIPLE:
        check.fail(op, f"K = {k} (x.shape[1]) must be a multiple of {GQ_K_MULTIPLE}")
    if isinstance(group_size, (bool, np.bool_)) or not isinstance(group_size, (int, np.integer)):
        check.fail(op, f"group_size must be an int, got {group_size!r}")
    try:
        gs = gq_group_size(k, int(group_size))
    except ValueError as e:
        check.fail(op, str(e))
    check.dtype(op, "weight", weight, (uint8,))
    check.dtype(op, "scales", scales, (float16,))
    check.dtype(op, "zeros", zeros, (uint8,))
    weight_shape, scales_shape, zeros_shape = gq_shapes(n, k, int(bits), gs if k else -1)
    what = f"of an [N, K] = [{n}, {k}] matrix, {int(bits)}-bit, group size {gs} (N from out, K from x; " \
           f"llaisys.ops.pack_gq makes them)"
    if weight.shape != weight_shape:
        check.fail(op, f"weight has shape {weight.shape}; expected {weight_shape}: the uint8 blocks {what}")
    if scales.shape != scales_shape:
        check.fail(op, f"scales has shape {scales.shape}; expected {scales_shape}: the f16 group scales {what}")
    if zeros.shape != zeros_shape:
        check.fail(op, f"zeros has shape {zeros.shape}; expected {zeros_shape}: the uint8 zero points {what}")
    if bias is not None:
        check.shape(op, "bias", bias, (n,))
    check.shape(op, "out", out, (m, n))
    pcode = 0
    if perm is not None:
        check.dtype(op, "perm", perm, (int32, int64))
        if perm.shape != (k,):
            check.fail(op, f"perm has shape {perm.shape}; expected ({k},): one x column per weight column (K from x)")
        pcode = perm.dtype.code
    check.contiguous(op, out=out, x=x, weight=weight, scales=scales, zeros=zeros, bias=bias, perm=perm)
    check.writable(op, "out", out)
    key = (out._layout, x._layout, weight._layout, scales._layout, zeros._layout,
           None if bias is None else bias._layout, None if perm is None else perm._layout, bits, group_size)
    return remember(_linear_gq, key, (*kernel_for(op, device, out.numel() > 0), device, out.dtype.code, int(bits),
                                      gs, int(pcode), m, n, k))
