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

from llaisys.ops.quant import Q6_K_FIELDS, Q6_K_LOW_FIRST, Q6_K_LOW_SECOND, blocks_from_words

FORMATS = {Q.Q8_0: "q8_0", Q.Q4_0: "q4_0", Q.Q4_1: "q4_1", Q.Q4_K: "q4_k", Q.Q6_K: "q6_k"}
F16 = np.dtype("<f2")
ALL = slice(None)  # the words of every chunk of a unit, in order


def _fields(raw: np.ndarray, qtype: Q, dtype: np.dtype, at: int, shape: tuple[int, ...] = (),
            strides: tuple[int, ...] = ()) -> np.ndarray:
    """A view [rows, blocks per row, *shape] of the ``dtype`` values at byte ``at`` of every block of ``raw``
    (uint8 [rows, bytes per row], C-contiguous)."""
    _, type_size = GGML_QUANT_SIZES[qtype]
    rows, row_bytes = raw.shape
    return np.ndarray((rows, row_bytes // type_size, *shape), dtype, buffer=raw, offset=at,
                      strides=(row_bytes, type_size, *strides))


def _words(raw: np.ndarray, qtype: Q, at: int, shape: tuple[int, ...], strides: tuple[int, ...]) -> np.ndarray:
    """The 4-byte words at byte ``at`` of every block as f16 pairs [rows, blocks per row, *shape, 2] (the unit
    blocks_from_words moves: every block format's words sit at even offsets, not all at multiples of 4)."""
    return _fields(raw, qtype, F16, at, (*shape, 2), (*strides, 2))


def _word_fields(raw: np.ndarray, qtype: Q, at: int) -> np.ndarray:
    """The 32-bit word at byte ``at`` of every block, as uint32 [rows, blocks per row] (4-byte aligned ones)."""
    return _fields(raw, qtype, np.dtype("<u4"), at)


def k_scales(raw: np.ndarray, qtype: Q) -> tuple[np.ndarray, np.ndarray]:
    """Q4_K's 6-bit scales and mins (bytes 4-16 of each block: quants.k_scales) as uint8 [rows, blocks, 8] each,
    computed on the three 32-bit words of every block (4 bytes at a time: a byte-wise numpy pass over the
    strided 12-byte fields took ~10 s on a 1.5B model)."""
    lo, mid, hi = (_word_fields(raw, qtype, at) for at in (4, 8, 12))
    six, two, four = np.uint32(0x3F3F3F3F), np.uint32(0x03030303), np.uint32(0x0F0F0F0F)
    rows, blocks = lo.shape
    sc, mn = np.empty((rows, blocks, 2), np.uint32), np.empty((rows, blocks, 2), np.uint32)
    np.bitwise_and(lo, six, out=sc[..., 0])
    sc[..., 1] = (hi & four) | (((lo >> np.uint32(6)) & two) << np.uint32(4))
    np.bitwise_and(mid, six, out=mn[..., 0])
    mn[..., 1] = ((hi >> np.uint32(4)) & four) | (((mid >> np.uint32(6)) & two) << np.uint32(4))
    return sc.view(np.uint8), mn.view(np.uint8)  # little-endian words: bytes in order


def words_and_fields(raw: np.ndarray, qtype: Q) -> tuple[list[tuple[np.ndarray, slice]], dict[str, np.ndarray]]:
    """``blocks_from_words``' arguments for the stored bytes ``raw`` (uint8 [rows, bytes per row]) of a
    ``qtype`` tensor: its words (views) and its scale fields (views, or small arrays for Q4_K's 6-bit ones)."""
    raw = np.ascontiguousarray(raw)
    if qtype == Q.Q8_0:  # 34 bytes: f16 d, 32 x int8
        return [(_words(raw, qtype, 2, (8,), (4,)), ALL)], {"d": _fields(raw, qtype, F16, 0)}
    if qtype == Q.Q4_0:  # 18 bytes: f16 d, 16 bytes of nibbles (k, k + 16)
        return [(_words(raw, qtype, 2, (4,), (4,)), ALL)], {"d": _fields(raw, qtype, F16, 0)}
    if qtype == Q.Q4_1:  # 20 bytes: f16 d, f16 m, 16 bytes of nibbles
        return ([(_words(raw, qtype, 4, (4,), (4,)), ALL)],
                {"d": _fields(raw, qtype, F16, 0), "m": _fields(raw, qtype, F16, 2)})
    if qtype == Q.Q4_K:  # 144 bytes: f16 d, f16 dmin, 12 bytes of 6-bit scales / mins, 4 x 32 bytes of nibbles
        sc, mn = k_scales(raw, qtype)
        return ([(_words(raw, qtype, 16, (4, 8), (32, 4)), ALL)],
                {"d": _fields(raw, qtype, F16, 0), "dmin": _fields(raw, qtype, F16, 2), "sc": sc, "mn": mn})
    if qtype == Q.Q6_K:  # 210 bytes: 2 x 64 bytes of low nibbles, 2 x 32 of 2-bit fields, 16 int8 scales, f16 d
        low = _words(raw, qtype, 0, (2, 16), (64, 4))
        high = _words(raw, qtype, 128, (2, 8), (32, 4))
        parts = [(low[..., :8, :], Q6_K_LOW_FIRST), (low[..., 8:, :], Q6_K_LOW_SECOND), (high, Q6_K_FIELDS)]
        return parts, {"d": _fields(raw, qtype, F16, 208),
                       "sc": _fields(raw, qtype, np.dtype(np.int8), 192, (16,), (1,))}
    raise ValueError(f"{qtype.name} has no llaisys block format")


def convert_rows(raw: np.ndarray, qtype: Q, out_weight: np.ndarray, out_scales: np.ndarray) -> None:
    """The blocks of the rows ``raw`` (uint8 [rows, bytes per row], stored ``qtype``) into ``out_weight`` /
    ``out_scales`` (uint8, ``llaisys.ops.quant_shapes`` of those rows: a whole number of blocks of 16 rows, or
    the matrix's last ones)."""
    parts, fields = words_and_fields(raw, qtype)
    blocks_from_words(FORMATS[qtype], parts, fields, out_weight, out_scales)
