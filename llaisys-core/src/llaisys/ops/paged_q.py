"""A paged KV cache stored quantized: one byte per key or value and one f16 scale per (token, kv head).

    k_cache uint8 [num_blocks, block_size, Hkv, d]    k_scale float16 [num_blocks, block_size, Hkv]
    v_cache uint8 [num_blocks, block_size, Hkv, dv]   v_scale float16 [num_blocks, block_size, Hkv]

A stored byte b means x = decode(b) * scale, decoded to f32. ``kv_format`` names what the bytes are:
"int8" (two's complement, QMAX 127) or "fp8" (OCP float8 e4m3fn, QMAX 448). A row's scale is f16(amax / QMAX),
so it costs 2 bytes beside d: head_dim 64 keeps 66 bytes where bf16 keeps 128 (1.94x the tokens per byte).
The scale is per token, not per block of positions, because a block fills one decode step at a time: a block's
scale would have to be known before its tokens are (vLLM calibrates one static fp8 scale per layer instead;
llama.cpp's q8_0 cache keeps one per 32 values). ``quantize_kv`` / ``dequantize_kv`` are the numpy definitions
the kernels follow bit for bit (backend.h, llaisys_kv_format).
"""

from __future__ import annotations

import math

import numpy as np

from ..abi import KVFormat
from ..dtype import float16, uint8
from . import _checks as check
from ._dispatch import current_stream_handle, kernel_for, new_plans, remember
from .paged import _MAX_WINDOW, check_batch

KV_FORMATS = {"int8": KVFormat.INT8, "fp8": KVFormat.FP8_E4M3}
_QMAX = {"int8": 127.0, "fp8": 448.0}
_F16_MAX = 65504.0


def kv_format_code(op: str, kv_format) -> int:
    try:
        return int(KV_FORMATS[kv_format])
    except (KeyError, TypeError):
        check.fail(op, f"kv_format must be one of {', '.join(map(repr, KV_FORMATS))}, got {kv_format!r}")


def quantize_kv(x: np.ndarray, kv_format: str) -> tuple[np.ndarray, np.ndarray]:
    """Rows x [..., d] (any float dtype; computed in f32) -> (bytes uint8 [..., d], scales float16 [...])."""
    qmax = _QMAX[kv_format]
    x = np.asarray(x, np.float32)
    amax = np.abs(x).max(axis=-1) if x.shape[-1] else np.zeros(x.shape[:-1], np.float32)
    scale = np.minimum(amax / np.float32(qmax), np.float32(_F16_MAX)).astype(np.float16)
    s = scale.astype(np.float32)[..., None]
    with np.errstate(divide="ignore", invalid="ignore"):
        y = np.clip(np.where(s > 0, x / np.where(s > 0, s, 1), 0).astype(np.float32), -qmax, qmax)
    if kv_format == "int8":
        data = np.rint(y).astype(np.int8).view(np.uint8)
    else:
        import ml_dtypes  # (here, not at import: a CLI's start-up imports llaisys.ops)

        data = y.astype(ml_dtypes.float8_e4m3fn).view(np.uint8)
    return data, scale


def dequantize_kv(data: np.ndarray, scale: np.ndarray, kv_format: str) -> np.ndarray:
    """bytes uint8 [..., d] and scales float16 [...] -> float32 [..., d] (decode(b) * scale, in f32)."""
    data = np.asarray(data, np.uint8)
    if kv_format == "int8":
        values = data.view(np.int8)
    else:
        import ml_dtypes

        values = data.view(ml_dtypes.float8_e4m3fn)
    return values.astype(np.float32) * np.asarray(scale, np.float16).astype(np.float32)[..., None]


_attention = new_plans()


def paged_attention_q(out, q, k_cache, v_cache, k_scale, v_scale, block_tables, seq_lens, query_start, scale: float,
                      kv_format: str, window: int | None = None) -> None:
    """``paged_attention`` (exact numerics) over caches quantized as ``kv_format``: each key and value is read as
    decode(byte) * its row's scale, in f32; the masks, the window, the checks and batch invariance are
    paged_attention's. out may be q itself; no other overlap."""
    op = "paged_attention_q"
    fmt = kv_format_code(op, kv_format)
    tensors = (out, q, k_cache, v_cache, k_scale, v_scale, block_tables, seq_lens, query_start)
    try:
        kernel, fail, device, code, sizes = _attention[tuple(t._layout for t in tensors)]
    except (AttributeError, KeyError):
        kernel, fail, device, code, sizes = _plan_attention(*tensors)
    if scale.__class__ is not float or not math.isfinite(scale):
        scale = check.number(op, "scale", scale)
        if not math.isfinite(scale):
            check.fail(op, f"scale must be finite, got {scale!r}")
    if window is None:
        window = 0
    elif window.__class__ is not int or not 0 <= window <= _MAX_WINDOW:
        window = check.number(op, "window", window, 0, _MAX_WINDOW, integer=True)
    o_ptr, o_end = out._ptr, out._end
    if q._ptr < o_end and o_ptr < q._end and not (q._ptr == o_ptr and q._shape == out._shape):
        check.overlap(op, "out", "q", exact_allowed=True)
    for name, t in zip(("k_cache", "v_cache", "k_scale", "v_scale", "block_tables", "seq_lens", "query_start"),
                       tensors[2:]):
        if t._ptr < o_end and o_ptr < t._end:
            check.overlap(op, "out", name)
    status = kernel(device.index, current_stream_handle(device), code, fmt, *sizes, window, scale, o_ptr, q._ptr,
                    k_cache._ptr, v_cache._ptr, k_scale._ptr, v_scale._ptr, block_tables._ptr, seq_lens._ptr,
                    query_start._ptr)
    if status:
        fail(status)


def _check_caches(op, k_cache, v_cache, k_scale, v_scale, kv_heads, d, dv):
    """The byte caches [num_blocks, block_size, Hkv, d | dv] and their f16 scales [num_blocks, block_size, Hkv];
    returns (num_blocks, block_size)."""
    check.dtype(op, "k_cache", k_cache, (uint8,))
    check.dtype(op, "v_cache", v_cache, (uint8,))
    check.dtype(op, "k_scale", k_scale, (float16,))
    check.dtype(op, "v_scale", v_scale, (float16,))
    check.ndim(op, "k_cache", k_cache, 4)
    num_blocks, block_size = k_cache.shape[:2]
    check.shape(op, "k_cache", k_cache, (num_blocks, block_size, kv_heads, d))
    check.shape(op, "v_cache", v_cache, (num_blocks, block_size, kv_heads, dv))
    check.shape(op, "k_scale", k_scale, (num_blocks, block_size, kv_heads))
    check.shape(op, "v_scale", v_scale, (num_blocks, block_size, kv_heads))
    return num_blocks, block_size


def _plan_attention(out, q, k_cache, v_cache, k_scale, v_scale, block_tables, seq_lens, query_start):
    op = "paged_attention_q"
    device = check.tensors(op, out=out, q=q, k_cache=k_cache, v_cache=v_cache, k_scale=k_scale, v_scale=v_scale,
                           block_tables=block_tables, seq_lens=seq_lens, query_start=query_start)
    check.dtype(op, "out", out, check.FLOATS)
    check.same_dtype(op, "out", out, q=q)
    check.ndim(op, "q", q, 3)
    check.ndim(op, "out", out, 3)
    check.ndim(op, "k_cache", k_cache, 4)
    check.ndim(op, "v_cache", v_cache, 4)
    (tokens, heads, d), kv_heads, dv = q.shape, k_cache.shape[2], v_cache.shape[3]
    num_blocks, block_size = _check_caches(op, k_cache, v_cache, k_scale, v_scale, kv_heads, d, dv)
    check.shape(op, "out", out, (tokens, heads, dv))
    num_seqs = check_batch(op, heads, kv_heads, block_size, block_tables, seq_lens, query_start)
    check.contiguous(op, out=out, q=q, k_cache=k_cache, v_cache=v_cache, k_scale=k_scale, v_scale=v_scale,
                     block_tables=block_tables, seq_lens=seq_lens, query_start=query_start)
    check.writable(op, "out", out)
    sizes = (tokens, num_seqs, heads, kv_heads, d, dv, num_blocks, block_size, block_tables.shape[1])
    layouts = tuple(t._layout for t in (out, q, k_cache, v_cache, k_scale, v_scale, block_tables, seq_lens,
                                        query_start))
    return remember(_attention, layouts, (*kernel_for(op, device, out.numel() > 0), device, out.dtype.code, sizes))


_kv_write = new_plans()


def paged_kv_write_q(k_cache, v_cache, k_scale, v_scale, k, v, slot_mapping, kv_format: str) -> None:
    """``paged_kv_write`` into caches quantized as ``kv_format``: token t's rows k [T, Hkv, d] and v [T, Hkv, dv]
    are quantized (``quantize_kv``) into row slot_mapping[t] of the caches and their scales; a negative slot
    skips the token, a slot past the end raises before anything is written. The caches and scales share no
    memory with each other, k, v or slot_mapping."""
    op = "paged_kv_write_q"
    fmt = kv_format_code(op, kv_format)
    tensors = (k_cache, v_cache, k_scale, v_scale, k, v, slot_mapping)
    try:
        kernel, fail, device, code, sizes = _kv_write[tuple(t._layout for t in tensors)]
    except (AttributeError, KeyError):
        kernel, fail, device, code, sizes = _plan_kv_write(*tensors)
    written = (("k_cache", k_cache), ("v_cache", v_cache), ("k_scale", k_scale), ("v_scale", v_scale))
    read = (("k", k), ("v", v), ("slot_mapping", slot_mapping))
    for i, (cache_name, cache) in enumerate(written):
        for name, t in (*written[i + 1:], *read):
            if t._ptr < cache._end and cache._ptr < t._end:
                check.overlap(op, cache_name, name)
    status = kernel(device.index, current_stream_handle(device), code, fmt, *sizes, k_cache._ptr, v_cache._ptr,
                    k_scale._ptr, v_scale._ptr, k._ptr, v._ptr, slot_mapping._ptr)
    if status:
        fail(status)


def _plan_kv_write(k_cache, v_cache, k_scale, v_scale, k, v, slot_mapping):
    op = "paged_kv_write_q"
    device = check.tensors(op, k_cache=k_cache, v_cache=v_cache, k_scale=k_scale, v_scale=v_scale, k=k, v=v,
                           slot_mapping=slot_mapping)
    check.dtype(op, "k", k, check.FLOATS)
    check.same_dtype(op, "k", k, v=v)
    check.ndim(op, "k", k, 3)
    check.ndim(op, "v", v, 3)
    check.ndim(op, "k_cache", k_cache, 4)
    check.ndim(op, "v_cache", v_cache, 4)
    (tokens, kv_heads, d), dv = k.shape, v_cache.shape[3]
    num_blocks, block_size = _check_caches(op, k_cache, v_cache, k_scale, v_scale, kv_heads, d, dv)
    check.shape(op, "v", v, (tokens, kv_heads, dv))
    check.index_tensor(op, "slot_mapping", slot_mapping, (tokens,))
    check.contiguous(op, k_cache=k_cache, v_cache=v_cache, k_scale=k_scale, v_scale=v_scale, k=k, v=v,
                     slot_mapping=slot_mapping)
    for name, t in (("k_cache", k_cache), ("v_cache", v_cache), ("k_scale", k_scale), ("v_scale", v_scale)):
        check.writable(op, name, t)
    runs = bool(tokens and kv_heads)
    sizes = (tokens, kv_heads, d, dv, num_blocks * block_size)
    layouts = tuple(t._layout for t in (k_cache, v_cache, k_scale, v_scale, k, v, slot_mapping))
    return remember(_kv_write, layouts, (*kernel_for(op, device, runs), device, k.dtype.code, sizes))
