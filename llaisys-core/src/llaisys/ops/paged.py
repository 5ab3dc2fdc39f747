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
from ._dispatch import run


def paged_attention(out, q, k_cache, v_cache, block_tables, seq_lens, query_start, scale: float) -> None:
    """Causal GQA attention of several sequences at once, each over its own blocks.

    q [T, H, d] and out [T, H, dv]: sequence s owns rows [query_start[s], query_start[s+1]), its last
    positions; its keys are positions [0, seq_lens[s]) through row s of block_tables
    (int32 [num_seqs, max_blocks]). Query i of a sequence with L rows and S keys sees key j iff
    j <= i + S - L (as ``self_attention``); head h reads kv head h // (H / Hkv). seq_lens int32
    [num_seqs], query_start int32 [num_seqs + 1]. Rows outside every sequence are set to 0. The
    kernel checks the index data it reads (offsets, lengths, block ids) and raises on bad values.
    out may be q itself; no other overlap.
    """
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
    check.number(op, "scale", scale)
    if not math.isfinite(scale):
        check.fail(op, f"scale must be finite, got {scale!r}")
    check.contiguous(op, out=out, q=q, k_cache=k_cache, v_cache=v_cache, block_tables=block_tables,
                     seq_lens=seq_lens, query_start=query_start)
    check.writable(op, "out", out)
    if not _same_memory(out, q):
        _no_overlap(op, "out", out, q=q)
    _no_overlap(op, "out", out, k_cache=k_cache, v_cache=v_cache, block_tables=block_tables, seq_lens=seq_lens,
                query_start=query_start)
    if out.numel():
        run(op, device, out, q, k_cache, v_cache, block_tables, seq_lens, query_start, float(scale))


def paged_kv_write(k_cache, v_cache, k, v, slot_mapping) -> None:
    """Store T tokens' keys k [T, Hkv, d] and values v [T, Hkv, dv] in the paged caches.

    Token t goes to row slot_mapping[t] (int64 [T]) of the caches seen as [num_blocks * block_size, ...]
    (row = block * block_size + offset); a negative slot skips the token, a slot past the end raises.
    """
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
    _no_overlap(op, "k_cache", k_cache, v_cache=v_cache, k=k, v=v, slot_mapping=slot_mapping)
    _no_overlap(op, "v_cache", v_cache, k=k, v=v, slot_mapping=slot_mapping)
    if tokens and kv_heads and (d or dv):
        run(op, device, k_cache, v_cache, k, v, slot_mapping)


def _same_memory(a, b) -> bool:
    return a.data_ptr() == b.data_ptr() and a.nbytes == b.nbytes


def _no_overlap(op: str, name: str, t, **others) -> None:
    """``t`` (contiguous) shares no byte with any of ``others`` (contiguous)."""
    start, end = t.data_ptr(), t.data_ptr() + t.nbytes
    for other_name, o in others.items():
        o_start = o.data_ptr()
        if t.nbytes and o.nbytes and o_start < end and start < o_start + o.nbytes:
            check.fail(op, f"{name} overlaps {other_name}; they must be separate memory")
