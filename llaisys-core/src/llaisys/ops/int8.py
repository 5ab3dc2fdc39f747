"""The int8 weight layout of ``linear_i8``, and the numpy helpers that build it.

A weight matrix q [N, K] (int8, values in [-127, 127]) with one bf16 scale per row and group of
``INT8_GROUP`` consecutive k (scales [N, G], G = ceil(K / 32)) is stored in blocks of ``INT8_BLOCK_ROWS``
rows, so that a kernel reads each block as one sequential stream and finds, in every 64 bytes, the same 4
consecutive k of 16 rows (one vector whose lanes are rows: no transposes, whatever the vector width):

    weight [NB, G, 8, 16, 4] int8:   weight[b, g, s, r, i] = q[16 b + r, 32 g + 4 s + i]
    scales [NB, G, 16] bfloat16:     scales[b, g, r] = the scale of row 16 b + r in group g

with NB = ceil(N / 16); rows past N and k past K are zeros (scale 0), so every block and group is whole.
The weight is then w[n, k] = scale(n, k // 32) * q[n, k] (backend.h, ``linear_i8``).
"""

from __future__ import annotations

import numpy as np

from ..dtype import bfloat16

INT8_GROUP = 32  # consecutive k per scale (and per on-the-fly quantization group of x)
INT8_BLOCK_ROWS = 16  # weight rows per block
_STEP = 4  # consecutive k of a row next to each other (one 32-bit lane)


def int8_shapes(n: int, k: int) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """(weight shape, scales shape) of the blocks of an [n, k] matrix."""
    blocks, groups = -(-n // INT8_BLOCK_ROWS), -(-k // INT8_GROUP)
    return ((blocks, groups, INT8_GROUP // _STEP, INT8_BLOCK_ROWS, _STEP), (blocks, groups, INT8_BLOCK_ROWS))


def block_outputs(op: str, out_weight: np.ndarray | None, out_scales: np.ndarray | None,
                  shapes: tuple[tuple[int, ...], tuple[int, ...]], dtypes: tuple) -> tuple[np.ndarray, np.ndarray]:
    """The (weight, scales) arrays a ``pack_*`` call writes: ``out_weight`` / ``out_scales`` when given (checked
    against ``shapes``), else new arrays of ``shapes`` and ``dtypes``."""
    weight_shape, scales_shape = shapes
    if out_weight is None:
        out_weight = np.empty(weight_shape, dtypes[0])
    if out_scales is None:
        out_scales = np.empty(scales_shape, dtypes[1])
    if out_weight.shape != weight_shape or out_scales.shape != scales_shape:
        raise ValueError(f"{op}: outputs must be {weight_shape} and {scales_shape}, got {out_weight.shape} "
                         f"and {out_scales.shape}")
    return out_weight, out_scales


def pack_int8(q: np.ndarray, scales: np.ndarray, out_weight: np.ndarray | None = None,
              out_scales: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
    """The blocks of q (int8 [N, K]) and scales (bf16 [N, G], a scale per row and group).

    Writes into ``out_weight`` / ``out_scales`` when given (C-contiguous arrays of ``int8_shapes(N, K)``, e.g.
    a slice of blocks of a larger weight), else into new arrays; returns both."""
    q, scales = np.asarray(q), np.asarray(scales)
    if q.ndim != 2 or q.dtype != np.int8:
        raise ValueError(f"pack_int8: q must be int8 [N, K], got {q.dtype} {q.shape}")
    n, k = q.shape
    weight_shape, scales_shape = int8_shapes(n, k)
    blocks, groups = weight_shape[0], weight_shape[1]
    if scales.shape != (n, groups) or scales.dtype != bfloat16.numpy:
        raise ValueError(f"pack_int8: scales must be bf16 [N, G] = {(n, groups)}, got {scales.dtype} {scales.shape}")
    out_weight, out_scales = block_outputs("pack_int8", out_weight, out_scales, (weight_shape, scales_shape),
                                           (np.int8, bfloat16.numpy))
    rows, cols = blocks * INT8_BLOCK_ROWS, groups * INT8_GROUP
    if (rows, cols) == (n, k):
        padded = np.ascontiguousarray(q)
    else:
        padded = np.zeros((rows, cols), np.int8)
        padded[:n, :k] = q
    # [b, r, (g, s)] -> [b, (g, s), r] in units of 4 bytes (one int32: 6x faster than moving single bytes)
    steps = cols // _STEP
    np.copyto(out_weight.view(np.int32).reshape(blocks, steps, INT8_BLOCK_ROWS),
              padded.view(np.int32).reshape(blocks, INT8_BLOCK_ROWS, steps).transpose(0, 2, 1))
    padded_scales = np.zeros((rows, groups), scales.dtype)
    padded_scales[:n] = scales
    np.copyto(out_scales, padded_scales.reshape(blocks, INT8_BLOCK_ROWS, groups).transpose(0, 2, 1))
    return out_weight, out_scales


def unpack_int8(weight: np.ndarray, scales: np.ndarray, n: int, k: int) -> tuple[np.ndarray, np.ndarray]:
    """The inverse of ``pack_int8``: (q int8 [n, k], scales [n, G]) of the blocks."""
    weight_shape, scales_shape = int8_shapes(n, k)
    if weight.shape != weight_shape or scales.shape != scales_shape:
        raise ValueError(f"unpack_int8: blocks of an [{n}, {k}] matrix are {weight_shape} and {scales_shape}, got "
                         f"{weight.shape} and {scales.shape}")
    blocks, groups = weight_shape[0], weight_shape[1]
    q = weight.transpose(0, 3, 1, 2, 4).reshape(blocks * INT8_BLOCK_ROWS, groups * INT8_GROUP)[:n, :k]
    per_row = scales.transpose(0, 2, 1).reshape(blocks * INT8_BLOCK_ROWS, groups)[:n]
    return np.ascontiguousarray(q), np.ascontiguousarray(per_row)
