"""The device memory each pointer argument of an op slot covers, from the slot's other arguments.

An op's C arguments (``llaisys.abi.OP_SLOTS``, after device and stream) carry every size the kernel needs, so
the bytes a buffer spans follow from them as ``backend.h`` describes the buffer (contiguous unless a stride
argument says otherwise). The CPU fallback of a device the host cannot address (``llaisys.fallback``) copies
exactly these bytes to the host and back. ``extents(op, args)`` gives them in the order of the op's pointer
arguments (``POINTERS[op]``: their positions among the arguments); ``WRITES[op]`` says which of them the op
may write (the header's ``void*``, as opposed to ``const void*``; tests/core/test_abi_header.py checks it).
NULL pointers (an absent bias) cover nothing.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from ctypes import c_void_p

from .abi import OP_SLOTS
from .dtype import DType
from .errors import LlaisysValueError
from .ops.int8 import int8_shapes
from .ops.quant import FORMATS

_ITEMSIZE = {d.code: d.itemsize for d in DType}
_QFORMATS = {f.code: f for f in FORMATS.values()}
I32, I64, F32, F16, BF16 = 4, 8, 4, 2, 2  # bytes of the index, table and scale buffers whose dtype the ABI fixes


def _size(dtype: int) -> int:
    try:
        return _ITEMSIZE[dtype]
    except KeyError:
        raise LlaisysValueError(f"unknown dtype code {dtype}") from None


def _ceil(a: int, b: int) -> int:
    return -(-a // b)


def _i8_blocks(n: int, k: int) -> tuple[int, int]:
    """Bytes of linear_i8's int8 weight blocks and bf16 scales of an [n, k] matrix."""
    weight, scales = int8_shapes(n, k)
    return math.prod(weight), math.prod(scales) * BF16


def _q_blocks(fmt: int, n: int, k: int) -> tuple[int, int]:
    """Bytes of linear_q's weight blocks and scales (uint8) of an [n, k] matrix in format code ``fmt``."""
    if fmt not in _QFORMATS:
        raise LlaisysValueError(f"unknown weight format code {fmt}")
    weight, scales = _QFORMATS[fmt].shapes(n, k)
    return math.prod(weight), math.prod(scales)


def _linear_gq(dtype, bits, group_size, perm_dtype, M, N, K, out, x, weight, scales, zeros, bias, perm):
    s, blocks = _size(dtype), _ceil(N, 16)
    groups = K // group_size if K and group_size > 0 else 0
    return (M * N * s, M * K * s, blocks * K * bits // 32 * 64, blocks * groups * 16 * 2, blocks * groups * 16, N * s,
            K * (_size(perm_dtype) if perm else 0))


def _strided(ndim: int, shape, strides, elem_size: int) -> int:
    """Bytes from the first to one past the last element of a strided view (strides >= 0, in elements)."""
    dims = [shape[i] for i in range(ndim)]
    if 0 in dims:
        return 0
    return (1 + sum((n - 1) * strides[i] for i, n in enumerate(dims))) * elem_size


def _linear_i8(dtype, M, N, K, out, x, weight, scales, bias):
    s = _size(dtype)
    return (M * N * s, M * K * s, *_i8_blocks(N, K), N * s)


def _moe_linear_i8(dtype, M, k, E, N, K, x_per_slot, out, x, weight, scales, experts):
    s = _size(dtype)
    w, sc = _i8_blocks(N, K)
    return (M * k * N * s, M * (k if x_per_slot else 1) * K * s, E * w, E * sc, M * k * I64)


def _moe_linear_q(dtype, fmt, M, k, E, N, K, x_per_slot, out, x, weight, scales, experts):
    s = _size(dtype)
    w, sc = _q_blocks(fmt, N, K)
    return (M * k * N * s, M * (k if x_per_slot else 1) * K * s, E * w, E * sc, M * k * I64)


def _paged_attention(dtype, numerics, T, num_seqs, H, Hkv, d, dv, num_blocks, block_size, max_blocks, window, scale,
                     out, q, k_cache, v_cache, block_tables, seq_lens, query_start):
    s, rows = _size(dtype), num_blocks * block_size
    return (T * H * dv * s, T * H * d * s, rows * Hkv * d * s, rows * Hkv * dv * s, num_seqs * max_blocks * I32,
            num_seqs * I32, (num_seqs + 1) * I32)


def _paged_attention_q(dtype, kv_format, T, num_seqs, H, Hkv, d, dv, num_blocks, block_size, max_blocks, window,
                       scale, out, q, k_cache, v_cache, k_scale, v_scale, block_tables, seq_lens, query_start):
    s, rows = _size(dtype), num_blocks * block_size
    return (T * H * dv * s, T * H * d * s, rows * Hkv * d, rows * Hkv * dv, rows * Hkv * F16, rows * Hkv * F16,
            num_seqs * max_blocks * I32, num_seqs * I32, (num_seqs + 1) * I32)


def _paged_kv_write_q(dtype, kv_format, T, Hkv, d, dv, num_slots, k_cache, v_cache, k_scale, v_scale, k, v,
                      slot_mapping):
    s = _size(dtype)
    return (num_slots * Hkv * d, num_slots * Hkv * dv, num_slots * Hkv * F16, num_slots * Hkv * F16,
            T * Hkv * d * s, T * Hkv * dv * s, T * I64)


def _glu(dtype, numerics, n, out, gate, up):
    return (n * _size(dtype),) * 3


# op -> f(*args after device and stream) -> bytes of each pointer argument, in order (names as in backend.h)
_EXTENTS: dict[str, Callable[..., tuple[int, ...]]] = {
    "add": lambda dtype, n, c, a, b: (n * _size(dtype),) * 3,
    "argmax": lambda dtype, n, max_idx, max_val, vals: (I64, _size(dtype), n * _size(dtype)),
    "embedding": lambda dtype, n_index, dim, vocab, out, index, weight: (
        n_index * dim * _size(dtype), n_index * I64, vocab * dim * _size(dtype)),
    "linear": lambda dtype, M, N, K, out, x, weight, bias: (
        M * N * _size(dtype), M * K * _size(dtype), N * K * _size(dtype), N * _size(dtype)),
    "linear_i8": _linear_i8,
    "moe_router": lambda dtype, M, E, k, normalize, weights, experts, logits: (
        M * k * _size(dtype), M * k * I64, M * E * _size(dtype)),
    "moe_router_grouped": lambda dtype, M, E, k, scoring, n_group, topk_group, group_top, normalize, route_scale,
    weights, experts, logits, bias: (M * k * _size(dtype), M * k * I64, M * E * F32, E * F32),
    "moe_linear": lambda dtype, M, k, E, N, K, x_per_slot, out, x, weight, experts: (
        M * k * N * _size(dtype), M * (k if x_per_slot else 1) * K * _size(dtype), E * N * K * _size(dtype),
        M * k * I64),
    "moe_combine": lambda dtype, M, k, N, out, y, weights: (
        M * N * _size(dtype), M * k * N * _size(dtype), M * k * _size(dtype)),
    "rearrange": lambda elem_size, ndim, shape, dst, dst_strides, src, src_strides: (
        _strided(ndim, shape, dst_strides, elem_size), _strided(ndim, shape, src_strides, elem_size)),
    "rms_norm": lambda dtype, numerics, weight_dtype, rows, dim, eps, out, x, weight: (
        rows * dim * _size(dtype), rows * dim * _size(dtype), dim * _size(weight_dtype)),
    "rope": lambda dtype, numerics, seq, heads, head_dim, scale, out, x, pos_ids, inv_freq: (
        seq * heads * head_dim * _size(dtype), seq * heads * head_dim * _size(dtype), seq * I64, head_dim // 2 * F32),
    "self_attention": lambda dtype, numerics, L, S, H, Hkv, d, dv, scale, out, q, k, v: (
        L * H * dv * _size(dtype), L * H * d * _size(dtype), S * Hkv * d * _size(dtype), S * Hkv * dv * _size(dtype)),
    "paged_attention": _paged_attention,
    "paged_kv_write": lambda dtype, T, Hkv, d, dv, num_slots, k_cache, v_cache, k, v, slot_mapping: (
        num_slots * Hkv * d * _size(dtype), num_slots * Hkv * dv * _size(dtype), T * Hkv * d * _size(dtype),
        T * Hkv * dv * _size(dtype), T * I64),
    "paged_attention_q": _paged_attention_q,
    "paged_latent_attention": lambda dtype, T, num_seqs, H, dc, dr, num_blocks, block_size, max_blocks, scale, out,
    q, c_cache, r_cache, block_tables, seq_lens, query_start: (
        T * H * dc * _size(dtype), T * H * (dc + dr) * _size(dtype), num_blocks * block_size * dc * _size(dtype),
        num_blocks * block_size * dr * _size(dtype), num_seqs * max_blocks * I32, num_seqs * I32,
        (num_seqs + 1) * I32),
    "paged_kv_write_q": _paged_kv_write_q,
    "swiglu": _glu,
    "sample": lambda dtype, n, out_idx, logits, temperature, top_k, top_p, seed: (I64, n * _size(dtype)),
    "mask_logits": lambda dtype, rows, vocab, logits, bitmask: (rows * vocab * _size(dtype), rows * _ceil(vocab, 32) * I32),
    "penalize_logits": lambda dtype, vocab, n, logits, ids, counts, bias, repetition, frequency, presence: (
        vocab * _size(dtype), n * I64, n * 2 * I64, n * F32),
    "logprobs": lambda dtype, n, logits, chosen, temperature, k, top_ids, values: (
        n * _size(dtype), k * I64, (k + 1) * F32),
    "geglu_tanh": _glu,
    "scale": lambda dtype, n, factor, out, x: (n * _size(dtype),) * 2,
    "moe_linear_i8": _moe_linear_i8,
    "linear_q": lambda dtype, fmt, M, N, K, out, x, weight, scales, bias: (
        M * N * _size(dtype), M * K * _size(dtype), *_q_blocks(fmt, N, K), N * _size(dtype)),
    "embedding_q": lambda dtype, fmt, n_index, dim, vocab, out, index, weight, scales: (
        n_index * dim * _size(dtype), n_index * I64, *_q_blocks(fmt, vocab, dim)),
    "linear_gq": _linear_gq,
    "lora_shrink": lambda dtype, M, K, R, S, h, x, a, adapters, scales: (
        M * R * F32, M * K * _size(dtype), S * R * K * _size(dtype), M * I64, S * F32),
    "lora_expand": lambda dtype, M, R, N, S, out, h, b, adapters: (
        M * N * _size(dtype), M * R * F32, S * R * N * _size(dtype), M * I64),
    "moe_linear_q": _moe_linear_q,
}

# op -> positions of its pointer (void*) arguments among the arguments after device and stream
POINTERS: dict[str, tuple[int, ...]] = {
    op: tuple(i for i, kind in enumerate(args) if kind is c_void_p) for op, args in OP_SLOTS.items()}

# op -> which of its pointer arguments (indices into POINTERS[op]) it may write: backend.h's non-const void*
WRITES: dict[str, frozenset[int]] = {
    "add": frozenset({0}), "argmax": frozenset({0, 1}), "embedding": frozenset({0}), "linear": frozenset({0}),
    "linear_i8": frozenset({0}), "moe_router": frozenset({0, 1}), "moe_linear": frozenset({0}),
    "moe_combine": frozenset({0}), "rearrange": frozenset({0}), "rms_norm": frozenset({0}), "rope": frozenset({0}),
    "self_attention": frozenset({0}), "paged_attention": frozenset({0}), "paged_kv_write": frozenset({0, 1}),
    "paged_attention_q": frozenset({0}), "paged_kv_write_q": frozenset({0, 1, 2, 3}),
    "swiglu": frozenset({0}), "sample": frozenset({0}), "mask_logits": frozenset({0}),
    "penalize_logits": frozenset({0}), "logprobs": frozenset({1, 2}), "geglu_tanh": frozenset({0}),
    "scale": frozenset({0}), "moe_linear_i8": frozenset({0}), "linear_q": frozenset({0}),
    "embedding_q": frozenset({0}), "linear_gq": frozenset({0}), "lora_shrink": frozenset({0}),
    "lora_expand": frozenset({0}), "moe_linear_q": frozenset({0}), "paged_latent_attention": frozenset({0}),
    "moe_router_grouped": frozenset({0, 1}),
}


def extents(op: str, args) -> tuple[int, ...]:
    """Bytes covered by each pointer argument of ``op`` called with ``args`` (after device and stream), in the
    order of POINTERS[op]; 0 for a NULL pointer."""
    sizes = _EXTENTS[op](*args)
    return tuple(size if args[i] else 0 for i, size in zip(POINTERS[op], sizes))
