"""moe_router, moe_router_grouped, moe_linear and moe_combine: a token's MLP as the weighted sum of the k experts
(of E) it picks. (moe_linear_i8, the int8 experts, is with the other quantized ops in ``quant``.)"""

from __future__ import annotations

from functools import partial

import numpy as np

from ... import ops
from ...dtype import bfloat16, float16, float32, int64
from ...stream import synchronize
from ..case import ALIASING, BATCH, CONTIGUOUS, ODD, PROPERTY, Case, Ctx
from ..compare import TOLERANCE, CaseFailed, as_f64, close, identical, refused
from ..references import descending, grouped_router, softmax

FLOATS = (float32, float16, bfloat16)


def random_experts(ctx: Ctx, m: int, k: int, e: int) -> np.ndarray:
    """int64 [m, k]: k distinct experts per row (as a router picks them), in random order."""
    return np.array([ctx.rng.permutation(e)[:k] for _ in range(m)], np.int64).reshape(m, k)


# ---- moe_router: top k of softmax(logits) per row, ties by ascending expert id ------------------------------

def _router_check(ctx: Ctx, logits: np.ndarray, k: int, normalize: bool) -> None:
    m, e = logits.shape
    weights, experts = ctx.nan((m, k)), ctx.full((m, k), -1, int64)
    ops.moe_router(weights, experts, ctx.upload(logits), normalize)
    x = logits.astype(np.float64)
    want = np.stack([descending(row)[:k] for row in x])
    got = experts.numpy()
    if not np.array_equal(got, want):
        row = int(np.argwhere((got != want).any(1))[0, 0])
        raise CaseFailed(f"experts of row {row}: got {got[row].tolist()}, expected {want[row].tolist()} (logits "
                         f"descending, equal logits by ascending id)")
    p = np.take_along_axis(softmax(x), want, 1)
    close(weights.numpy(), p / p.sum(1, keepdims=True) if normalize else p, ctx.dtype, TOLERANCE[ctx.dtype], "weights")


def _router(m: int, e: int, k: int, normalize: bool, ctx: Ctx) -> None:
    _router_check(ctx, (ctx.rng.standard_normal((m, e)) * 2).astype(ctx.dtype.numpy), k, normalize)


def _router_ties(ctx: Ctx) -> None:
    logits = np.array([[0.5, 2.0, 1.0, 2.0, 2.0, 1.0], [1.0] * 6, [3.0, -1.0, 3.0, -1.0, 3.0, 0.0]])
    _router_check(ctx, logits.astype(ctx.dtype.numpy), 3, True)


def _router_overlap(ctx: Ctx) -> None:
    logits, _ = ctx.normal((2, 8))
    experts = ctx.full((2, 2), 0, int64)
    weights = logits.view(16).slice(0, 0, 4).view(2, 2)  # the first 4 logits
    refused(lambda: ops.moe_router(weights, experts, logits), "overlap")


# ---- moe_router_grouped: DeepSeek's group-limited top k (softmax or sigmoid, a choice bias, groups) -----------
# (logits are f32 whatever the case's dtype, as DeepSeek computes its router in f32; the weights are the dtype's)

def _grouped_check(ctx: Ctx, logits: np.ndarray, k: int, bias: np.ndarray | None, **kw) -> None:
    m, e = logits.shape
    logits = logits.astype(np.float32)
    weights, experts = ctx.nan((m, k)), ctx.full((m, k), -1, int64)
    ops.moe_router_grouped(weights, experts, ctx.upload(logits), None if bias is None else ctx.upload(bias), **kw)
    want, p = grouped_router(logits.astype(np.float64), k, None if bias is None else bias.astype(np.float64), **kw)
    got = experts.numpy()
    if not np.array_equal(got, want):
        row = int(np.argwhere((got != want).any(1))[0, 0])
        raise CaseFailed(f"experts of row {row}: got {got[row].tolist()}, expected {want[row].tolist()} (the best "
                         f"groups' experts by score descending, equal scores by ascending id)")
    close(weights.numpy(), p, ctx.dtype, TOLERANCE[ctx.dtype], "weights")


def _grouped(m: int, e: int, k: int, with_bias: bool, kw: dict, ctx: Ctx) -> None:
    logits = (ctx.rng.standard_normal((m, e)) * 2).astype(np.float32)
    bias = (ctx.rng.standard_normal(e) * 0.3).astype(np.float32) if with_bias else None
    _grouped_check(ctx, logits, k, bias, **kw)


def _grouped_ties(ctx: Ctx) -> None:
    """Equal scores go to the lower expert id, equal group scores to the lower group."""
    logits = np.array([[2.0, 0.0, 1.0, 1.0, 2.0, 0.0, 1.0, 1.0],   # the 2 groups of 4 tie: group 0
                       [1.0] * 8,                                  # everything ties
                       [0.0, 3.0, 0.0, 3.0, 3.0, 0.0, 3.0, 0.0]])  # the groups tie, experts in pairs
    for scoring in ("softmax", "sigmoid"):
        for topk_group, want in ((1, [[0, 2, 3], [0, 1, 2], [1, 3, 0]]), (2, [[0, 4, 2], [0, 1, 2], [1, 3, 4]])):
            _grouped_check(ctx, logits, 3, None, scoring=scoring, n_group=2, topk_group=topk_group, group_top=1)
            _grouped_check(ctx, logits[:, [0, 1, 4, 5, 2, 3, 6, 7]], 3, None, scoring=scoring, n_group=4,
                           topk_group=topk_group + 1, group_top=2)
            experts = ctx.full((3, 3), -1, int64)
            ops.moe_router_grouped(ctx.nan((3, 3)), experts, ctx.upload(logits.astype(np.float32)),
                                   scoring=scoring, n_group=2, topk_group=topk_group, group_top=1)
            if experts.numpy().tolist() != want:
                raise CaseFailed(f"{scoring}, topk_group {topk_group}: experts {experts.numpy().tolist()}, "
                                 f"expected {want}")


def _grouped_logits_dtype(ctx: Ctx) -> None:
    """logits in the case's dtype (f16 or bf16) are refused, naming logits and float32, before any kernel runs:
    the router reads f32 logits whatever its weights' dtype."""
    weights, experts = ctx.nan((2, 2)), ctx.full((2, 2), -1, int64)
    logits, _ = ctx.normal((2, 8))
    refused(lambda: ops.moe_router_grouped(weights, experts, logits, n_group=2), "logits", ctx.dtype.name, "float32")
    if not np.isnan(as_f64(weights.numpy())).all() or (experts.numpy() != -1).any():
        raise CaseFailed("refused, but the outputs were written")


def _grouped_overlap(ctx: Ctx) -> None:
    logits, _ = ctx.normal((2, 8), dtype=float32)
    experts = ctx.full((2, 2), 0, int64)
    weights = logits.view(16).slice(0, 4, 8).view(2, 2)
    refused(lambda: ops.moe_router_grouped(weights, experts, logits, n_group=2), "overlap")
    bias = ctx.nan((8,), float32)
    refused(lambda: ops.moe_router_grouped(bias.slice(0, 2, 6).view(2, 2), experts, logits, bias), "overlap")


# (M, E, k, bias, keywords): greedy (one group), V2 (softmax, the groups' maxima), V3 (sigmoid, a bias, the
# groups' top-2 sums, normalized, scaled), odd sizes (groups of 1 and 3, k = everything the kept groups hold)
GROUPED: dict[str, dict[str, tuple[int, int, int, bool, dict]]] = {
    ODD: {"M1 E1 k1": (1, 1, 1, False, {}),
          "M3 E6 k2 sigmoid bias, 3 groups of 2 keep 1, top 2": (3, 6, 2, True, dict(
              scoring="sigmoid", n_group=3, topk_group=1, group_top=2, normalize=True)),
          "M5 E15 k6 5 groups keep 2 (k = all they hold)": (5, 15, 6, False, dict(n_group=5, topk_group=2)),
          "M4 E5 k3 5 groups of 1 keep 4, scale 0.5": (4, 5, 3, True, dict(
              scoring="sigmoid", n_group=5, topk_group=4, route_scale=0.5))},
    CONTIGUOUS: {"V2-Lite M17 E64 k6 greedy": (17, 64, 6, False, {}),
                 "V2 M9 E160 k6 8 groups keep 3, scale 16": (9, 160, 6, False, dict(
                     n_group=8, topk_group=3, route_scale=16.0)),
                 "V3 M33 E256 k8 sigmoid bias 8 groups keep 4 top 2, normalized, scale 2.5": (33, 256, 8, True, dict(
                     scoring="sigmoid", n_group=8, topk_group=4, group_top=2, normalize=True, route_scale=2.5))},
}


# ---- moe_linear: out[m, j] = x_mj @ weight[experts[m, j]].T ----------------------------------------------

def _moe_inputs(ctx: Ctx, shape, per_slot: bool):
    m, k, e, n, kk = shape
    x, rx = ctx.normal((m, k, kk) if per_slot else (m, kk), kk ** -0.5)
    w, rw = ctx.normal((e, n, kk))
    ids = random_experts(ctx, m, k, e)
    return x, rx, w, rw, ids


def _moe_linear(shape, per_slot: bool, ctx: Ctx) -> None:
    m, k, e, n, kk = shape
    x, rx, w, rw, ids = _moe_inputs(ctx, shape, per_slot)
    out = ctx.nan((m, k, n))
    ops.moe_linear(out, x, w, ctx.upload(ids))
    inputs = rx if per_slot else np.broadcast_to(rx[:, None, :], (m, k, kk))
    close(out.numpy(), np.einsum("mjk,mjnk->mjn", inputs, rw[ids]), ctx.dtype, TOLERANCE[ctx.dtype])


def _moe_linear_batch(ctx: Ctx) -> None:
    """Each row's outputs, bit for bit, computed alone or with the batch (rows per expert 1 to 20)."""
    shape = (20, 2, 4, 33, 100)
    x, rx, w, _, ids = _moe_inputs(ctx, shape, False)
    out = ctx.nan(shape[:2] + shape[3:4])
    ops.moe_linear(out, x, w, ctx.upload(ids))
    batched = out.numpy()
    host_x = rx.astype(ctx.dtype.numpy)
    for row in (0, 7, 19):
        alone = ctx.nan((1, 2, 33))
        ops.moe_linear(alone, ctx.upload(host_x[row:row + 1]), w, ctx.upload(ids[row:row + 1]))
        identical(alone.numpy()[0], batched[row], f"row {row} alone vs in a batch of 20")


def _moe_bad_expert(ctx: Ctx) -> None:
    x, _ = ctx.normal((2, 8))
    w, _ = ctx.normal((3, 4, 8))
    out = ctx.nan((2, 1, 4))

    def call():
        ops.moe_linear(out, x, w, ctx.upload(np.array([[1], [3]])))
        synchronize(ctx.device)
    refused(call)


def _moe_linear_overlap(ctx: Ctx) -> None:
    buffer, _ = ctx.normal((2 * 8 + 2 * 1 * 4,))
    x, out = buffer.slice(0, 0, 16).view(2, 8), buffer.slice(0, 12, 20).view(2, 1, 4)
    w, _ = ctx.normal((3, 4, 8))
    refused(lambda: ops.moe_linear(out, x, w, ctx.upload(np.array([[0], [2]]))), "overlap")


# ---- moe_combine: out[m] = sum_j weights[m, j] * y[m, j] ---------------------------------------------------

def _combine(m: int, k: int, n: int, ctx: Ctx) -> None:
    y, ry = ctx.normal((m, k, n))
    w, rw = ctx.normal((m, k), 0.5)
    out = ctx.nan((m, n))
    ops.moe_combine(out, y, w)
    close(out.numpy(), np.einsum("mj,mjn->mn", rw, ry), ctx.dtype, TOLERANCE[ctx.dtype])


def _combine_overlap(ctx: Ctx) -> None:
    y, _ = ctx.normal((2, 2, 4))
    w, _ = ctx.normal((2, 2))
    refused(lambda: ops.moe_combine(y.view(16).slice(0, 4, 12).view(2, 4), y, w), "overlap")


MOE_LINEAR = {ODD: [(1, 2, 8, 17, 33), (3, 1, 3, 1, 1), (3, 3, 5, 3, 17)],
              CONTIGUOUS: [(5, 2, 8, 64, 100), (17, 2, 4, 33, 129), (2, 8, 16, 40, 300)]}


def cases() -> list[Case]:
    out: list[Case] = []
    for dtype in FLOATS:
        for i, (m, e, k) in enumerate(((1, 1, 1), (3, 3, 3), (4, 17, 1), (17, 8, 2), (5, 128, 8), (64, 64, 8))):
            layout = ODD if i < 3 else CONTIGUOUS
            out += [Case("moe_router", dtype, layout, f"M{m} E{e} k{k}{' normalized' if normalize else ''}",
                         partial(_router, m, e, k, normalize)) for normalize in (False, True)]
        out.append(Case("moe_router", dtype, PROPERTY, "ties by ascending id", _router_ties))
        for layout, specs in GROUPED.items():
            out += [Case("moe_router_grouped", dtype, layout, name, partial(_grouped, *spec))
                    for name, spec in specs.items()]
        out.append(Case("moe_router_grouped", dtype, PROPERTY, "ties by ascending id and group", _grouped_ties))
        if dtype != float32:
            out.append(Case("moe_router_grouped", dtype, PROPERTY, f"{dtype.name} logits refused (logits are f32)",
                            _grouped_logits_dtype))
        for layout, shapes in MOE_LINEAR.items():
            out += [Case("moe_linear", dtype, layout, "M{} k{} E{} N{} K{}".format(*s) + (" per slot" if i % 2 else ""),
                         partial(_moe_linear, s, i % 2 == 1)) for i, s in enumerate(shapes)]
        out.append(Case("moe_linear", dtype, BATCH, "M20 k2 E4 N33 K100 rows alone", _moe_linear_batch))
        out += [Case("moe_combine", dtype, ODD, f"M{m} k{k} N{n}", partial(_combine, m, k, n))
                for m, k, n in ((1, 1, 1), (3, 2, 17), (7, 3, 33))]
        out.append(Case("moe_combine", dtype, CONTIGUOUS, "M16 k8 N1536", partial(_combine, 16, 8, 1536)))
    out += [Case("moe_linear", float32, PROPERTY, "expert id out of range", _moe_bad_expert),
            Case("moe_router", float32, ALIASING, "weights overlaps logits", _router_overlap),
            Case("moe_router_grouped", float32, ALIASING, "weights overlaps logits or bias", _grouped_overlap),
            Case("moe_linear", float32, ALIASING, "out overlaps x", _moe_linear_overlap),
            Case("moe_combine", float32, ALIASING, "out overlaps y", _combine_overlap)]
    return out


def _perf_router(ctx: Ctx):
    logits, _ = ctx.normal((64, 128))
    weights, experts = ctx.nan((64, 8)), ctx.full((64, 8), 0, int64)
    return lambda: ops.moe_router(weights, experts, logits, True)


def _perf_grouped(ctx: Ctx):
    logits, _ = ctx.normal((64, 256), dtype=float32)
    bias, _ = ctx.normal((256,), 0.1, float32)
    weights, experts = ctx.nan((64, 8)), ctx.full((64, 8), 0, int64)
    return lambda: ops.moe_router_grouped(weights, experts, logits, bias, scoring="sigmoid", n_group=8, topk_group=4,
                                          group_top=2, normalize=True, route_scale=2.5)


def _perf_moe_linear(ctx: Ctx):
    x, _, w, _, ids = _moe_inputs(ctx, (1, 8, 16, 768, 2048), False)
    ids_t, out = ctx.upload(ids), ctx.nan((1, 8, 768))
    return lambda: ops.moe_linear(out, x, w, ids_t)


def _perf_combine(ctx: Ctx):
    y, _ = ctx.normal((64, 8, 2048))
    w, _ = ctx.normal((64, 8))
    out = ctx.nan((64, 2048))
    return lambda: ops.moe_combine(out, y, w)


PERF = {"moe_router": ("M64 E128 k8", _perf_router),
        "moe_router_grouped": ("M64 E256 k8 V3 (8 groups keep 4)", _perf_grouped),
        "moe_linear": ("M1 k8 E16 N768 K2048", _perf_moe_linear),
        "moe_combine": ("M64 k8 N2048", _perf_combine)}
