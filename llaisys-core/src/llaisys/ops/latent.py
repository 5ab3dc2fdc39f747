"""Multi-head latent attention (DeepSeek's MLA) over a paged latent cache.

Every token keeps one latent per layer instead of per-head keys and values: ``c`` (kv_lora_rank values, the
compressed keys and values) and ``r`` (qk_rope_head_dim values, the rope key every head shares). They are written
with ``paged_kv_write`` as a cache of one kv head (c as the keys, r as the values). Attention runs in the
absorbed form: the model folds W_uk into the query's first dc values (q_c = q_nope W_uk) and applies W_uv after,
so a step reads each latent once for all heads:

    score[i, h, j] = scale * (q[i, h, :dc] . c[j] + q[i, h, dc:] . r[j]);  out[i, h] = softmax_j(score) @ c
"""

from __future__ import annotations

import math

from . import _checks as check
from ._dispatch import current_stream_handle, kernel_for, new_plans, remember
from .paged import check_batch

_attention = new_plans()


def paged_latent_attention(out, q, c_cache, r_cache, block_tables, seq_lens, query_start, scale: float) -> None:
    """MLA's absorbed attention: q [T, H, dc + dr] and out [T, H, dc] over the latent caches c_cache [num_blocks,
    block_size, dc] and r_cache [num_blocks, block_size, dr] (module docstring). Sequences, causal masks, block
    tables, the checks of the index data and batch invariance are ``paged_attention``'s with one kv head (exact
    numerics, no window). out shares no memory with the others."""
    op = "paged_latent_attention"
    tensors = (out, q, c_cache, r_cache, block_tables, seq_lens, query_start)
    try:
        kernel, fail, device, code, sizes = _attention[tuple(t._layout for t in tensors)]
    except (AttributeError, KeyError):
        kernel, fail, device, code, sizes = _plan(*tensors)
    if scale.__class__ is not float or not math.isfinite(scale):
        scale = check.number(op, "scale", scale)
        if not math.isfinite(scale):
            check.fail(op, f"scale must be finite, got {scale!r}")
    o_ptr, o_end = out._ptr, out._end
    for name, t in zip(("q", "c_cache", "r_cache", "block_tables", "seq_lens", "query_start"), tensors[1:]):
        if t._ptr < o_end and o_ptr < t._end:
            check.overlap(op, "out", name)
    status = kernel(device.index, current_stream_handle(device), code, *sizes, scale, o_ptr, q._ptr, c_cache._ptr,
                    r_cache._ptr, block_tables._ptr, seq_lens._ptr, query_start._ptr)
    if status:
        fail(status)


def _plan(out, q, c_cache, r_cache, block_tables, seq_lens, query_start):
    op = "paged_latent_attention"
    device = check.tensors(op, out=out, q=q, c_cache=c_cache, r_cache=r_cache, block_tables=block_tables,
                           seq_lens=seq_lens, query_start=query_start)
    check.dtype(op, "out", out, check.FLOATS)
    check.same_dtype(op, "out", out, q=q, c_cache=c_cache, r_cache=r_cache)
    check.ndim(op, "q", q, 3)
    check.ndim(op, "c_cache", c_cache, 3)
    check.ndim(op, "r_cache", r_cache, 3)
    (tokens, heads, width), (num_blocks, block_size, dc) = q.shape, c_cache.shape
    dr = r_cache.shape[2]
    check.shape(op, "r_cache", r_cache, (num_blocks, block_size, dr))
    if width != dc + dr:
        check.fail(op, f"q's last dim {width} must be c_cache's {dc} + r_cache's {dr}")
    check.shape(op, "out", out, (tokens, heads, dc))
    num_seqs = check_batch(op, heads, 1, block_size, block_tables, seq_lens, query_start)
    check.contiguous(op, out=out, q=q, c_cache=c_cache, r_cache=r_cache, block_tables=block_tables,
                     seq_lens=seq_lens, query_start=query_start)
    check.writable(op, "out", out)
    sizes = (tokens, num_seqs, heads, dc, dr, num_blocks, block_size, block_tables.shape[1])
    layouts = tuple(t._layout for t in (out, q, c_cache, r_cache, block_tables, seq_lens, query_start))
    return remember(_attention, layouts, (*kernel_for(op, device, out.numel() > 0), device, out.dtype.code, sizes))
