"""The block formats of ``linear_q`` and ``embedding_q``, and the numpy helpers that build and read them.

Each format holds exactly the values of the ggml type of the same name (GGUF files store them), in blocks of
``QUANT_BLOCK_ROWS`` = 16 weight rows laid out for the kernels (backend.h, ``linear_q``): a block is one
sequential stream, and every 64 bytes hold 4 bytes of each of the 16 rows, so that a vector load takes rows as
lanes. Per row the formats store, per group of 32 k (``QUANT_GROUP``; the K formats per 256 k):

    format  integers (codes)               w[n, k]                     bits / weight   arguments of pack_quant
    q8_0    int8 q                         d q                         8.5             q int8, d f16 [N, G]
    q4_0    4-bit u in [0, 15]             d (u - 8)                   4.5             u, d f16 [N, G]
    q4_1    4-bit u                        d u + m                     5.0             u, d, m f16 [N, G]
    q4_k    4-bit u                        (D sc) u - (Dm mn)          4.625           u, D, Dm f16 [N, K/256],
                                                                                       sc, mn uint8 [N, G]
    q6_k    6-bit q in [0, 63]             (D sc) (q - 32)             6.5625          q, D f16 [N, K/256],
                                                                                       sc int8 [N, K/16]

(G = ceil(K / 32); the K formats need K % 256 == 0, as ggml's do.) Bytes per block: the 4-bit codes two to a
byte, paired as ggml pairs them (q4_0 / q4_1: k and k + 16 of a group; q4_k: k and k + 32 of 64; q6_k: k and
k + 64 of 128, plus 2-bit high fields, four to a byte: k + 32 j at bits 2j), so that a GGUF tensor becomes
blocks by moving 4-byte words (``blocks_from_words``), never splitting a nibble. q6_k's chunks of a unit are in
the order its kernel first reads them (``CHUNK_ORDER``), so that each unit streams from memory front to back.
q4_k keeps ggml's two levels of scales (the 6-bit sc and mn in a byte each: 4.625 bits per weight, not Q4_K's
4.5) because D * sc is exact in f32 but not in f16: one f16 scale per group would round it.
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np

from .int8 import block_outputs

QUANT_BLOCK_ROWS = 16  # weight rows per block
QUANT_GROUP = 32  # k per group (and per on-the-fly quantization group of x)
QUANT_SUPER = 256  # k per super-block of the K formats
F16 = np.dtype("<f2")


@dataclasses.dataclass(frozen=True)
class QuantFormat:
    """One format: its name (the ggml type it holds), code (backend.h llaisys_qformat_t) and geometry."""

    name: str
    code: int
    unit: int  # k per unit of the weight bytes (a group, or the pairing span of the nibbles)
    unit_bytes: int  # bytes of one unit of one block (16 rows)
    record: int  # k per scale record
    record_bytes: int  # bytes of one record of one block
    bits: float  # bits per weight (codes and scales)

    def shapes(self, n: int, k: int) -> tuple[tuple[int, int, int], tuple[int, int, int]]:
        """(weight shape, scales shape), both uint8, of the blocks of an [n, k] matrix."""
        if self.record == QUANT_SUPER and k % QUANT_SUPER:
            raise ValueError(f"{self.name}: K = {k} is not a multiple of {QUANT_SUPER} (its super-blocks)")
        blocks, padded = -(-n // QUANT_BLOCK_ROWS), -(-k // QUANT_GROUP) * QUANT_GROUP
        return ((blocks, padded // self.unit, self.unit_bytes), (blocks, padded // self.record, self.record_bytes))


FORMATS = {f.name: f for f in (
    QuantFormat("q8_0", 0, 32, 512, 32, 32, 8.5),
    QuantFormat("q4_0", 1, 32, 256, 32, 32, 4.5),
    QuantFormat("q4_1", 2, 32, 256, 32, 64, 5.0),
    QuantFormat("q4_k", 3, 64, 512, 256, 320, 4.625),
    QuantFormat("q6_k", 4, 128, 1536, 256, 288, 6.5625),
)}
QUANT_FORMATS = tuple(FORMATS)


def quant_format(fmt) -> QuantFormat:
    """The format named ``fmt`` (one of QUANT_FORMATS); anything else raises ValueError naming them."""
    try:
        return FORMATS[fmt]
    except (KeyError, TypeError):
        raise ValueError(f"unknown weight format {fmt!r}; the block formats are {', '.join(QUANT_FORMATS)}") from None


def quant_shapes(fmt: str, n: int, k: int) -> tuple[tuple[int, int, int], tuple[int, int, int]]:
    """(weight shape, scales shape), uint8, of the ``fmt`` blocks of an [n, k] matrix."""
    return quant_format(fmt).shapes(n, k)


# -- rows <-> blocks -------------------------------------------------------------------------------------------


def copy_strided(dst: np.ndarray, src: np.ndarray) -> None:
    """dst[...] = src (the same shape and item size; either side strided): by the CPU backend's rearrange (C, on
    its thread team) where one is loaded, else numpy, whose element-by-element strided copies moved the blocks'
    2- and 4-byte words at ~100-200 MB/s (the C copy does ~10x that)."""
    from ..dlpack import from_dlpack  # (ops import early; dlpack and the device list are needed only here)
    from ..errors import LlaisysError
    from .elementwise import rearrange

    if dst.size >= 1 << 12 and dst.dtype in _BYTE_COPY_DTYPES and src.dtype == dst.dtype:
        try:
            rearrange(from_dlpack(dst), from_dlpack(src))
            return
        except (LlaisysError, BufferError, TypeError):  # no CPU backend, or an array DLPack cannot carry
            pass
    np.copyto(dst, src)


_BYTE_COPY_DTYPES = (np.dtype(np.uint8), np.dtype(np.int8), F16)  # what the blocks are moved as (llaisys dtypes)


def blocked(rows: np.ndarray, out: np.ndarray, tail: int = 0) -> np.ndarray:
    """out [NB, *rest, 16, *last] = rows [N, *rest, *last] in blocks of 16 rows, rows past N zero (rest: any
    dimensions; last: the ``tail`` trailing ones, e.g. the 2 halves of a 4-byte word moved as f16 pairs)."""
    n = rows.shape[0]
    full = n // QUANT_BLOCK_ROWS
    row_axis = out.ndim - 1 - tail
    body = rows[:full * QUANT_BLOCK_ROWS].reshape(full, QUANT_BLOCK_ROWS, *rows.shape[1:])
    copy_strided(out[:full], np.moveaxis(body, 1, row_axis))
    if full < out.shape[0]:
        last = np.zeros((QUANT_BLOCK_ROWS, *rows.shape[1:]), rows.dtype)
        last[:n - full * QUANT_BLOCK_ROWS] = rows[full * QUANT_BLOCK_ROWS:]
        np.copyto(out[full], np.moveaxis(last, 0, row_axis - 1))
    return out


def unblocked(blocks: np.ndarray, n: int) -> np.ndarray:
    """The inverse of ``blocked``: [NB, *rest, 16] -> [n, *rest]."""
    return np.ascontiguousarray(np.moveaxis(blocks, -1, 1).reshape(-1, *blocks.shape[1:-1])[:n])


def _record_fields(f: QuantFormat) -> list[tuple[str, np.dtype, tuple[int, ...]]]:
    """(name, dtype, per-row shape within one record) of each field of a scale record, in byte order."""
    u8, i8 = np.dtype(np.uint8), np.dtype(np.int8)
    fields: dict[str, list[tuple[str, np.dtype, tuple[int, ...]]]] = {
        "q8_0": [("d", F16, ())], "q4_0": [("d", F16, ())], "q4_1": [("d", F16, ()), ("m", F16, ())],
        "q4_k": [("d", F16, ()), ("dmin", F16, ()), ("sc", u8, (8,)), ("mn", u8, (8,))],
        "q6_k": [("d", F16, ()), ("sc", i8, (16,))],
    }
    return fields[f.name]


def record_views(fmt: str, scales: np.ndarray) -> dict[str, np.ndarray]:
    """The fields of the scale records ``scales`` (uint8 [NB, R, record bytes]) as blocked arrays
    [NB, R, *field shape, 16] of their dtypes (views: writing them writes the records)."""
    f = quant_format(fmt)
    nb, records = scales.shape[:2]
    views, offset = {}, 0
    for name, dtype, shape in _record_fields(f):
        size = math.prod(shape) * QUANT_BLOCK_ROWS * dtype.itemsize
        views[name] = scales[:, :, offset:offset + size].view(dtype).reshape(nb, records, *shape, QUANT_BLOCK_ROWS)
        offset += size
    assert offset == f.record_bytes
    return views


# Where each chunk of a row's unit bytes (in the order _row_bytes makes them) sits in a unit of the blocks: q6_k's
# 16 low-nibble chunks and 8 field chunks are interleaved as the groups of a unit first read them (backend.h):
# low 0, fields 0, low 1, fields 1, .., low 7, fields 7, then low 8 .. 15. The other formats keep their order.
CHUNK_ORDER = {"q6_k": np.array([*range(0, 16, 2), *range(16, 24), *range(1, 16, 2)])}
# q6_k's chunks as slices of a unit's: the first 8 low-nibble chunks, the last 8, the field chunks
Q6_K_LOW_FIRST, Q6_K_LOW_SECOND, Q6_K_FIELDS = slice(0, 16, 2), slice(16, 24), slice(1, 16, 2)


def _to_positions(fmt: str, row_bytes: np.ndarray) -> np.ndarray:
    """Row bytes [N, U, unit bytes / 16] in chunk order -> in the blocks' chunk order (CHUNK_ORDER)."""
    if fmt not in CHUNK_ORDER:
        return row_bytes
    n, units, size = row_bytes.shape
    out = np.empty((n, units, size // 4, 4), np.uint8)
    out[:, :, CHUNK_ORDER[fmt]] = row_bytes.reshape(n, units, size // 4, 4)
    return out.reshape(n, units, size)


def _from_positions(fmt: str, row_bytes: np.ndarray) -> np.ndarray:
    """The inverse of ``_to_positions``."""
    if fmt not in CHUNK_ORDER:
        return row_bytes
    n, units, size = row_bytes.shape
    return row_bytes.reshape(n, units, size // 4, 4)[:, :, CHUNK_ORDER[fmt]].reshape(n, units, size)


def weight_words(fmt: str, weight: np.ndarray) -> np.ndarray:
    """The weight blocks (uint8 [NB, U, unit bytes]) as uint32 words [NB, U, chunks, 16]: word [b, u, c, r] is
    the 4 bytes of row 16 b + r in chunk c of unit u (a view)."""
    nb, units, unit_bytes = weight.shape
    return weight.view(np.uint32).reshape(nb, units, unit_bytes // 64, QUANT_BLOCK_ROWS)


def blocks_from_words(fmt: str, parts: list[tuple[np.ndarray, slice]], fields: dict[str, np.ndarray],
                      out_weight: np.ndarray, out_scales: np.ndarray) -> None:
    """Fill the blocks of N rows from the rows' own bytes.

    ``parts``: (words, chunks) pairs: words [N, *unit dims, chunks, 2] f16 pairs (the halves of each 4-byte
    word: a GGUF file's words sit at 2-byte offsets, e.g. after Q4_0's f16 scale; the unit dims multiply to the
    units U), each row's words of the chunks of every unit that the slice ``chunks`` of a unit's picks.
    ``fields`` {name: [N, R, *shape]}: the per-row scale fields (``record_views`` names them). Reads only what
    it copies: the words and fields may be strided views of a file."""
    nb, units, unit_bytes = out_weight.shape
    target = out_weight.view(F16).reshape(nb, units, unit_bytes // 64, QUANT_BLOCK_ROWS, 2)
    for words, chunks in parts:
        dims = words.shape[1:-2]
        view = target.reshape(nb, *dims, target.shape[2], QUANT_BLOCK_ROWS, 2)
        blocked(words, view[..., chunks, :, :], tail=1)
    for name, view in record_views(fmt, out_scales).items():
        blocked(fields[name], view)


# -- codes <-> row bytes ---------------------------------------------------------------------------------------


def _pair_nibbles(codes: np.ndarray, span: int) -> np.ndarray:
    """uint8 codes [N, K] (K a multiple of 2 span) -> bytes [N, K / 2]: per 2 span k, byte j holds k = j (low
    nibble) and j + span (high)."""
    n, k = codes.shape
    c = codes.reshape(n, k // (2 * span), 2, span)
    return (c[:, :, 0] | (c[:, :, 1] << np.uint8(4))).reshape(n, k // 2)


def _split_nibbles(packed: np.ndarray, span: int) -> np.ndarray:
    """The inverse of ``_pair_nibbles``."""
    n, half = packed.shape
    p = packed.reshape(n, half // span, 1, span)
    return np.concatenate([p & np.uint8(0x0F), p >> np.uint8(4)], axis=2).reshape(n, 2 * half)


def _row_bytes(f: QuantFormat, codes: np.ndarray) -> np.ndarray:
    """Codes [N, Kp] (Kp padded to the units) -> each row's bytes [N, U, unit bytes / 16] in chunk order."""
    n, k = codes.shape
    units = k // f.unit
    if f.name == "q8_0":
        return codes.view(np.uint8).reshape(n, units, 32)
    if f.name in ("q4_0", "q4_1", "q4_k"):
        return _pair_nibbles(codes, f.unit // 2).reshape(n, units, f.unit // 2)
    # q6_k: per 128 k, 64 bytes of nibbles (k, k + 64) and 32 bytes of 2-bit fields (k + 32 j at bits 2 j)
    u = codes.reshape(n, units, 128)
    low = _pair_nibbles((u & np.uint8(0x0F)).reshape(n, -1), 64).reshape(n, units, 64)
    high = (u >> np.uint8(4)).reshape(n, units, 4, 32) << (np.arange(4, dtype=np.uint8) * 2)[:, None]
    return np.concatenate([low, np.bitwise_or.reduce(high, axis=2)], axis=2)


def _codes(f: QuantFormat, row_bytes: np.ndarray) -> np.ndarray:
    """The inverse of ``_row_bytes``: [N, U, unit bytes / 16] -> codes [N, U * unit]."""
    n, units = row_bytes.shape[:2]
    if f.name == "q8_0":
        return row_bytes.reshape(n, -1).view(np.int8)
    if f.name in ("q4_0", "q4_1", "q4_k"):
        return _split_nibbles(row_bytes.reshape(n, -1), f.unit // 2)
    low = _split_nibbles(np.ascontiguousarray(row_bytes[:, :, :64]).reshape(n, -1), 64).reshape(n, units, 128)
    fields = (row_bytes[:, :, 64:, None] >> (np.arange(4, dtype=np.uint8) * 2)) & np.uint8(3)  # [n, u, 32, 4]
    high = np.moveaxis(fields, 3, 2).reshape(n, units, 128)
    return (low | (high << np.uint8(4))).reshape(n, -1)


_CODES = {"q8_0": (np.int8, -128, 127), "q4_0": (np.uint8, 0, 15), "q4_1": (np.uint8, 0, 15),
          "q4_k": (np.uint8, 0, 15), "q6_k": (np.uint8, 0, 63)}  # dtype and range of each format's codes


def _param_shapes(f: QuantFormat, n: int, k: int) -> dict[str, tuple[tuple[int, ...], np.dtype]]:
    """{name: (shape, dtype)} of pack_quant's scale arguments, in order."""
    _, (_, records, _) = f.shapes(n, k)
    return {name: ((n, records * max(1, math.prod(shape))), dtype) for name, dtype, shape in _record_fields(f)}


def pack_quant(fmt: str, codes: np.ndarray, *params: np.ndarray, out_weight: np.ndarray | None = None,
               out_scales: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
    """The ``fmt`` blocks (weight, scales: uint8, ``quant_shapes``) of an [N, K] matrix given as its integer
    codes and scale parameters (the table in this module's docstring: e.g. q4_k takes u, D, Dm, sc, mn); zeros
    past N and K. Writes into ``out_weight`` / ``out_scales`` when given, else into new arrays; returns both."""
    f = quant_format(fmt)
    dtype, low, high = _CODES[f.name]
    codes = np.asarray(codes)
    if codes.ndim != 2 or codes.dtype != dtype:
        raise ValueError(f"pack_quant({fmt}): codes must be {np.dtype(dtype).name} [N, K], got {codes.dtype} "
                         f"{codes.shape}")
    n, k = codes.shape
    if codes.size and (codes.min() < low or codes.max() > high):
        raise ValueError(f"pack_quant({fmt}): codes must lie in [{low}, {high}]")
    weight_shape, scales_shape = f.shapes(n, k)
    expected = _param_shapes(f, n, k)
    if len(params) != len(expected):
        raise ValueError(f"pack_quant({fmt}) takes the codes and {', '.join(expected)}, got {len(params)} arrays")
    fields = {}
    for (name, (shape, pdtype)), value, (_, _, field_shape) in zip(expected.items(), params, _record_fields(f)):
        value = np.asarray(value)
        if value.shape != shape or value.dtype != pdtype:
            raise ValueError(f"pack_quant({fmt}): {name} must be {pdtype.name} {shape}, got {value.dtype} {value.shape}")
        fields[name] = value.reshape(n, scales_shape[1], *field_shape)
    out_weight, out_scales = block_outputs(f"pack_quant({fmt})", out_weight, out_scales, (weight_shape, scales_shape),
                                           (np.uint8, np.uint8))
    padded = np.zeros((n, weight_shape[1] * f.unit), codes.dtype)
    padded[:, :k] = codes
    row_bytes = np.ascontiguousarray(_to_positions(f.name, _row_bytes(f, padded)))  # [N, U, unit bytes / 16]
    words = row_bytes.view(F16).reshape(n, weight_shape[1], -1, 2)  # [N, U, chunks, 2]
    blocks_from_words(fmt, [(words, slice(None))], fields, out_weight, out_scales)
    return out_weight, out_scales


def unpack_quant(fmt: str, weight: np.ndarray, scales: np.ndarray, n: int, k: int) -> tuple[np.ndarray, ...]:
    """The inverse of ``pack_quant``: (codes [n, k], *params) of the ``fmt`` blocks of an [n, k] matrix."""
    f = quant_format(fmt)
    weight_shape, scales_shape = f.shapes(n, k)
    if weight.shape != weight_shape or scales.shape != scales_shape:
        raise ValueError(f"unpack_quant({fmt}): the blocks of an [{n}, {k}] matrix are {weight_shape} and "
                         f"{scales_shape}, got {weight.shape} and {scales.shape}")
    words = unblocked(weight_words(fmt, np.ascontiguousarray(weight)), n)  # [n, U, chunks] uint32
    row_bytes = _from_positions(f.name, words.view(np.uint8).reshape(n, weight_shape[1], -1))
    codes = _codes(f, row_bytes)[:, :k].astype(_CODES[f.name][0])
    params = [unblocked(view, n).reshape(n, -1) for view in record_views(fmt, np.ascontiguousarray(scales)).values()]
    return (np.ascontiguousarray(codes), *params)


def dequantize_quant(fmt: str, codes: np.ndarray, *params: np.ndarray) -> np.ndarray:
    """float32 [N, K] weights of ``pack_quant``'s arguments, computed as ggml's dequantize_row_* does (every
    product exact in float32; the q4_1 / q4_k sums rounded once)."""
    f = quant_format(fmt)
    n, k = codes.shape
    per_group = lambda p, size: np.repeat(p.astype(np.float32), size, axis=1)[:, :k]  # noqa: E731
    if f.name == "q8_0":
        return per_group(params[0], 32) * codes.astype(np.float32)
    if f.name == "q4_0":
        return per_group(params[0], 32) * (codes.astype(np.float32) - 8)
    if f.name == "q4_1":
        return per_group(params[0], 32) * codes.astype(np.float32) + per_group(params[1], 32)
    if f.name == "q4_k":
        d, dmin, sc, mn = params
        scale = per_group(d, 256) * per_group(sc, 32)
        return scale * codes.astype(np.float32) - per_group(dmin, 256) * per_group(mn, 32)
    d, sc = params
    return (per_group(d, 256) * per_group(sc, 16)) * (codes.astype(np.float32) - 32)


# GPTQ / AWQ group-quantized weights (linear_gq) have their own layout: llaisys.ops.gq; its helpers are here too.
from .gq import GQ_BITS, dequantize_gq, gq_group_size, gq_perm, gq_shapes, pack_gq, unpack_gq  # noqa: E402,F401
