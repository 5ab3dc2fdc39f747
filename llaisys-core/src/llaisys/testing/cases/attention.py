"""paged_attention and paged_kv_write: a batch of sequences over a paged KV cache (continuous batching)."""

from __future__ import annotations

import math
from functools import partial

import numpy as np

from ... import ops
from ...dtype import bfloat16, float16, float32
from ...stream import synchronize
from ..case import ALIASING, BATCH, CONTIGUOUS, IN_PLACE, ODD, PROPERTY, Case, Ctx
from ..compare import TOLERANCE, close, identical, refused
from ..references import attention

FLOATS = (float32, float16, bfloat16)


class Paged:
    """A random batch in a paged cache: sequences of (query rows L, keys S), their blocks in a shuffled order,
    unused cache rows NaN (a read of a wrong row shows), ``lead`` / ``tail`` query rows outside every sequence
    (their output must be 0)."""

    def __init__(self, ctx: Ctx, seqs, H, Hkv, d, dv, block_size, lead=0, tail=0, spare_blocks=3, window=0):
        self.ctx, self.seqs, self.H, self.dv, self.window = ctx, seqs, H, dv, window
        counts = [-(-S // block_size) for _, S in seqs]
        num_blocks = sum(counts) + spare_blocks
        order = list(ctx.rng.permutation(num_blocks))
        dtype = ctx.dtype.numpy
        k_cache = np.full((num_blocks, block_size, Hkv, d), np.nan, dtype)
        v_cache = np.full((num_blocks, block_size, Hkv, dv), np.nan, dtype)
        self.tables = np.zeros((len(seqs), max(counts + [1])), np.int32)
        self.keys, self.values, starts = [], [], [lead]
        for s, ((L, S), n) in enumerate(zip(seqs, counts)):
            blocks, order = order[:n], order[n:]
            self.tables[s, :n] = blocks
            k = ctx.rng.standard_normal((S, Hkv, d)).astype(dtype)
            v = ctx.rng.standard_normal((S, Hkv, dv)).astype(dtype)
            for j in range(S):
                k_cache[blocks[j // block_size], j % block_size] = k[j]
                v_cache[blocks[j // block_size], j % block_size] = v[j]
            self.keys.append(k.astype(np.float64))
            self.values.append(v.astype(np.float64))
            starts.append(starts[-1] + L)
        self.query_start = np.array(starts, np.int32)
        self.seq_lens = np.array([S for _, S in seqs], np.int32)
        self.T = starts[-1] + tail
        self.q = ctx.rng.standard_normal((self.T, H, d)).astype(dtype)
        self.k_cache, self.v_cache = ctx.upload(k_cache), ctx.upload(v_cache)
        self.scale = 1.0 / math.sqrt(d)

    def run(self, q=None, query_start=None, seq_lens=None, tables=None, out=None):
        ctx = self.ctx
        q = self.q if q is None else q
        q = ctx.upload(q) if isinstance(q, np.ndarray) else q
        out = ctx.nan((q.shape[0], self.H, self.dv)) if out is None else out
        self._attend(out, q, ctx.upload(self.tables if tables is None else tables),
                     ctx.upload(self.seq_lens if seq_lens is None else seq_lens),
                     ctx.upload(self.query_start if query_start is None else query_start))
        return out

    def _attend(self, out, q, tables, seq_lens, query_start) -> None:
        ops.paged_attention(out, q, self.k_cache, self.v_cache, tables, seq_lens, query_start, self.scale,
                            window=self.window)

    def expected(self) -> np.ndarray:
        out = np.zeros((self.T, self.H, self.dv))
        for s, (L, _) in enumerate(self.seqs):
            if L:
                a, b = int(self.query_start[s]), int(self.query_start[s + 1])
                out[a:b] = attention(self.q[a:b].astype(np.float64), self.keys[s], self.values[s], self.scale,
                                     self.window)
        return out


# (sequences as (query rows, keys), H, Hkv, d, dv, block_size, window)
PAGED = {
    ODD: {"block 1 MHA": ([(3, 9), (1, 5)], 3, 3, 32, 32, 1, 0),
          "block 3 GQA 6 d3 dv5": ([(4, 6), (2, 11)], 6, 1, 3, 5, 3, 0)},
    CONTIGUOUS: {"decode batch": ([(1, 1), (1, 17), (1, 130), (1, 300)], 6, 2, 32, 32, 16, 0),
                 "prefill and decode, an empty sequence": ([(5, 5), (1, 40), (17, 80), (0, 0), (3, 3)], 4, 2, 64, 64,
                                                           16, 0),
                 "dv != d, block 64": ([(9, 130), (1, 64)], 4, 2, 32, 48, 64, 0),
                 "sliding window 7": ([(1, 40), (12, 30), (5, 5)], 4, 2, 32, 32, 8, 7)},
}


def _paged(spec, ctx: Ctx) -> None:
    seqs, H, Hkv, d, dv, bs, window = spec
    paged = Paged(ctx, seqs, H, Hkv, d, dv, bs, lead=2, tail=3, window=window)
    close(paged.run().numpy(), paged.expected(), ctx.dtype, TOLERANCE[ctx.dtype], "out (0 outside the sequences)")


def _paged_alone(ctx: Ctx) -> None:
    """Each sequence computed alone gives, bit for bit, its rows of the batched call."""
    paged = Paged(ctx, [(1, 70), (7, 70), (1, 3), (12, 40)], 4, 2, 32, 32, 16, lead=1)
    batched = paged.run().numpy()
    for s, (L, _) in enumerate(paged.seqs):
        a, b = int(paged.query_start[s]), int(paged.query_start[s + 1])
        alone = paged.run(q=paged.q[a:b], query_start=np.array([0, L], np.int32), seq_lens=paged.seq_lens[s:s + 1],
                          tables=paged.tables[s:s + 1])
        identical(alone.numpy(), batched[a:b], f"sequence {s} alone vs in the batch")


def _paged_in_place(ctx: Ctx) -> None:
    paged = Paged(ctx, [(3, 20), (1, 9)], 4, 2, 16, 16, 4)
    q = ctx.upload(paged.q)
    paged.run(q=q, out=q)
    close(q.numpy(), paged.expected(), ctx.dtype, TOLERANCE[ctx.dtype], "out (= q)")


def _paged_bad_table(ctx: Ctx) -> None:
    """A block id past the pool is refused by the kernel (it checks the data it reads), never read."""
    paged = Paged(ctx, [(1, 9)], 2, 1, 8, 8, 4)
    tables = paged.tables.copy()
    tables[0, 1] = 1000

    def call():
        paged.run(tables=tables)
        synchronize(ctx.device)
    refused(call)


def _paged_overlap(ctx: Ctx) -> None:
    paged = Paged(ctx, [(2, 4)], 2, 1, 4, 4, 4)
    refused(lambda: paged.run(out=_first_rows(paged.k_cache, (2, 2, 4))), "overlap")


def _first_rows(t, shape):
    """A view of t's first elements as ``shape`` (to make an output that overlaps t)."""
    n = math.prod(shape)
    return t.view(t.numel()).slice(0, 0, n).view(*shape)


# ---- paged_kv_write: token t to row slot_mapping[t] of the caches; a negative slot skips it -------------------

def _kv_write(ctx: Ctx) -> None:
    k_cache, rk_cache = ctx.normal((5, 4, 2, 8))
    v_cache, rv_cache = ctx.normal((5, 4, 2, 3))
    k, rk = ctx.normal((4, 2, 8))
    v, rv = ctx.normal((4, 2, 3))
    slots = [7, -1, 19, 0]  # block 1 row 3, skipped, block 4 row 3, block 0 row 0
    ops.paged_kv_write(k_cache, v_cache, k, v, ctx.upload(np.array(slots)))
    for name, cache, before, new in (("k_cache", k_cache, rk_cache, rk), ("v_cache", v_cache, rv_cache, rv)):
        want = before.reshape(20, *before.shape[2:]).copy()
        for t, slot in enumerate(slots):
            if slot >= 0:
                want[slot] = new[t]
        identical(cache.numpy().reshape(want.shape), want.astype(ctx.dtype.numpy), name)


def _kv_write_past_the_end(ctx: Ctx) -> None:
    """A slot past the cache is an error, and nothing is written (backend.h: checked before anything is)."""
    k_cache, rk_cache = ctx.normal((2, 4, 1, 8))
    v_cache, rv_cache = ctx.normal((2, 4, 1, 8))
    k, _ = ctx.normal((2, 1, 8))

    def call():
        ops.paged_kv_write(k_cache, v_cache, k, k, ctx.upload(np.array([1, 8])))
        synchronize(ctx.device)
    refused(call, "8")
    identical(k_cache.numpy(), rk_cache.astype(ctx.dtype.numpy), "k_cache after the refused write")
    identical(v_cache.numpy(), rv_cache.astype(ctx.dtype.numpy), "v_cache after the refused write")


def _kv_write_overlap(ctx: Ctx) -> None:
    k_cache, _ = ctx.normal((2, 4, 1, 8))
    v_cache, _ = ctx.normal((2, 4, 1, 8))
    k = _first_rows(k_cache, (2, 1, 8))
    refused(lambda: ops.paged_kv_write(k_cache, v_cache, k, k, ctx.upload(np.array([5, 6]))), "overlap")


def cases() -> list[Case]:
    out: list[Case] = []
    for dtype in FLOATS:
        for layout, specs in PAGED.items():
            out += [Case("paged_attention", dtype, layout, name, partial(_paged, spec)) for name, spec in specs.items()]
        out += [Case("paged_attention", dtype, BATCH, "each sequence alone", _paged_alone),
                Case("paged_attention", dtype, IN_PLACE, "out is q", _paged_in_place),
                Case("paged_kv_write", dtype, CONTIGUOUS, "4 tokens, one skipped", _kv_write),
                Case("paged_kv_write", dtype, PROPERTY, "slot past the end writes nothing", _kv_write_past_the_end)]
    out += [Case("paged_attention", float32, PROPERTY, "block id past the pool", _paged_bad_table),
            Case("paged_attention", float32, ALIASING, "out overlaps k_cache", _paged_overlap),
            Case("paged_kv_write", float32, ALIASING, "k_cache overlaps k", _kv_write_overlap)]
    return out


def _perf_paged(ctx: Ctx):
    paged = Paged(ctx, [(1, 512)] * 8, 12, 2, 128, 128, 16)
    q = ctx.upload(paged.q)
    tables, seq_lens, starts = (ctx.upload(a) for a in (paged.tables, paged.seq_lens, paged.query_start))
    out = ctx.nan((paged.T, 12, 128))
    return lambda: ops.paged_attention(out, q, paged.k_cache, paged.v_cache, tables, seq_lens, starts, paged.scale)


def _perf_kv_write(ctx: Ctx):
    k_cache, _ = ctx.normal((64, 16, 2, 128))
    v_cache, _ = ctx.normal((64, 16, 2, 128))
    k, _ = ctx.normal((64, 2, 128))
    v, _ = ctx.normal((64, 2, 128))
    slots = ctx.upload(ctx.rng.permutation(1024)[:64].astype(np.int64))
    return lambda: ops.paged_kv_write(k_cache, v_cache, k, v, slots)


PERF = {"paged_attention": ("8 decodes of 512 keys, H12 Hkv2 d128", _perf_paged),
        "paged_kv_write": ("64 tokens, Hkv2 d128", _perf_kv_write)}
