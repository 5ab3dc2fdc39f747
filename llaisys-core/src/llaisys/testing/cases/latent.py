"""paged_latent_attention: DeepSeek's MLA in its absorbed form, over a paged latent cache (c, the compressed keys
and values, and r, the rope key every head shares): paged_attention with one kv head whose key is (c, r) and
whose value is c."""

from __future__ import annotations

from functools import partial

import numpy as np

from ... import ops
from ...dtype import float32
from ...stream import synchronize
from ..case import ALIASING, BATCH, CONTIGUOUS, ODD, PROPERTY, Case, Ctx
from ..compare import TOLERANCE, close, identical, refused
from .attention import FLOATS, Paged, _first_rows


class Latent(Paged):
    """``Paged`` of one kv head with keys of dc + dr values, split into the latent caches c_cache [num_blocks,
    block_size, dc] and r_cache [num_blocks, block_size, dr]: the values are the keys' first dc values (unused
    rows NaN, blocks shuffled, lead / tail rows of no sequence, as there)."""

    def __init__(self, ctx: Ctx, seqs, H, dc, dr, block_size, lead=0, tail=0):
        super().__init__(ctx, seqs, H, 1, dc + dr, dc, block_size, lead=lead, tail=tail)
        cache = self.k_cache.numpy()[:, :, 0]
        self.c_cache, self.r_cache = ctx.upload(cache[..., :dc].copy()), ctx.upload(cache[..., dc:].copy())
        del self.k_cache, self.v_cache  # (the latent caches stand for them)
        self.values = [k[:, :, :dc] for k in self.keys]

    def _attend(self, out, q, tables, seq_lens, query_start) -> None:
        ops.paged_latent_attention(out, q, self.c_cache, self.r_cache, tables, seq_lens, query_start, self.scale)


# (sequences as (query rows, keys), H, dc, dr, block_size)
LATENT = {
    ODD: {"block 1 H3 dc17 dr3": ([(3, 9), (1, 5)], 3, 17, 3, 1),
          "block 3 H1 dc5 dr1": ([(4, 6), (2, 11)], 1, 5, 1, 3)},
    CONTIGUOUS: {"DeepSeek-V3 H16 dc512 dr64, decodes and a prompt": ([(1, 1), (1, 17), (5, 5), (1, 130)], 16, 512, 64,
                                                                      64),
                 "prefill and decode, an empty sequence": ([(5, 5), (1, 40), (17, 80), (0, 0), (3, 3)], 4, 64, 16,
                                                           16)},
}


def _latent(spec, ctx: Ctx) -> None:
    seqs, H, dc, dr, bs = spec
    latent = Latent(ctx, seqs, H, dc, dr, bs, lead=2, tail=3)
    close(latent.run().numpy(), latent.expected(), ctx.dtype, TOLERANCE[ctx.dtype], "out (0 outside the sequences)")


def _latent_alone(ctx: Ctx) -> None:
    """Each sequence computed alone gives, bit for bit, its rows of the batched call."""
    latent = Latent(ctx, [(1, 70), (7, 70), (1, 3), (12, 40)], 4, 64, 16, 16, lead=1)
    batched = latent.run().numpy()
    for s, (L, _) in enumerate(latent.seqs):
        a, b = int(latent.query_start[s]), int(latent.query_start[s + 1])
        alone = latent.run(q=latent.q[a:b], query_start=np.array([0, L], np.int32),
                           seq_lens=latent.seq_lens[s:s + 1], tables=latent.tables[s:s + 1])
        identical(alone.numpy(), batched[a:b], f"sequence {s} alone vs in the batch")


def _latent_bad_table(ctx: Ctx) -> None:
    """A block id past the pool is refused by the kernel (it checks the data it reads), never read."""
    latent = Latent(ctx, [(1, 9)], 2, 8, 4, 4)
    tables = latent.tables.copy()
    tables[0, 1] = 1000

    def call():
        latent.run(tables=tables)
        synchronize(ctx.device)
    refused(call, "1000")


def _latent_overlap(ctx: Ctx) -> None:
    latent = Latent(ctx, [(2, 4)], 2, 4, 2, 4)
    refused(lambda: latent.run(out=_first_rows(latent.c_cache, (2, 2, 4))), "overlap", "c_cache")
    q = ctx.upload(latent.q)
    refused(lambda: latent.run(q=q, out=_first_rows(q, (2, 2, 4))), "overlap", "q")


def cases() -> list[Case]:
    out: list[Case] = []
    for dtype in FLOATS:
        for layout, specs in LATENT.items():
            out += [Case("paged_latent_attention", dtype, layout, name, partial(_latent, spec))
                    for name, spec in specs.items()]
        out.append(Case("paged_latent_attention", dtype, BATCH, "each sequence alone", _latent_alone))
    out += [Case("paged_latent_attention", float32, PROPERTY, "block id past the pool", _latent_bad_table),
            Case("paged_latent_attention", float32, ALIASING, "out overlaps c_cache or q", _latent_overlap)]
    return out


def _perf_latent(ctx: Ctx):
    latent = Latent(ctx, [(1, 512)] * 8, 16, 512, 64, 64)
    q = ctx.upload(latent.q)
    tables, seq_lens, starts = (ctx.upload(a) for a in (latent.tables, latent.seq_lens, latent.query_start))
    out = ctx.nan((latent.T, 16, 512))
    return lambda: ops.paged_latent_attention(out, q, latent.c_cache, latent.r_cache, tables, seq_lens, starts,
                                              latent.scale)


PERF = {"paged_latent_attention": ("8 decodes of 512 keys, H16 dc512 dr64 (DeepSeek-V3)", _perf_latent)}
