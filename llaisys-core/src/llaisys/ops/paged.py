"""Attention over a paged KV cache, for continuous batching.

One layer's keys and values live in a pool of fixed-size blocks, ``k_cache [num_blocks, block_size,
Hkv, d]`` and ``v_cache [num_blocks, block_size, Hkv, dv]``; a sequence's position j is row
``(block_table[j // block_size], j % block_size)``. What changes between decode steps (slots, block
tables, lengths, query offsets) is passed as tensors, never as Python numbers, so a device can capture
a step once and replay it with new values in the same buffers.
"""

from __future__ import annotations

import math

from ..dtype import int32
from . import _checks as check
from ._dispatch import current_stream_handle, kernel_for, new_plans, remember
from .elementwise import NUMERICS

_attention = new_plans()
_MAX_WINDOW = (1 << 63) - 1  # (int64_t in the ABI)


def paged_attention(out, q, k_cache, v_cache, block_tables, seq_lens, query_start, scale: float,
                    numerics: str = "exact", window: int | None = None) -> None:
    """Causal GQA attention of several sequences at once, each over its own blocks.

    q [T, H, d] and out [T, H, dv]: sequence s owns rows [query_start[s], query_start[s+1]), its last
    positions; its keys are positions [0, seq_lens[s]) through row s of block_tables
    (int32 [num_seqs, max_blocks]). Query i of a sequence with L rows and S keys, at position
    p = i + S - L, sees key j iff j <= p (as ``self_attention``) and, with a ``window`` (sliding-window
    attention; None or 0: none), iff also j > p - window: its last ``window`` positions, as HF transformers
    masks them. The keys before the window of a sequence's first query row (less the ≤ 64 keys of a kernel's
    key block) are not read: a decode step costs the window. Head h reads kv head h // (H / Hkv). seq_lens int32
    [num_seqs], query_start int32 [num_seqs + 1]. Rows outside every sequence are set to 0. The
    kernel checks the index data it reads (offsets, lengths, block ids) and raises on bad values.
    out may be q itself; no other overlap. ``numerics``: "exact" or "hf" (see ``rms_norm``; ``self_attention``
    says where the hf mode rounds).
    """
    try:
        mode = NUMERICS[numerics]
    except (KeyError, TypeError):
        mode = check.numerics("paged_attention", numerics)
    tensors = (out, q, k_cache, v_cache, block_tables, seq_lens, query_start)
    try:
        kernel, fail, device, code, sizes = _attention[tuple(t._layout for t in tensors)]
    except (AttributeError, KeyError):
        kernel, fail, device, code, sizes = _plan_paged_attention(*tensors)
    if scale.__class__ is not float or not math.isfinite(scale):
        scale = check.number("paged_attention", "scale", scale)
        if not math.isfinite(scale):
            check.fail("paged_attention", f"scale must be finite, got {scale!r}")
    if window is None:
        window = 0
    elif window.__class__ is not int or not 0 <= window <= _MAX_WINDOW:
        window = check.number("paged_attention", "window", window, 0, _MAX_WINDOW, integer=True)
    o_ptr, o_end = out._ptr, out._end
    if q._ptr < o_end and o_ptr < q._end and not (q._ptr == o_ptr and q._shape == out._shape):
        check.overlap("paged_attention", "out", "q", exact_allowed=True)
    for name, t in (("k_cache", k_cache), ("v_cache", v_cache), ("block_tables", block_tables),
                    ("seq_lens", seq_lens), ("query_start", query_start)):
        if t._ptr < o_end and o_ptr < t._end:
            check.overlap("paged_attention", "out", name)
    status = kernel(device.index, current_stream_handle(device), code, mode, *sizes, window, scale, o_ptr, q._ptr,
                    k_cache._ptr, v_cache._ptr, block_tables._ptr, seq_lens._ptr, query_start._ptr)
    if status:
        fail(status)


def _plan_paged_attention(out, q, k_cache, v_cache, block_tables, seq_lens, query_start):
    op = "paged_attention"
    device = check.tensors(op, out=out, q=q, k_cache=k_cache, v_cache=v_cache, block_tables=block_tables,
                           seq_lens=seq_lens, query_start=query_start)
    check.dtype(op, "out", out, check.FLOATS)
    check.same_dtype(op, "out", out, q=q, k_cache=k_cache, v_cache=v_cache)
    check.ndim(op, "q", q, 3)
    check.ndim(op, "k_cache", k_cache, 4)
    check.ndim(op, "v_cache", v_cache, 4)
    (tokens, heads, d), (num_blocks, block_size, kv_heads) = q.shape, k_cache.shape[:3]
    dv = v_cache.shape[3]
    check.shape(op, "k_cache", k_cache, (num_blocks, block_size, kv_heads, d))
    check.shape(op, "v_cache", v_cache, (num_blocks, block_size, kv_heads, dv))
    check.shape(op, "out", out, (tokens, heads, dv))
    num_seqs = check_batch(op, heads, kv_heads, block_size, block_tables, seq_lens, query_start)
    check.contiguous(op, out=out, q=q, k_cache=k_cache, v_cache=v_cache, block_tables=block_tables,
                     seq_lens=seq_lens, query_start=query_start)
    check.writable(op, "out", out)
    sizes = (tokens, num_seqs, heads, kv_heads, d, dv, num_blocks, block_size, block_tables.shape[1])
    layouts = tuple(t._layout for t in (out, q, k_cache, v_cache, block_tables, seq_lens, query_start))
    return remember(_attention, layouts, (*kernel_for(op, device, out.numel() > 0), device, out.dtype.code, sizes))


def check_batch(op: str, heads: int, kv_heads: int, block_size: int, block_tables, seq_lens, query_start) -> int:
    """The head counts, the block size and the batch's index tensors (int32 block_tables [S, W], seq_lens [S],
    query_start [S + 1]) of a paged attention; returns S."""
    if kv_heads == 0 or heads % kv_heads:
        check.fail(op, f"the {heads} query heads must be a multiple of the {kv_heads} kv heads")
    if block_size == 0:
        check.fail(op, "the caches' block size (dim 1) must be at least 1")
    check.dtype(op, "block_tables", block_tables, (int32,))
    check.ndim(op, "block_tables", block_tables, 2)
    num_seqs = block_tables.shape[0]
    check.dtype(op, "seq_lens", seq_lens, (int32,))
    check.shape(op, "seq_lens", seq_lens, (num_seqs,))
    check.dtype(op, "query_start", query_start, (int32,))
    check.shape(op, "query_start", query_start, (num_seqs + 1,))
    return num_seqs


_kv_write = new_plans()


def paged_kv_write(k_cache, v_cache, k, v, slot_mapping) -> None:
    """Store T tokens' keys k [T, Hkv, d] and values v [T, Hkv, dv] in the paged caches.

    Token t goes to row slot_mapping[t] (int64 [T]) of the caches seen as [num_blocks * block_size, ...]
    (row = block * block_size + offset); a negative slot skips the token, a slot past the end raises.
    The caches share no memory with each other, k, v or slot_mapping.
    """
    tensors = (k_cache, v_cache, k, v, slot_mapping)
    try:
        kernel, fail, device, code, sizes = _kv_write[tuple(t._layout for t in tensors)]
    except (AttributeError, KeyError):
        kernel, fail, device, code, sizes = _plan_paged_kv_write(*tensors)
    for cache_name, cache, others in (("k_cache", k_cache, (("v_cache", v_cache), ("k", k), ("v", v),
                                                            ("slot_mapping", slot_mapping))),
                                      ("v_cache", v_cache, (("k", k), ("v", v), ("slot_mapping", slot_mapping)))):
        for name, t in others:
            if t._ptr < cache._end and cache._ptr < t._end:
                check.overlap("paged_kv_write", cache_name, name)
    status = kernel(device.index, current_stream_handle(device), code, *sizes, k_cache._ptr, v_cache._ptr, k._ptr,
                    v._ptr, slot_mapping._ptr)
    if status:
        fail(status)


def _plan_paged_kv_write(k_cache, v_cache, k, v, slot_mapping):
    op = "paged_kv_write"
    device = check.tensors(op, k_cache=k_cache, v_cache=v_cache, k=k, v=v, slot_mapping=slot_mapping)
    check.dtype(op, "k_cache", k_cache, check.FLOATS)
    check.same_dtype(op, "k_cache", k_cache, v_cache=v_cache, k=k, v=v)
    check.ndim(op, "k", k, 3)
    check.ndim(op, "k_cache", k_cache, 4)
    check.ndim(op, "v_cache", v_cache, 4)
    (tokens, kv_heads, d), (num_blocks, block_size) = k.shape, k_cache.shape[:2]
    dv = v_cache.shape[3]
    check.shape(op, "k_cache", k_cache, (num_blocks, block_size, kv_heads, d))
    check.shape(op, "v_cache", v_cache, (num_blocks, block_size, kv_heads, dv))
    check.shape(op, "v", v, (tokens, kv_heads, dv))
    check.index_tensor(op, "slot_mapping", slot_mapping, (tokens,))
    check.contiguous(op, k_cache=k_cache, v_cache=v_cache, k=k, v=v, slot_mapping=slot_mapping)
    check.writable(op, "k_cache", k_cache)
    check.writable(op, "v_cache", v_cache)
    runs = bool(tokens and kv_heads and (d or dv))
    sizes = (tokens, kv_heads, d, dv, num_blocks * block_size)
    layouts = tuple(t._layout for t in (k_cache, v_cache, k, v, slot_mapping))
    return remember(_kv_write, layouts, (*kernel_for(op, device, runs), device, k.dtype.code, sizes))
