"""add, scale, swiglu, geglu_tanh and rearrange (the strided copy: the one op that takes any strides)."""

from __future__ import annotations

from functools import partial

import numpy as np

from ... import ops
from ...dtype import bfloat16, float16, float32, int8, int64
from ..case import ALIASING, CONTIGUOUS, IN_PLACE, ODD, PROPERTY, STRIDED, Case, Ctx
from ..compare import ADD_TOLERANCE, TOLERANCE, close, exact, identical, refused, rounded
from ..references import gelu_tanh, silu

FLOATS = (float32, float16, bfloat16)
ODD_SHAPES = ((1,), (3,), (17,))
SHAPES = ((2, 3, 5), (4097,), (7, 1536))


def dims(shape) -> str:
    return "x".join(map(str, shape))


# ---- add: one correctly rounded addition, so bit-exact against the exact sum rounded -----------------------

def _add(shape, ctx: Ctx) -> None:
    a, ra = ctx.normal(shape)
    b, rb = ctx.normal(shape, 3.0)
    c = ctx.nan(shape)
    ops.add(c, a, b)
    got = c.numpy()
    close(got, ra + rb, ctx.dtype, ADD_TOLERANCE[ctx.dtype], "c")  # (a gross error says so first)
    exact(got, ra + rb, ctx.dtype, "c")


def _add_special(ctx: Ctx) -> None:
    a = np.array([np.inf, -np.inf, np.nan, 0.0, -0.0, 1.0, 65504.0, -1e-3] * 3).astype(ctx.dtype.numpy)
    b = np.array([1.0, -1.0, 2.0, -0.0, -0.0, np.inf, 65504.0, 1e-3] * 3).astype(ctx.dtype.numpy)
    c = ctx.nan(a.shape)
    ops.add(c, ctx.upload(a), ctx.upload(b))
    exact(c.numpy(), a.astype(np.float64) + b.astype(np.float64), ctx.dtype, "c")  # -0 + -0 = -0, inf, NaN


def _add_in_place(which: str, ctx: Ctx) -> None:
    a, ra = ctx.normal((33,))
    b, rb = ctx.normal((33,), 3.0)
    target = a if which == "a" else b
    ops.add(target, a, b)
    exact(target.numpy(), ra + rb, ctx.dtype, f"c (= {which})")


def _add_overlap(ctx: Ctx) -> None:
    x, _ = ctx.normal((8,))
    other, _ = ctx.normal((4,))
    refused(lambda: ops.add(x.slice(0, 0, 4), x.slice(0, 2, 6), other), "overlap")


# ---- scale: in f32 with the factor rounded to f32, rounded once ---------------------------------------------

def _scale_reference(x: np.ndarray, factor: float) -> np.ndarray:
    """f32(x * f32(factor)) (the product exact in float64, then rounded to f32), which ``exact`` then rounds to the
    dtype: the contract's two roundings."""
    return (x * np.float64(np.float32(factor))).astype(np.float32).astype(np.float64)


def _scale(shape, factor: float, in_place: bool, ctx: Ctx) -> None:
    x, rx = ctx.normal(shape)
    out = x if in_place else ctx.nan(shape)
    ops.scale(out, x, factor)
    exact(out.numpy(), _scale_reference(rx, factor), ctx.dtype)


def _scale_overlap(ctx: Ctx) -> None:
    x, _ = ctx.normal((8,))
    refused(lambda: ops.scale(x.slice(0, 0, 4), x.slice(0, 2, 6), 2.0), "overlap")


# ---- gated linear units: out = act(gate) * up ------------------------------------------------------------

ACTIVATIONS = {"swiglu": silu, "geglu_tanh": gelu_tanh}


def _glu(op: str, shape, numerics: str, gate_scale: float, ctx: Ctx) -> None:
    gate, rg = ctx.normal(shape, gate_scale)
    up, ru = ctx.normal(shape)
    out = ctx.nan(shape)
    getattr(ops, op)(out, gate, up, numerics)
    act = ACTIVATIONS[op](rg)
    if numerics == "hf":  # HF rounds act(gate) to the dtype before the product
        act = rounded(act, ctx.dtype)
    close(out.numpy(), act * ru, ctx.dtype, TOLERANCE[ctx.dtype])


def _glu_in_place(op: str, which: str, ctx: Ctx) -> None:
    gate, rg = ctx.normal((33,), 3.0)
    up, ru = ctx.normal((33,))
    out = gate if which == "gate" else up
    getattr(ops, op)(out, gate, up)
    close(out.numpy(), ACTIVATIONS[op](rg) * ru, ctx.dtype, TOLERANCE[ctx.dtype], f"out (= {which})")


def _glu_overlap(op: str, ctx: Ctx) -> None:
    x, _ = ctx.normal((8,))
    up, _ = ctx.normal((4,))
    refused(lambda: getattr(ops, op)(x.slice(0, 0, 4), x.slice(0, 1, 5), up), "overlap")


# ---- rearrange: dst[i...] = src[i...] for any strides of either --------------------------------------------

def _values(ctx: Ctx, shape) -> np.ndarray:
    """Random values of the case's dtype (floats ~ N(0, 100^2), integers of the whole range but the max)."""
    if ctx.dtype in FLOATS:
        return (ctx.rng.standard_normal(shape) * 100).astype(ctx.dtype.numpy)
    info = np.iinfo(ctx.dtype.numpy)
    return ctx.rng.integers(info.min, info.max, shape, dtype=np.int64).astype(ctx.dtype.numpy)


def _sentinel(ctx: Ctx, shape) -> np.ndarray:
    """A fill no copied value equals (NaN, or the integer maximum _values never draws): missed writes show."""
    if ctx.dtype in FLOATS:
        return np.full(shape, np.nan, ctx.dtype.numpy)
    return np.full(shape, np.iinfo(ctx.dtype.numpy).max, ctx.dtype.numpy)


def _view(base_shape, cuts, order):
    """(llaisys view maker, numpy view maker): slice each dim (dim, start, end) of ``cuts``, then permute."""
    def make(t):
        for dim, start, end in cuts:
            t = t.slice(dim, start, end)
        return t.permute(*order)

    def make_np(a):
        index = [slice(None)] * len(base_shape)
        for dim, start, end in cuts:
            index[dim] = slice(start, end)
        return a[tuple(index)].transpose(order)
    return make, make_np


def _rearrange(src_view, dst_view, ctx: Ctx) -> None:
    """src_view / dst_view: (base shape, cuts, order) or None (contiguous); the destination is read back through
    its contiguous base, never through rearrange itself."""
    src_base_shape, src_cuts, src_order = src_view
    make, make_np = _view(src_base_shape, src_cuts, src_order)
    base = _values(ctx, src_base_shape)
    x, expected = make(ctx.upload(base)), make_np(base)
    if dst_view is None:
        out = ctx.upload(_sentinel(ctx, expected.shape))
        ops.rearrange(out, x)
        identical(out.numpy(), expected)
        return
    dst_base_shape, dst_cuts, dst_order = dst_view
    make_dst, make_dst_np = _view(dst_base_shape, dst_cuts, dst_order)
    fill = _sentinel(ctx, dst_base_shape)
    dst_base = ctx.upload(fill)
    ops.rearrange(make_dst(dst_base), x)
    want = fill.copy()
    make_dst_np(want)[...] = expected
    identical(dst_base.numpy(), want, "out's base (elements outside the view must stay as they were)")


def _rearrange_same_view(ctx: Ctx) -> None:
    base = _values(ctx, (3, 5))
    t = ctx.upload(base)
    x = t.permute(1, 0)
    ops.rearrange(x, x)  # a copy onto itself: nothing to do, nothing changes
    identical(t.numpy(), base)


def _rearrange_overlap(ctx: Ctx) -> None:
    x = ctx.upload(_values(ctx, (8,)))
    refused(lambda: ops.rearrange(x.slice(0, 0, 4), x.slice(0, 2, 6)), "overlap")


# (name, source view, destination view): views as (base shape, cuts, permutation) of the view's shape
REARRANGES = [
    (CONTIGUOUS, "3x17", ((3, 17), (), (0, 1)), None),
    (ODD, "1x3x1x17", ((1, 3, 1, 17), (), (0, 1, 2, 3)), None),
    (STRIDED, "transposed 17x5", ((5, 17), (), (1, 0)), None),
    (STRIDED, "sliced 3x5x4", ((4, 7, 5), ((0, 1, 4), (1, 2, 7), (2, 0, 4)), (0, 1, 2)), None),
    (STRIDED, "sliced+permuted 4x3x4x2", ((3, 7, 2, 5), ((1, 1, 5), (3, 1, 5)), (3, 0, 1, 2)), None),
    (STRIDED, "8-d permuted", ((2, 1, 3, 1, 2, 3, 1, 2), (), (7, 3, 5, 0, 2, 6, 1, 4)), None),
    (STRIDED, "into a sliced+permuted out 3x4x5", ((3, 4, 5), (), (0, 1, 2)),
     ((6, 5, 4), ((0, 1, 5), (2, 0, 3)), (2, 0, 1))),
    (STRIDED, "both strided 4x3x17", ((17, 3, 5), ((2, 1, 5),), (2, 1, 0)), ((4, 19, 3), ((1, 1, 18),), (0, 2, 1))),
]


def cases() -> list[Case]:
    out: list[Case] = []
    for dtype in FLOATS:
        out += [Case("add", dtype, ODD, dims(s), partial(_add, s)) for s in ODD_SHAPES]
        out += [Case("add", dtype, CONTIGUOUS, dims(s), partial(_add, s)) for s in SHAPES]
        out += [Case("add", dtype, PROPERTY, "inf, NaN, -0", _add_special),
                Case("add", dtype, IN_PLACE, "c is a", partial(_add_in_place, "a")),
                Case("add", dtype, IN_PLACE, "c is b", partial(_add_in_place, "b"))]
        out += [Case("scale", dtype, ODD, dims(s), partial(_scale, s, -0.3, False)) for s in ODD_SHAPES]
        out += [Case("scale", dtype, CONTIGUOUS, "7x1536 factor 8.9375", partial(_scale, (7, 1536), 8.9375, False)),
                Case("scale", dtype, IN_PLACE, "out is x", partial(_scale, (33,), 50.5, True))]
        for op in ACTIVATIONS:
            out += [Case(op, dtype, ODD, dims(s), partial(_glu, op, s, "exact", 3.0)) for s in ODD_SHAPES]
            out += [Case(op, dtype, CONTIGUOUS, "2x8960", partial(_glu, op, (2, 8960), "exact", 3.0)),
                    Case(op, dtype, PROPERTY, "gate*40 (exp's tails)", partial(_glu, op, (4097,), "exact", 40.0)),
                    Case(op, dtype, CONTIGUOUS, "numerics=hf 4097", partial(_glu, op, (4097,), "hf", 3.0)),
                    Case(op, dtype, IN_PLACE, "out is gate", partial(_glu_in_place, op, "gate")),
                    Case(op, dtype, IN_PLACE, "out is up", partial(_glu_in_place, op, "up"))]
    for dtype in (*FLOATS, int8, int64):  # rearrange moves bytes: every item size (1, 2, 4, 8)
        out += [Case("rearrange", dtype, layout, detail, partial(_rearrange, src, dst))
                for layout, detail, src, dst in REARRANGES]
        out.append(Case("rearrange", dtype, IN_PLACE, "out is x (nothing to do)", _rearrange_same_view))
    out += [Case("add", float32, ALIASING, "c overlaps a", _add_overlap),
            Case("scale", float32, ALIASING, "out overlaps x", _scale_overlap),
            Case("rearrange", float32, ALIASING, "out overlaps x", _rearrange_overlap)]
    out += [Case(op, float32, ALIASING, "out overlaps gate", partial(_glu_overlap, op)) for op in ACTIVATIONS]
    return out


def _perf_add(ctx: Ctx):
    a, _ = ctx.normal((64, 1536))
    b, _ = ctx.normal((64, 1536))
    c = ctx.nan((64, 1536))
    return lambda: ops.add(c, a, b)


def _perf_scale(ctx: Ctx):
    x, _ = ctx.normal((64, 1536))
    out = ctx.nan((64, 1536))
    return lambda: ops.scale(out, x, 2.0)


def _perf_glu(op: str, ctx: Ctx):
    gate, _ = ctx.normal((64, 8960))
    up, _ = ctx.normal((64, 8960))
    out = ctx.nan((64, 8960))
    return lambda: getattr(ops, op)(out, gate, up)


def _perf_rearrange(ctx: Ctx):
    x, _ = ctx.normal((512, 1536))
    out = ctx.nan((1536, 512))
    view = x.permute(1, 0)
    return lambda: ops.rearrange(out, view)


# op: (shape, setup(ctx) -> the call to time)
PERF = {"add": ("64x1536", _perf_add), "scale": ("64x1536", _perf_scale),
        "swiglu": ("64x8960", partial(_perf_glu, "swiglu")), "geglu_tanh": ("64x8960", partial(_perf_glu, "geglu_tanh")),
        "rearrange": ("512x1536 transposed", _perf_rearrange)}
