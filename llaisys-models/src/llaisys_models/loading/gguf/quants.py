"""ggml's block formats decoded with numpy, whole chunks of rows at a time (no Python loop per block).

Every ggml type stores a row as consecutive blocks. A block of the legacy types holds 32 values:
an f16 scale ``d`` (and for the ``_1`` types an f16 offset ``m``) and 4, 5 or 8-bit integers
``q``: ``x = d * q`` (or ``d * q + m``). The k-quants hold 256 values in a super-block: an f16
``d`` (and ``dmin``) and per 16- or 32-value sub-block 4-8-bit scales (and mins):
``x = (d * scale) * q - (dmin * min)``.

Each decoder computes in float32 with exactly the operations, in the order, of ggml's reference
(``dequantize_row_*`` in ggml-quants.c, which the ``gguf`` package's ``quants`` module mirrors;
the tests require bit-equality with it), then the result is rounded once to the output dtype.

The symmetric 8-bit-or-narrower types (Q8_0, Q4_0, Q5_0) are exactly ``int8 * scale`` per
32 values: their decoded float32 values ``d * q`` are exact, so ``quantize="int8"`` requantizing them
per the same groups of 32 only re-expresses each f16 ``d`` as a bfloat16 scale.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
from gguf import GGML_QUANT_SIZES
from gguf import GGMLQuantizationType as Q

import llaisys

CHUNK_VALUES = 1 << 17  # values decoded per numpy pass: temporaries stay in L2 and memory stays bounded

F16 = np.dtype("<f2")
NIBBLE_SHIFTS = np.array([0, 4], dtype=np.uint8)


def _half(blocks: np.ndarray, start: int) -> np.ndarray:
    """The f16 at byte ``start`` of every block, as float32 [n, 1]."""
    return blocks[:, start:start + 2].view(F16).astype(np.float32)


def _nibbles(packed: np.ndarray) -> np.ndarray:
    """uint8 [..., k] -> [..., 2, k]: the low nibbles, then the high ones (ggml's order within a block)."""
    return (packed[..., None, :] >> NIBBLE_SHIFTS[:, None]) & np.uint8(0x0F)


def _bits(packed: np.ndarray, count: int) -> np.ndarray:
    """Little-endian bit i of a bit field, for i < count: uint8 [..., bytes] -> [..., count] of 0/1."""
    return np.unpackbits(packed, axis=-1, count=count, bitorder="little")


# -- the legacy 32-value blocks ----------------------------------------------------------
# A decoder fills ``out`` (float32 [n, values per block], preallocated: fresh float32 temporaries
# cost more in page faults than the arithmetic) from ``blocks`` (uint8 [n, bytes per block]).
# Integer operands are cast to float32 inside the ufunc (exactly), in numpy's small buffers.


def _q8_0_ints(blocks: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Q8_0 (34 bytes: f16 d, 32 x int8): (q int8 [n, 32], d float32 [n, 1])."""
    return blocks[:, 2:].view(np.int8), _half(blocks, 0)


def _q4_0_ints(blocks: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Q4_0 (18 bytes: f16 d, 16 bytes of nibbles): q = nibble - 8."""
    q = _nibbles(blocks[:, 2:]).reshape(-1, 32).view(np.int8) - np.int8(8)
    return q, _half(blocks, 0)


def _q5_0_ints(blocks: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Q5_0 (22 bytes: f16 d, u32 of fifth bits, 16 bytes of nibbles): q = (nibble | bit << 4) - 16."""
    q = _nibbles(blocks[:, 6:]).reshape(-1, 32) | (_bits(blocks[:, 2:6], 32) << np.uint8(4))
    return q.view(np.int8) - np.int8(16), _half(blocks, 0)


def _symmetric(ints: Callable) -> Callable:
    """x = d * q"""
    def decode(blocks: np.ndarray, out: np.ndarray) -> None:
        q, d = ints(blocks)
        np.multiply(d, q, out=out)
    return decode


def _q4_1(blocks: np.ndarray, out: np.ndarray) -> None:
    """Q4_1 (20 bytes: f16 d, f16 m, nibbles): x = d * q + m."""
    q = _nibbles(blocks[:, 4:]).reshape(-1, 32)
    np.add(np.multiply(_half(blocks, 0), q, out=out), _half(blocks, 2), out=out)


def _q5_1(blocks: np.ndarray, out: np.ndarray) -> None:
    """Q5_1 (24 bytes: f16 d, f16 m, u32 of fifth bits, nibbles): x = d * q + m."""
    q = _nibbles(blocks[:, 8:]).reshape(-1, 32) | (_bits(blocks[:, 4:8], 32) << np.uint8(4))
    np.add(np.multiply(_half(blocks, 0), q, out=out), _half(blocks, 2), out=out)


# -- the k-quants: 256-value super-blocks ------------------------------------------------------


def _k_scales(packed: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Q4_K/Q5_K's 12 bytes of 6-bit (scale, min) pairs for 8 sub-blocks -> float32 [n, 8] each.

    Bytes 0-3 hold scales 0-3 (low 6 bits) and the top 2 bits of scales 4-7; bytes 4-7 the
    same for mins; bytes 8-11 the low nibbles of scales 4-7 (low) and mins 4-7 (high).
    """
    lo, mid, hi = packed[:, 0:4], packed[:, 4:8], packed[:, 8:12]
    scales = np.concatenate([lo & 0x3F, (hi & 0x0F) | ((lo >> 6) << 4)], axis=1)
    mins = np.concatenate([mid & 0x3F, (hi >> 4) | ((mid >> 6) << 4)], axis=1)
    return scales.astype(np.float32), mins.astype(np.float32)


def _scaled_minus_min(d: np.ndarray, q: np.ndarray, m: np.ndarray, out: np.ndarray) -> None:
    """out = d * q - m per sub-block: d, m float32 [n, subs, 1]; q [n, subs, k]; out [n, subs * k]."""
    sub = out.reshape(q.shape)
    np.subtract(np.multiply(d, q, out=sub), m, out=sub)


def _q4_k(blocks: np.ndarray, out: np.ndarray) -> None:
    """Q4_K (144 bytes: f16 d, f16 dmin, 12 bytes of scales, 128 bytes of nibbles).

    Each 32-byte group of nibbles holds two sub-blocks: the low nibbles, then the high ones.
    """
    n = len(blocks)
    scales, mins = _k_scales(blocks[:, 4:16])
    d = (_half(blocks, 0) * scales)[:, :, None]  # [n, 8, 1]
    m = (_half(blocks, 2) * mins)[:, :, None]
    q = _nibbles(blocks[:, 16:].reshape(n, 4, 32)).reshape(n, 8, 32)
    _scaled_minus_min(d, q, m, out)


def _q5_k(blocks: np.ndarray, out: np.ndarray) -> None:
    """Q5_K (176 bytes: f16 d, f16 dmin, 12 bytes of scales, 32 bytes of fifth bits, 128 of nibbles).

    The fifth bit of value j of sub-block s is bit s of byte j of the 32-byte field.
    """
    n = len(blocks)
    scales, mins = _k_scales(blocks[:, 4:16])
    d = (_half(blocks, 0) * scales)[:, :, None]
    m = (_half(blocks, 2) * mins)[:, :, None]
    low = _nibbles(blocks[:, 48:].reshape(n, 4, 32)).reshape(n, 8, 32)
    high = _bits(blocks[:, 16:48, None], 8).transpose(0, 2, 1)  # [n, 32 values, 8 sub-blocks] -> [n, 8, 32]
    _scaled_minus_min(d, low | (high << np.uint8(4)), m, out)


def _two_bit_fields(packed: np.ndarray) -> np.ndarray:
    """uint8 [n, halves, 32] of 2-bit fields -> [n, halves * 4, 32]: shift 0, 2, 4, 6 give the
    values j, j + 32, j + 64, j + 96 of each 128-value half."""
    n, halves = packed.shape[:2]
    fields = (packed[:, :, None, :] >> np.array([0, 2, 4, 6], np.uint8)[:, None]) & np.uint8(3)
    return fields.reshape(n, halves * 4, 32)


def _q6_k(blocks: np.ndarray, out: np.ndarray) -> None:
    """Q6_K (210 bytes: 128 bytes of low nibbles, 64 of high 2-bit fields, 16 int8 scales, f16 d).

    Per 128-value half: 64 bytes of nibbles give values 0-63 (low) and 64-127 (high); 32 bytes
    of 2-bit fields give the top bits. q = (nibble | top << 4) - 32 and x = (d * scale) * q per
    16 values.
    """
    n = len(blocks)
    low = _nibbles(blocks[:, :128].reshape(n, 2, 64)).reshape(n, 8, 32)
    high = _two_bit_fields(blocks[:, 128:192].reshape(n, 2, 32))
    q = (low | (high << np.uint8(4))).view(np.int8) - np.int8(32)
    d = _half(blocks, 208) * blocks[:, 192:208].view(np.int8).astype(np.float32)  # [n, 16]
    np.multiply(d[:, :, None], q.reshape(n, 16, 16), out=out.reshape(n, 16, 16))


def _q2_k(blocks: np.ndarray, out: np.ndarray) -> None:
    """Q2_K (84 bytes: 16 bytes of 4-bit (scale low, min high) pairs, 64 of 2-bit values, f16 d, f16 dmin).

    x = (d * scale) * q - (dmin * min) per 16 values.
    """
    n = len(blocks)
    q = _two_bit_fields(blocks[:, 16:80].reshape(n, 2, 32)).reshape(n, 16, 16)
    d = (_half(blocks, 80) * (blocks[:, :16] & 0x0F).astype(np.float32))[:, :, None]
    m = (_half(blocks, 82) * (blocks[:, :16] >> 4).astype(np.float32))[:, :, None]
    _scaled_minus_min(d, q, m, out)


def _q3_k(blocks: np.ndarray, out: np.ndarray) -> None:
    """Q3_K (110 bytes: 32 bytes of high-bit masks, 64 of 2-bit values, 12 of 6-bit scales, f16 d).

    Values are laid out as in Q2_K; bit k of mask byte j belongs to value j + 32k, and a clear bit
    subtracts 4. The 16 scales: low nibbles in bytes 0-7 (scales 0-7 low, 8-15 high), top 2 bits
    in bytes 8-11 (shifts 0, 2, 4, 6 for scales i, i+4, i+8, i+12); scale - 32 is signed.
    """
    n = len(blocks)
    low = _two_bit_fields(blocks[:, 32:96].reshape(n, 2, 32))
    high = _bits(blocks[:, :32, None], 8).transpose(0, 2, 1)  # [n, 8, 32]: 1 = no subtraction
    q = low.view(np.int8) - ((high ^ np.uint8(1)) << np.uint8(2)).view(np.int8)
    sc = blocks[:, 96:108]
    lo = _nibbles(sc[:, :8]).reshape(n, 16)
    hi = ((sc[:, None, 8:12] >> np.array([0, 2, 4, 6], np.uint8)[:, None]) & np.uint8(3)).reshape(n, 16)
    scales = (lo | (hi << np.uint8(4))).view(np.int8) - np.int8(32)
    d = _half(blocks, 108) * scales.astype(np.float32)
    np.multiply(d[:, :, None], q.reshape(n, 16, 16), out=out.reshape(n, 16, 16))


# -- plain floats: converted, not decoded ---------------------------------------------------------

# (llaisys dtypes: bf16's numpy dtype comes from ml_dtypes, whose import takes ~0.6 s, on first use only)
FLOATS = {Q.F32: llaisys.float32, Q.F16: llaisys.float16, Q.BF16: llaisys.bfloat16}

DECODERS: dict[Q, Callable[[np.ndarray, np.ndarray], None]] = {
    Q.Q8_0: _symmetric(_q8_0_ints), Q.Q4_0: _symmetric(_q4_0_ints), Q.Q5_0: _symmetric(_q5_0_ints),
    Q.Q4_1: _q4_1, Q.Q5_1: _q5_1,
    Q.Q2_K: _q2_k, Q.Q3_K: _q3_k, Q.Q4_K: _q4_k, Q.Q5_K: _q5_k, Q.Q6_K: _q6_k,
}
SUPPORTED = (*FLOATS, *DECODERS)


def dequantize(raw: np.ndarray, qtype: Q, out: np.ndarray, rows: np.ndarray | None = None) -> np.ndarray:
    """Decode ``raw`` (uint8 [R, bytes per row], as stored) into ``out`` ([R, values per row], any float dtype).

    ``rows``: optional row order, ``out[i] = decoded raw[rows[i]]``. Works through chunks of
    about CHUNK_VALUES values, so temporaries stay small and cached whatever the tensor size.
    """
    block, type_size = GGML_QUANT_SIZES[qtype]
    n_rows, cols = out.shape
    if raw.shape != (n_rows, cols // block * type_size) or not out.flags.c_contiguous:
        raise ValueError(f"{qtype.name}: {raw.shape} bytes cannot hold {out.shape} values")
    step = max(1, CHUNK_VALUES // max(cols, 1))
    decode = DECODERS.get(qtype)
    scratch = None if decode is None or out.dtype == np.float32 else np.empty((step, cols), np.float32)
    for start in range(0, n_rows, step):
        end = min(start + step, n_rows)
        src = raw[start:end] if rows is None else raw[rows[start:end]]
        dst = out[start:end]
        if decode is None:  # a float type: one converting copy
            np.copyto(dst, src.view(FLOATS[qtype].numpy), casting="unsafe")
            continue
        values = dst if scratch is None else scratch[:end - start]
        decode(src.reshape(-1, type_size), values.reshape(-1, block))
        if values is not dst:
            np.copyto(dst, values, casting="unsafe")
    return out

