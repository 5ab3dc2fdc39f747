"""embedding, linear, rms_norm, rope and self_attention: the layers of a transformer block."""

from __future__ import annotations

import math
from functools import partial

import numpy as np

from ... import ops
from ...dtype import bfloat16, float16, float32
from ...stream import synchronize
from ..case import ALIASING, BATCH, CONTIGUOUS, IN_PLACE, ODD, PROPERTY, Case, Ctx
from ..compare import ROPE_TOLERANCE, TOLERANCE, close, identical, refused, rounded
from ..references import attention, rms_norm, rope, rope_angles

FLOATS = (float32, float16, bfloat16)


# ---- embedding: a row copy, bit for bit; an index out of range is an error, never a wild read ---------------

def _embedding(n: int, vocab: int, dim: int, ctx: Ctx) -> None:
    weight = ctx.rng.standard_normal((vocab, dim)).astype(ctx.dtype.numpy)
    index = ctx.rng.integers(0, vocab, n)
    if n >= 2:
        index[0], index[-1] = 0, vocab - 1  # the first and the last rows
    out = ctx.nan((n, dim))
    ops.embedding(out, ctx.upload(index), ctx.upload(weight))
    identical(out.numpy(), weight[index])


def _embedding_out_of_range(ctx: Ctx) -> None:
    weight = ctx.upload(ctx.rng.standard_normal((10, 4)).astype(ctx.dtype.numpy))
    index = ctx.upload(np.array([1, 2, 10, 4]))
    out = ctx.nan((4, 4))

    def call():
        ops.embedding(out, index, weight)
        synchronize(ctx.device)  # an asynchronous backend reports what its kernel found at the next sync
    refused(call, "10")


def _embedding_overlap(ctx: Ctx) -> None:
    weight, _ = ctx.normal((6, 4))
    refused(lambda: ops.embedding(weight.slice(0, 2, 4), ctx.upload(np.array([0, 5])), weight), "overlap")


# ---- linear: out = x @ weight.T + bias --------------------------------------------------------------------

def _linear_inputs(ctx: Ctx, m: int, n: int, k: int, bias: bool):
    # x ~ N(0, 1/K), weight ~ N(0, 1): outputs O(1) whatever K
    x, rx = ctx.normal((m, k), k ** -0.5 if k else 1.0)
    w, rw = ctx.normal((n, k))
    b, rb = ctx.normal((n,)) if bias else (None, np.zeros(n))
    return x, rx, w, rw, b, rb


def _linear(m: int, n: int, k: int, bias: bool, ctx: Ctx) -> None:
    x, rx, w, rw, b, rb = _linear_inputs(ctx, m, n, k, bias)
    out = ctx.nan((m, n))
    ops.linear(out, x, w, b)
    close(out.numpy(), rx @ rw.T + rb, ctx.dtype, TOLERANCE[ctx.dtype])


def _linear_batch(ctx: Ctx) -> None:
    """Each row of out, bit for bit, whether x has 1, 2, 3, 5, 8 or 9 rows around it (batch invariance: a
    request's output does not depend on what else is in the batch)."""
    m, n, k = 13, 33, 300
    x, rx, w, _, b, _ = _linear_inputs(ctx, m, n, k, True)
    host_x = rx.astype(ctx.dtype.numpy)
    batched = ctx.nan((m, n))
    ops.linear(batched, x, w, b)
    everything = batched.numpy()
    for start, rows in ((0, 1), (5, 1), (12, 1), (0, 2), (1, 3), (3, 5), (4, 8), (2, 9)):
        alone = ctx.nan((rows, n))
        ops.linear(alone, ctx.upload(host_x[start:start + rows]), w, b)
        identical(alone.numpy(), everything[start:start + rows], f"rows [{start}, {start + rows}) computed alone "
                                                                 f"vs in a batch of {m}")


def _linear_overlap(ctx: Ctx) -> None:
    buffer, _ = ctx.normal((3 * 4 + 3 * 5,))
    x = buffer.slice(0, 0, 12).view(3, 4)
    out = buffer.slice(0, 11, 26).view(3, 5)  # shares x's last element
    w, _ = ctx.normal((5, 4))
    refused(lambda: ops.linear(out, x, w), "overlap")


# ---- rms_norm --------------------------------------------------------------------------------------------

def _rms_norm(shape, f32_weight: bool, numerics: str, in_place: bool, ctx: Ctx) -> None:
    x, rx = ctx.normal(shape, 2.0)
    w, rw = ctx.normal(shape[-1:], 0.5 if f32_weight else 1.0, float32 if f32_weight else None)
    out = x if in_place else ctx.nan(shape)
    ops.rms_norm(out, x, w, 1e-6, numerics)
    close(out.numpy(), rms_norm(rx, rw, 1e-6), ctx.dtype, TOLERANCE[ctx.dtype])


def _rms_norm_overlap(ctx: Ctx) -> None:
    buffer, _ = ctx.normal((12,))
    w, _ = ctx.normal((8,))
    out, x = buffer.slice(0, 0, 8).view(1, 8), buffer.slice(0, 4, 12).view(1, 8)
    refused(lambda: ops.rms_norm(out, x, w, 1e-6), "overlap")


# ---- rope: half-split layout, the f32 angle p * inv_freq[j] ------------------------------------------------

def _rope(shape, top: int, theta: float, scale: float, numerics: str, in_place: bool, ctx: Ctx) -> None:
    seq, heads, d = shape
    x, rx = ctx.normal(shape)
    pos = ctx.rng.integers(max(0, top - 64), top, seq)
    inv_freq = ops.rope_inv_freq(d, theta)
    out = x if in_place else ctx.nan(shape)
    table = ctx.upload(inv_freq) if scale != 1.0 else theta  # a number: core builds the plain table
    ops.rope(out, x, ctx.upload(pos), table, scale=scale, numerics=numerics)
    angles = rope_angles(pos, inv_freq)
    if numerics == "hf":  # HF: cos and sin rounded to the dtype, each product rounded, then the sum
        half = d // 2
        c = rounded(np.cos(angles) * scale, ctx.dtype)[:, None, :]
        s = rounded(np.sin(angles) * scale, ctx.dtype)[:, None, :]
        x1, x2 = rx[..., :half], rx[..., half:]
        r = lambda a: rounded(a, ctx.dtype)  # noqa: E731
        want = np.concatenate((r(x1 * c) - r(x2 * s), r(x2 * c) + r(x1 * s)), -1)
    else:
        want = rope(rx, angles) * scale
    close(out.numpy(), want, ctx.dtype, ROPE_TOLERANCE[ctx.dtype])


def _rope_overlap(ctx: Ctx) -> None:
    buffer, _ = ctx.normal((2 * 2 * 4 + 4,))
    x = buffer.slice(0, 0, 16).view(2, 2, 4)
    out = buffer.slice(0, 4, 20).view(2, 2, 4)
    refused(lambda: ops.rope(out, x, ctx.upload(np.array([0, 1])), 1e4), "overlap")


# ---- self_attention: causal GQA, mask aligned bottom-right -----------------------------------------------

def _attention(sizes, scale: float | None, in_place: str, ctx: Ctx) -> None:
    L, S, H, Hkv, d, dv = sizes
    scale = 1.0 / math.sqrt(d) if scale is None else scale
    q, rq = ctx.normal((L, H, d))
    k, rk = ctx.normal((S, Hkv, d))
    v, rv = ctx.normal((S, Hkv, dv))
    out = {"q": q, "v": v}.get(in_place) or ctx.nan((L, H, dv))
    ops.self_attention(out, q, k, v, scale)
    close(out.numpy(), attention(rq, rk, rv, scale), ctx.dtype, TOLERANCE[ctx.dtype])


def _attention_overlap(ctx: Ctx) -> None:
    buffer, _ = ctx.normal((24,))
    k, out = buffer.slice(0, 0, 12).view(3, 1, 4), buffer.slice(0, 8, 24).view(2, 2, 4)
    q, _ = ctx.normal((2, 2, 4))
    v, _ = ctx.normal((3, 1, 4))
    refused(lambda: ops.self_attention(out, q, k, v, 0.5), "overlap")


# (L, S, H, Hkv, d, dv)
ATTENTION = {
    ODD: [(1, 1, 1, 1, 32, 32), (3, 3, 3, 3, 17, 17), (4, 6, 2, 1, 3, 5)],
    CONTIGUOUS: [(1, 17, 4, 2, 64, 64), (5, 17, 6, 3, 32, 32), (7, 9, 4, 2, 32, 48), (17, 40, 12, 2, 64, 64),
                 (1, 300, 3, 3, 64, 64)],
}


def cases() -> list[Case]:
    out: list[Case] = []
    for dtype in FLOATS:
        out += [Case("embedding", dtype, ODD, f"{n} of {v}x{d}", partial(_embedding, n, v, d))
                for n, v, d in ((1, 1, 1), (3, 5, 3), (17, 100, 17))]
        out += [Case("embedding", dtype, CONTIGUOUS, "64 of 1000x1536", partial(_embedding, 64, 1000, 1536)),
                Case("embedding", dtype, PROPERTY, "index out of range", _embedding_out_of_range)]
        for layout, shapes in ((ODD, [(1, 1, 1), (1, 3, 17), (3, 17, 3), (17, 3, 33)]),
                               (CONTIGUOUS, [(8, 64, 300), (9, 33, 1536), (3, 17, 4097)])):
            out += [Case("linear", dtype, layout, f"{m}x{n}x{k}{' bias' if i % 2 == 0 else ''}",
                         partial(_linear, m, n, k, i % 2 == 0)) for i, (m, n, k) in enumerate(shapes)]
        out += [Case("linear", dtype, PROPERTY, "K=0 gives bias", partial(_linear, 3, 5, 0, True)),
                Case("linear", dtype, BATCH, "13x33x300 rows alone", _linear_batch)]
        out += [Case("rms_norm", dtype, ODD, "x".join(map(str, s)), partial(_rms_norm, s, False, "exact", False))
                for s in ((1, 1), (3, 3), (1, 17))]
        out += [Case("rms_norm", dtype, CONTIGUOUS, "x".join(map(str, s)), partial(_rms_norm, s, False, "exact", False))
                for s in ((2, 4097), (4, 1536), (2, 5, 64))]
        out += [Case("rms_norm", dtype, CONTIGUOUS, "numerics=hf 7x1536", partial(_rms_norm, (7, 1536), False, "hf", False)),
                Case("rms_norm", dtype, IN_PLACE, "out is x", partial(_rms_norm, (3, 65), False, "exact", True))]
        if dtype != float32:
            out.append(Case("rms_norm", dtype, CONTIGUOUS, "f32 weight 5x1536",
                            partial(_rms_norm, (5, 1536), True, "exact", False)))
        out += [Case("rope", dtype, ODD, "x".join(map(str, s)), partial(_rope, s, 64, 1e4, 1.0, "exact", False))
                for s in ((1, 1, 2), (3, 1, 6), (17, 3, 34))]
        out += [Case("rope", dtype, CONTIGUOUS, "33x2x128", partial(_rope, (33, 2, 128), 64, 1e6, 1.0, "exact", False)),
                Case("rope", dtype, CONTIGUOUS, "positions near 1e5 16x2x128",
                     partial(_rope, (16, 2, 128), 100064, 1e6, 1.0, "exact", False)),
                Case("rope", dtype, CONTIGUOUS, "table and scale 0.5 5x4x64",
                     partial(_rope, (5, 4, 64), 64, 1e4, 0.5, "exact", False)),
                Case("rope", dtype, IN_PLACE, "out is x 5x4x64", partial(_rope, (5, 4, 64), 64, 1e4, 1.0, "exact", True))]
        if dtype != float32:
            out.append(Case("rope", dtype, CONTIGUOUS, "numerics=hf 7x4x64",
                            partial(_rope, (7, 4, 64), 4096, 1e6, 1.0, "hf", False)))
        for layout, sizes in ATTENTION.items():
            out += [Case("self_attention", dtype, layout, "L{} S{} H{} Hkv{} d{} dv{}".format(*s),
                         partial(_attention, s, None, "")) for s in sizes]
        out += [Case("self_attention", dtype, PROPERTY, "scale 0", partial(_attention, (6, 20, 4, 2, 32, 32), 0.0, "")),
                Case("self_attention", dtype, PROPERTY, "scale -0.7", partial(_attention, (6, 20, 4, 2, 32, 32), -0.7, "")),
                Case("self_attention", dtype, IN_PLACE, "out is q", partial(_attention, (5, 9, 4, 2, 32, 32), None, "q")),
                Case("self_attention", dtype, IN_PLACE, "out is v", partial(_attention, (5, 5, 2, 2, 16, 16), None, "v"))]
    out += [Case("embedding", float32, ALIASING, "out overlaps weight", _embedding_overlap),
            Case("linear", float32, ALIASING, "out overlaps x", _linear_overlap),
            Case("rms_norm", float32, ALIASING, "out overlaps x", _rms_norm_overlap),
            Case("rope", float32, ALIASING, "out overlaps x", _rope_overlap),
            Case("self_attention", float32, ALIASING, "out overlaps k", _attention_overlap)]
    return out


def _perf_linear(ctx: Ctx):
    x, _, w, _, b, _ = _linear_inputs(ctx, 1, 8960, 1536, False)
    out = ctx.nan((1, 8960))
    return lambda: ops.linear(out, x, w, b)


def _perf_embedding(ctx: Ctx):
    weight, _ = ctx.normal((32000, 1536))
    index, out = ctx.upload(ctx.rng.integers(0, 32000, 64)), ctx.nan((64, 1536))
    return lambda: ops.embedding(out, index, weight)


def _perf_rms_norm(ctx: Ctx):
    x, _ = ctx.normal((64, 1536))
    w, _ = ctx.normal((1536,))
    out = ctx.nan((64, 1536))
    return lambda: ops.rms_norm(out, x, w, 1e-6)


def _perf_rope(ctx: Ctx):
    x, _ = ctx.normal((64, 12, 128))
    pos, out = ctx.upload(np.arange(64, dtype=np.int64)), ctx.nan((64, 12, 128))
    return lambda: ops.rope(out, x, pos, 1e6)


def _perf_attention(ctx: Ctx):
    q, _ = ctx.normal((1, 12, 128))
    k, _ = ctx.normal((512, 2, 128))
    v, _ = ctx.normal((512, 2, 128))
    out = ctx.nan((1, 12, 128))
    return lambda: ops.self_attention(out, q, k, v, 128 ** -0.5)


PERF = {"embedding": ("64 of 32000x1536", _perf_embedding), "linear": ("1x8960x1536", _perf_linear),
        "rms_norm": ("64x1536", _perf_rms_norm), "rope": ("64x12x128", _perf_rope),
        "self_attention": ("L1 S512 H12 Hkv2 d128", _perf_attention)}
