"""lora_shrink and lora_expand: batched LoRA adapters (Punica's SGMV), each row with its own adapter slot or none.

The references are float64: h = scales[s] * x @ a[s].T (0 where s = -1), judged as f32 (the kernel's sum and h are
f32 whatever the inputs); out + h @ b[s] rounded once to out's dtype, rows without an adapter bit for bit as they
were.
"""

from __future__ import annotations

from functools import partial

import numpy as np

from ... import ops
from ...dtype import bfloat16, float16, float32
from ...stream import synchronize
from ..case import ALIASING, BATCH, CONTIGUOUS, ODD, PROPERTY, Case, Ctx
from ..compare import TOLERANCE, CaseFailed, close, identical, refused

FLOATS = (float32, float16, bfloat16)


def segments(ctx: Ctx, m: int, s: int) -> np.ndarray:
    """adapters int64 [m]: runs of 1..4 rows sharing a slot in [-1, s) (-1: no adapter)."""
    out: list[int] = []
    while len(out) < m:
        out += [int(ctx.rng.integers(-1, s))] * int(ctx.rng.integers(1, 5))
    return np.array(out[:m], np.int64)


class Lora:
    """S stacked adapters of a random rank <= R (zero-padded), x, h and out on the device, with float64 copies."""

    def __init__(self, ctx: Ctx, m: int, k: int, r: int, n: int, s: int, adapters=None):
        self.ctx, self.m, self.r, self.n = ctx, m, r, n
        a, b = ctx.rng.standard_normal((s, r, k)) / np.sqrt(max(k, 1)), ctx.rng.standard_normal((s, r, n)) / np.sqrt(r)
        for i in range(s):
            rank = int(ctx.rng.integers(1, r + 1))
            a[i, rank:], b[i, rank:] = 0, 0
        self.a64, self.b64 = (v.astype(ctx.dtype.numpy).astype(np.float64) for v in (a, b))
        self.a, self.b = ctx.upload(a.astype(ctx.dtype.numpy)), ctx.upload(b.astype(ctx.dtype.numpy))
        self.scales_host = (ctx.rng.uniform(0.25, 2.0, s) * ctx.rng.choice([-1.0, 1.0], s)).astype(np.float32)
        self.scales = ctx.upload(self.scales_host)
        self.x, self.x64 = ctx.normal((m, k))
        self.h_host = ctx.rng.standard_normal((m, r)).astype(np.float32)
        self.out_host = ctx.rng.standard_normal((m, n)).astype(ctx.dtype.numpy)
        self.adapters = segments(ctx, m, s) if adapters is None else np.asarray(adapters, np.int64)

    def shrink(self, rows=None) -> np.ndarray:
        rows = np.arange(self.m) if rows is None else rows
        h = self.ctx.nan((len(rows), self.r), float32)
        x = self.ctx.upload(self.x64[rows].astype(self.ctx.dtype.numpy))
        ops.lora_shrink(h, x, self.a, self.ctx.upload(self.adapters[rows]), self.scales)
        return h.numpy()

    def expand(self, rows=None) -> np.ndarray:
        rows = np.arange(self.m) if rows is None else rows
        out = self.ctx.upload(self.out_host[rows])
        ops.lora_expand(out, self.ctx.upload(self.h_host[rows]), self.b, self.ctx.upload(self.adapters[rows]))
        return out.numpy()

    def shrink_expected(self) -> np.ndarray:
        h = np.zeros((self.m, self.r))
        for i, s in enumerate(self.adapters):
            if s >= 0:
                h[i] = float(self.scales_host[s]) * (self.a64[s] @ self.x64[i])
        return h

    def expand_expected(self) -> np.ndarray:
        out = self.out_host.astype(np.float64)
        for i, s in enumerate(self.adapters):
            if s >= 0:
                out[i] += self.h_host[i].astype(np.float64) @ self.b64[s]
        return out


def _shrink(m, k, r, s, ctx: Ctx) -> None:
    case = Lora(ctx, m, k, r, 1, s)
    close(case.shrink(), case.shrink_expected(), float32, TOLERANCE[float32], "h")


def _expand(m, r, n, s, ctx: Ctx) -> None:
    case = Lora(ctx, m, 1, r, n, s)
    got = case.expand()
    close(got, case.expand_expected(), ctx.dtype, TOLERANCE[ctx.dtype])
    idle = case.adapters < 0
    identical(got[idle], case.out_host[idle], "out's rows without an adapter")


def _batch(op: str, ctx: Ctx) -> None:
    """Rows alone, and windows of rows, are the same bits as inside a batch of 19 with mixed segments."""
    case = Lora(ctx, 19, 320, 16, 272, 3)
    run = case.shrink if op == "lora_shrink" else case.expand
    batched = run()
    for start, count in ((0, 1), (5, 1), (18, 1), (2, 4), (7, 9), (0, 18)):
        rows = np.arange(start, start + count)
        identical(run(rows), batched[rows], f"rows [{start}, {start + count}) computed alone vs in a batch of 19")


def _untouched(ctx: Ctx) -> None:
    """Rows without an adapter: expand leaves out as it was (bits), shrink writes +0 there."""
    case = Lora(ctx, 5, 32, 8, 24, 2, adapters=[-1, 0, -1, 1, -1])
    got = case.expand()
    identical(got[[0, 2, 4]], case.out_host[[0, 2, 4]], "out's rows without an adapter")
    h = case.shrink()
    if h[[0, 2, 4]].view(np.uint32).any():
        raise CaseFailed(f"h's rows without an adapter are {h[[0, 2, 4]].tolist()}, expected +0")


def _out_of_range(op: str, ctx: Ctx) -> None:
    case = Lora(ctx, 4, 32, 8, 24, 2, adapters=[0, 1, 2, -1])

    def call():
        if op == "lora_shrink":
            case.shrink()
        else:
            case.expand()
        synchronize(ctx.device)
    refused(call, "adapters[2] = 2")


def _shrink_overlap(ctx: Ctx) -> None:
    case = Lora(ctx, 2, 16, 4, 8, 2, adapters=[0, 1])
    buffer = ctx.nan((2 * 4 + 2 - 1,), float32)
    h, scales = buffer.slice(0, 0, 8).view(2, 4), buffer.slice(0, 7, 9)
    refused(lambda: ops.lora_shrink(h, case.x, case.a, ctx.upload(case.adapters), scales), "overlap")


def _expand_overlap(ctx: Ctx) -> None:
    case = Lora(ctx, 2, 16, 4, 2, 2, adapters=[0, 1])
    buffer = ctx.nan((2 * 2 + 2 * 4 * 2 - 1,))
    out, b = buffer.slice(0, 0, 4).view(2, 2), buffer.slice(0, 3, 3 + 16).view(2, 4, 2)
    refused(lambda: ops.lora_expand(out, ctx.upload(case.h_host), b, ctx.upload(case.adapters)), "overlap")


# (M, K, R, S) of shrink and (M, R, N, S) of expand
SHRINK_SHAPES = {ODD: [(1, 1, 1, 1), (3, 7, 8, 2), (17, 1536, 64, 4), (17, 65, 16, 3)],
                 CONTIGUOUS: [(8, 256, 16, 2), (32, 1536, 8, 4)]}
EXPAND_SHAPES = {ODD: [(1, 1, 1, 1), (3, 8, 5, 2), (17, 64, 1536, 4), (17, 16, 257, 3)],
                 CONTIGUOUS: [(8, 16, 256, 2), (32, 8, 1536, 4)]}


def cases() -> list[Case]:
    out: list[Case] = []
    for dtype in FLOATS:
        for layout, shapes in SHRINK_SHAPES.items():
            for m, k, r, s in shapes:
                out.append(Case("lora_shrink", dtype, layout, f"M={m} K={k} R={r} S={s}",
                                partial(_shrink, m, k, r, s)))
        for layout, shapes in EXPAND_SHAPES.items():
            for m, r, n, s in shapes:
                out.append(Case("lora_expand", dtype, layout, f"M={m} R={r} N={n} S={s}",
                                partial(_expand, m, r, n, s)))
        for op in ("lora_shrink", "lora_expand"):
            out.append(Case(op, dtype, BATCH, "19 rows mixed adapters alone", partial(_batch, op)))
    out += [Case("lora_expand", float32, PROPERTY, "rows without an adapter untouched", _untouched)]
    out += [Case(op, float32, PROPERTY, "adapter out of range is refused", partial(_out_of_range, op))
            for op in ("lora_shrink", "lora_expand")]
    out += [Case("lora_shrink", float32, ALIASING, "h overlaps scales", _shrink_overlap),
            Case("lora_expand", float32, ALIASING, "out overlaps b", _expand_overlap)]
    return out


def _perf_shrink(ctx: Ctx):
    case = Lora(ctx, 8, 1536, 16, 1, 4)
    h, adapters = ctx.nan((8, 16), float32), ctx.upload(case.adapters)
    return lambda: ops.lora_shrink(h, case.x, case.a, adapters, case.scales)


def _perf_expand(ctx: Ctx):
    case = Lora(ctx, 8, 1, 16, 8960, 4)
    out, h, adapters = ctx.upload(case.out_host), ctx.upload(case.h_host), ctx.upload(case.adapters)
    return lambda: ops.lora_expand(out, h, case.b, adapters)


PERF = {"lora_shrink": ("8x1536 R=16 S=4", _perf_shrink), "lora_expand": ("8x8960 R=16 S=4", _perf_expand)}
