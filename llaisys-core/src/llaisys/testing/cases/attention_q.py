"""paged_attention_q and paged_kv_write_q: the paged KV cache stored as int8 or fp8 bytes with f16 row scales.

The write is judged bit for bit against ``quantize_kv`` (the numpy definition backend.h states); the attention
against float64 attention over ``dequantize_kv`` of the same bytes (so only the attention's own rounding is judged,
not the quantization's).
"""

from __future__ import annotations

import math
from functools import partial

import numpy as np

from ... import ops
from ...dtype import bfloat16, float16, float32
from ...stream import synchronize
from ..case import ALIASING, BATCH, CONTIGUOUS, IN_PLACE, ODD, PROPERTY, Case, Ctx
from ..compare import TOLERANCE, close, identical, refused
from .attention import Paged

FLOATS = (float32, float16, bfloat16)
FORMATS = tuple(ops.KV_FORMATS)


class PagedQ(Paged):
    """A random batch in a quantized paged cache: sequences of (query rows L, keys S), their blocks in a shuffled
    order; unused rows hold random bytes with NaN scales (a read of a wrong row shows); ``lead`` / ``tail`` query
    rows outside every sequence (their output must be 0); run and expected are Paged's."""

    def __init__(self, ctx: Ctx, kv_format, seqs, H, Hkv, d, dv, block_size, lead=0, tail=0, spare_blocks=3,
                 window=0):
        self.ctx, self.kv_format, self.seqs, self.H, self.dv, self.window = ctx, kv_format, seqs, H, dv, window
        counts = [-(-S // block_size) for _, S in seqs]
        num_blocks = sum(counts) + spare_blocks
        order = list(ctx.rng.permutation(num_blocks))
        caches = [ctx.rng.integers(0, 256, (num_blocks, block_size, Hkv, n), dtype=np.uint8) for n in (d, dv)]
        scales = [np.full((num_blocks, block_size, Hkv), np.nan, np.float16) for _ in range(2)]
        self.tables = np.zeros((len(seqs), max(counts + [1])), np.int32)
        self.keys, self.values, starts = [], [], [lead]
        for s, ((L, S), n) in enumerate(zip(seqs, counts)):
            blocks, order = order[:n], order[n:]
            self.tables[s, :n] = blocks
            rows = []
            for cache, scale, width in zip(caches, scales, (d, dv)):
                x = ctx.rng.standard_normal((S, Hkv, width)) * ctx.rng.uniform(0.1, 4.0, (S, Hkv, 1))
                data, sc = ops.quantize_kv(x.astype(np.float32), kv_format)
                for j in range(S):
                    cache[blocks[j // block_size], j % block_size] = data[j]
                    scale[blocks[j // block_size], j % block_size] = sc[j]
                rows.append(ops.dequantize_kv(data, sc, kv_format).astype(np.float64))
            self.keys.append(rows[0])
            self.values.append(rows[1])
            starts.append(starts[-1] + L)
        self.query_start = np.array(starts, np.int32)
        self.seq_lens = np.array([S for _, S in seqs], np.int32)
        self.T = starts[-1] + tail
        self.q = ctx.rng.standard_normal((self.T, H, d)).astype(ctx.dtype.numpy)
        self.k_cache, self.v_cache = (ctx.upload(c) for c in caches)
        self.k_scale, self.v_scale = (ctx.upload(s) for s in scales)
        self.scale = 1.0 / math.sqrt(d)

    def _attend(self, out, q, tables, seq_lens, query_start) -> None:
        ops.paged_attention_q(out, q, self.k_cache, self.v_cache, self.k_scale, self.v_scale, tables, seq_lens,
                              query_start, self.scale, self.kv_format, window=self.window)


# (sequences as (query rows, keys), H, Hkv, d, dv, block_size, window)
PAGED_Q = {
    ODD: {"block 1 MHA": ([(3, 9), (1, 5)], 3, 3, 32, 32, 1, 0),
          "block 3 GQA 6 d3 dv5": ([(4, 6), (2, 11)], 6, 1, 3, 5, 3, 0)},
    CONTIGUOUS: {"decode batch": ([(1, 1), (1, 17), (1, 130), (1, 600)], 6, 2, 64, 64, 16, 0),
                 "prefill and decode, an empty sequence": ([(5, 5), (1, 40), (17, 80), (0, 0)], 4, 2, 64, 64, 16, 0),
                 "dv != d, block 64": ([(9, 130), (1, 64)], 4, 2, 32, 48, 64, 0),
                 "sliding window 7": ([(1, 40), (12, 30), (5, 5)], 4, 2, 32, 32, 8, 7)},
}


def _paged(kv_format, spec, ctx: Ctx) -> None:
    seqs, H, Hkv, d, dv, bs, window = spec
    paged = PagedQ(ctx, kv_format, seqs, H, Hkv, d, dv, bs, lead=2, tail=3, window=window)
    close(paged.run().numpy(), paged.expected(), ctx.dtype, TOLERANCE[ctx.dtype], "out (0 outside the sequences)")


def _paged_alone(kv_format, ctx: Ctx) -> None:
    """Each sequence computed alone gives, bit for bit, its rows of the batched call."""
    paged = PagedQ(ctx, kv_format, [(1, 70), (7, 70), (1, 3), (12, 40)], 4, 2, 32, 32, 16, lead=1)
    batched = paged.run().numpy()
    for s, (L, _) in enumerate(paged.seqs):
        a, b = int(paged.query_start[s]), int(paged.query_start[s + 1])
        alone = paged.run(q=paged.q[a:b], query_start=np.array([0, L], np.int32), seq_lens=paged.seq_lens[s:s + 1],
                          tables=paged.tables[s:s + 1])
        identical(alone.numpy(), batched[a:b], f"sequence {s} alone vs in the batch")


def _paged_in_place(kv_format, ctx: Ctx) -> None:
    paged = PagedQ(ctx, kv_format, [(3, 20), (1, 9)], 4, 2, 16, 16, 4)
    q = ctx.upload(paged.q)
    paged.run(q=q, out=q)
    close(q.numpy(), paged.expected(), ctx.dtype, TOLERANCE[ctx.dtype], "out (= q)")


def _paged_bad_table(ctx: Ctx) -> None:
    """A block id past the pool is refused by the kernel (it checks the data it reads), never read."""
    paged = PagedQ(ctx, "int8", [(1, 9)], 2, 1, 8, 8, 4)
    tables = paged.tables.copy()
    tables[0, 1] = 1000

    def call():
        paged.run(tables=tables)
        synchronize(ctx.device)
    refused(call)


def _paged_overlap(ctx: Ctx) -> None:
    """out one row past q in the same buffer: neither q itself nor apart."""
    paged = PagedQ(ctx, "int8", [(2, 4)], 2, 1, 4, 4, 4)
    buf = ctx.upload(np.zeros((paged.T + 1, 2, 4), ctx.dtype.numpy))
    refused(lambda: paged.run(q=buf.slice(0, 0, paged.T), out=buf.slice(0, 1, paged.T + 1)), "overlap")


# ---- paged_kv_write_q: token t quantized to row slot_mapping[t]; a negative slot skips it --------------------

def _rows(ctx: Ctx, shape) -> np.ndarray:
    """Rows of different magnitudes, one all zeros, one with ties (exact multiples of half a step)."""
    x = ctx.rng.standard_normal(shape) * ctx.rng.uniform(0.01, 8.0, (*shape[:-1], 1))
    x[0, 0] = 0.0
    if shape[-1] >= 4:
        x[-1, -1] = np.arange(shape[-1]) - shape[-1] / 2 + 0.5  # amax = a whole number of half steps
    return x.astype(ctx.dtype.numpy)


def _kv_write(kv_format, d, dv, ctx: Ctx) -> None:
    num_blocks, bs, Hkv = 5, 4, 2
    before = [ctx.rng.integers(0, 256, (num_blocks, bs, Hkv, n), dtype=np.uint8) for n in (d, dv)]
    before_scales = [ctx.rng.standard_normal((num_blocks, bs, Hkv)).astype(np.float16) for _ in range(2)]
    caches = [ctx.upload(c) for c in before]
    scales = [ctx.upload(s) for s in before_scales]
    k, v = _rows(ctx, (4, Hkv, d)), _rows(ctx, (4, Hkv, dv))
    slots = [7, -1, 19, 0]  # block 1 row 3, skipped, block 4 row 3, block 0 row 0
    ops.paged_kv_write_q(caches[0], caches[1], scales[0], scales[1], ctx.upload(k), ctx.upload(v),
                         ctx.upload(np.array(slots)), kv_format)
    for name, cache, scale, old, old_scale, new in (("k", caches[0], scales[0], before[0], before_scales[0], k),
                                                    ("v", caches[1], scales[1], before[1], before_scales[1], v)):
        data, sc = ops.quantize_kv(new.astype(np.float32), kv_format)
        want = old.reshape(num_blocks * bs, *old.shape[2:]).copy()
        want_scale = old_scale.reshape(num_blocks * bs, Hkv).copy()
        for t, slot in enumerate(slots):
            if slot >= 0:
                want[slot], want_scale[slot] = data[t], sc[t]
        identical(cache.numpy().reshape(want.shape), want, f"{name}_cache")
        identical(scale.numpy().reshape(want_scale.shape), want_scale, f"{name}_scale")


def _kv_write_past_the_end(ctx: Ctx) -> None:
    """A slot past the cache is an error, and nothing is written (backend.h: checked before anything is)."""
    caches = [ctx.upload(np.full((2, 4, 1, 8), 7, np.uint8)) for _ in range(2)]
    scales = [ctx.upload(np.ones((2, 4, 1), np.float16)) for _ in range(2)]
    k, _ = ctx.normal((2, 1, 8))

    def call():
        ops.paged_kv_write_q(caches[0], caches[1], scales[0], scales[1], k, k, ctx.upload(np.array([1, 8])), "int8")
        synchronize(ctx.device)
    refused(call, "8")
    for name, t, value in (("k_cache", caches[0], 7), ("v_cache", caches[1], 7), ("k_scale", scales[0], 1.0)):
        identical(t.numpy(), np.full(t.shape, value, t.numpy().dtype), f"{name} after the refused write")


def _kv_write_bad_format(ctx: Ctx) -> None:
    caches = [ctx.upload(np.zeros((2, 4, 1, 8), np.uint8)) for _ in range(2)]
    scales = [ctx.upload(np.zeros((2, 4, 1), np.float16)) for _ in range(2)]
    k, _ = ctx.normal((2, 1, 8))
    refused(lambda: ops.paged_kv_write_q(caches[0], caches[1], scales[0], scales[1], k, k, ctx.upload(np.array([0, 1])),
                                         "fp4"),
            "kv_format", "int8", "fp8")


def _kv_write_overlap(ctx: Ctx) -> None:
    k_cache = ctx.upload(np.zeros((2, 4, 1, 8), np.uint8))
    v_cache = ctx.upload(np.zeros((2, 4, 1, 8), np.uint8))
    k_scale = ctx.upload(np.zeros((2, 4, 1), np.float16))
    v_scale = k_scale.view(8).slice(0, 0, 8).view(2, 4, 1)  # the same memory as k_scale
    k, _ = ctx.normal((2, 1, 8))
    refused(lambda: ops.paged_kv_write_q(k_cache, v_cache, k_scale, v_scale, k, k, ctx.upload(np.array([5, 6])),
                                         "int8"), "overlap")


def cases() -> list[Case]:
    out: list[Case] = []
    for dtype in FLOATS:
        for fmt in FORMATS:
            for layout, specs in PAGED_Q.items():
                out += [Case("paged_attention_q", dtype, layout, f"{fmt} {name}", partial(_paged, fmt, spec))
                        for name, spec in specs.items()]
            out += [Case("paged_attention_q", dtype, BATCH, f"{fmt} each sequence alone", partial(_paged_alone, fmt)),
                    Case("paged_attention_q", dtype, IN_PLACE, f"{fmt} out is q", partial(_paged_in_place, fmt)),
                    Case("paged_kv_write_q", dtype, CONTIGUOUS, f"{fmt} 4 tokens, one skipped",
                         partial(_kv_write, fmt, 64, 64)),
                    Case("paged_kv_write_q", dtype, ODD, f"{fmt} d 5 dv 3", partial(_kv_write, fmt, 5, 3))]
    out += [Case("paged_attention_q", float32, PROPERTY, "block id past the pool", _paged_bad_table),
            Case("paged_attention_q", float32, ALIASING, "out overlaps q by all but a row", _paged_overlap),
            Case("paged_kv_write_q", float32, PROPERTY, "slot past the end writes nothing", _kv_write_past_the_end),
            Case("paged_kv_write_q", float32, PROPERTY, "an unknown kv_format", _kv_write_bad_format),
            Case("paged_kv_write_q", float32, ALIASING, "v_scale is k_scale", _kv_write_overlap)]
    return out


def _perf_paged(ctx: Ctx):
    paged = PagedQ(ctx, "int8", [(1, 512)] * 8, 12, 2, 128, 128, 16)
    q = ctx.upload(paged.q)
    tables, seq_lens, starts = (ctx.upload(a) for a in (paged.tables, paged.seq_lens, paged.query_start))
    out = ctx.nan((paged.T, 12, 128))
    return lambda: ops.paged_attention_q(out, q, paged.k_cache, paged.v_cache, paged.k_scale, paged.v_scale, tables,
                                         seq_lens, starts, paged.scale, "int8")


def _perf_kv_write(ctx: Ctx):
    caches = [ctx.upload(np.zeros((64, 16, 2, 128), np.uint8)) for _ in range(2)]
    scales = [ctx.upload(np.zeros((64, 16, 2), np.float16)) for _ in range(2)]
    k, _ = ctx.normal((64, 2, 128))
    v, _ = ctx.normal((64, 2, 128))
    slots = ctx.upload(ctx.rng.permutation(1024)[:64].astype(np.int64))
    return lambda: ops.paged_kv_write_q(caches[0], caches[1], scales[0], scales[1], k, v, slots, "int8")


PERF = {"paged_attention_q": ("int8, 8 decodes of 512 keys, H12 Hkv2 d128", _perf_paged),
        "paged_kv_write_q": ("int8, 64 tokens, Hkv2 d128", _perf_kv_write)}
