"""GGUF tensors kept quantized: ggml blocks -> llaisys' block formats (``llaisys.ops.quant``), by moving words.

Each of Q8_0, Q4_0, Q4_1, Q4_K and Q6_K has a llaisys format holding exactly its values (the format of the
same name): the integers stay the stored ones, the f16 scales the stored f16 values, Q4_K's 6-bit scales and
mins become a byte each. A ggml row is a run of blocks (block = its f16 scale(s), then its packed integers);
llaisys puts 16 rows side by side, 4 bytes of each per 64 (the kernels' vectors), with the integers paired in
the same nibbles as ggml pairs them. So a tensor becomes blocks by copying 4-byte words of the stored bytes
to their new places (strided numpy views of the mapped file, one copy each), and its scale fields likewise:
nothing is decoded, no float is formed.

Types without a llaisys format (Q5_0, Q5_1, Q5_K, Q2_K, Q3_K) are not handled here (gguf/weights.py says
what becomes of them).
"""

from __future__ import annotations

import numpy as np
from gguf import GGML_QUANT_SIZES
from gguf import GGMLQuantizationType as Q

import llaisys
from llaisys.ops.quant import blocks_from_words

from .quants import k_scales

FORMATS = {Q.Q8_0: "q8_0", Q.Q4_0: "q4_0", Q.Q4_1: "q4_1", Q.Q4_K: "q4_k", Q.Q6_K: "q6_k"}
U32, F16 = np.dtype("<u4"), np.dtype("<f2")


def _fields(raw: np.ndarray, qtype: Q, dtype: np.dtype, at: int, shape: tuple[int, ...] = (),
            strides: tuple[int, ...] = ()) -> np.ndarray:
    """A view [rows, blocks per row, *shape] of the ``dtype`` values at byte ``at`` of every block of ``raw``
    (uint8 [rows, bytes per row], C-contiguous); possibly unaligned (numpy copies those element by element)."""
    _, type_size = GGML_QUANT_SIZES[qtype]
    rows, row_bytes = raw.shape
    return np.ndarray((rows, row_bytes // type_size, *shape), dtype, buffer=raw, offset=at,
                      strides=(row_bytes, type_size, *strides))


def words_and_fields(raw: np.ndarray, qtype: Q) -> tuple[list[tuple[np.ndarray, int]], dict[str, np.ndarray]]:
    """``blocks_from_words``' arguments for the stored bytes ``raw`` (uint8 [rows, bytes per row]) of a
    ``qtype`` tensor: its words (views) and its scale fields (views, or small arrays for Q4_K's 6-bit ones)."""
    raw = np.ascontiguousarray(raw)
    if qtype == Q.Q8_0:  # 34 bytes: f16 d, 32 x int8
        return [(_fields(raw, qtype, U32, 2, (8,), (4,)), 0)], {"d": _fields(raw, qtype, F16, 0)}
    if qtype == Q.Q4_0:  # 18 bytes: f16 d, 16 bytes of nibbles (k, k + 16)
        return [(_fields(raw, qtype, U32, 2, (4,), (4,)), 0)], {"d": _fields(raw, qtype, F16, 0)}
    if qtype == Q.Q4_1:  # 20 bytes: f16 d, f16 m, 16 bytes of nibbles
        return ([(_fields(raw, qtype, U32, 4, (4,), (4,)), 0)],
                {"d": _fields(raw, qtype, F16, 0), "m": _fields(raw, qtype, F16, 2)})
    if qtype == Q.Q4_K:  # 144 bytes: f16 d, f16 dmin, 12 bytes of 6-bit scales / mins, 4 x 32 bytes of nibbles
        sc, mn = k_scales(_fields(raw, qtype, np.dtype(np.uint8), 4, (12,), (1,)))
        return ([(_fields(raw, qtype, U32, 16, (4, 8), (32, 4)), 0)],
                {"d": _fields(raw, qtype, F16, 0), "dmin": _fields(raw, qtype, F16, 2), "sc": sc, "mn": mn})
    if qtype == Q.Q6_K:  # 210 bytes: 2 x 64 bytes of low nibbles, 2 x 32 of 2-bit fields, 16 int8 scales, f16 d
        low = _fields(raw, qtype, U32, 0, (2, 16), (64, 4))
        high = _fields(raw, qtype, U32, 128, (2, 8), (32, 4))
        return [(low, 0), (high, 16)], {"d": _fields(raw, qtype, F16, 208),
                                        "sc": _fields(raw, qtype, np.dtype(np.int8), 192, (16,), (1,))}
    raise ValueError(f"{qtype.name} has no llaisys block format")


def convert_rows(raw: np.ndarray, qtype: Q, out_weight: np.ndarray, out_scales: np.ndarray) -> None:
    """The blocks of the rows ``raw`` (uint8 [rows, bytes per row], stored ``qtype``) into ``out_weight`` /
    ``out_scales`` (uint8, ``llaisys.ops.quant_shapes`` of those rows: a whole number of blocks of 16 rows, or
    the matrix's last ones)."""
    parts, fields = words_and_fields(raw, qtype)
    blocks_from_words(FORMATS[qtype], parts, fields, out_weight, out_scales)


def block_shapes(qtype: Q, shape: tuple[int, int]):
    """(weight shape, scales shape) of the llaisys blocks of a ``qtype`` [N, K] matrix."""
    return llaisys.ops.quant_shapes(FORMATS[qtype], *shape)
