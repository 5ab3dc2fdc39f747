"""Mixture of experts: a token's MLP is the weighted sum of the k experts (of E) its router picks.

    moe_router(weights, experts, logits)          top k of softmax(logits) per row (renormalised or not)
    moe_router_grouped(weights, experts, logits, bias, ...)   DeepSeek's group-limited top k (softmax or sigmoid)
    moe_linear(out, x, weight, experts)           out[m, j] = x[m] (or x[m, j]) @ weight[experts[m, j]].T
    moe_linear_i8(out, x, weight, scales, experts)   the same with each expert's weight in linear_i8's int8 blocks
    moe_linear_q(out, x, weight, scales, experts, fmt)   ... in linear_q's blocks of format fmt (a GGUF file's)
    moe_combine(out, y, weights)                  out[m] = sum_j weights[m, j] * y[m, j]

moe_linear reads only the selected experts' matrices, each once for all the rows that chose it. Every op
computes a row on its own: a row's result never depends on the other rows of the batch (backend.h).
Frontends as in ``elementwise``: plan, overlap test, kernel.
"""

from __future__ import annotations

import itertools
import math

from ..dtype import bfloat16, float32, int8, uint8
from . import _checks as check
from ._dispatch import current_stream_handle, kernel_for, new_plans, remember
from .int8 import INT8_GROUP, int8_shapes
from .quant import FORMATS, QUANT_FORMATS, QUANT_SUPER

_router = new_plans()


def moe_router(weights, experts, logits, normalize: bool = False) -> None:
    """Per row of logits [M, E]: p = softmax(row) in f32; experts int64 [M, k] = the k largest p, descending
    (by logit: equal logits by ascending expert id); weights [M, k] (logits' dtype) = those p, divided by their sum when
    ``normalize`` (Mixtral; Qwen3-MoE's ``norm_topk_prob``). No buffer may overlap another."""
    try:
        kernel, fail, device, code, m, e, k = _router[weights._layout, experts._layout, logits._layout]
    except (AttributeError, KeyError):
        kernel, fail, device, code, m, e, k = _plan_router(weights, experts, logits)
    named = {"weights": weights, "experts": experts, "logits": logits}
    for a, b in (("weights", "experts"), ("weights", "logits"), ("experts", "logits")):
        if named[a]._ptr < named[b]._end and named[b]._ptr < named[a]._end:
            check.overlap("moe_router", a, b)
    status = kernel(device.index, current_stream_handle(device), code, m, e, k, int(bool(normalize)),
                    weights._ptr, experts._ptr, logits._ptr)
    if status:
        fail(status)


def _plan_router(weights, experts, logits):
    op = "moe_router"
    device = check.tensors(op, weights=weights, experts=experts, logits=logits)
    check.dtype(op, "logits", logits, check.FLOATS)
    check.same_dtype(op, "logits", logits, weights=weights)
    m, e, k = _router_sizes(op, weights, experts, logits)
    check.contiguous(op, weights=weights, experts=experts, logits=logits)
    return remember(_router, (weights._layout, experts._layout, logits._layout),
                    (*kernel_for(op, device, m > 0), device, logits.dtype.code, m, e, k))


def _router_sizes(op: str, weights, experts, logits) -> tuple[int, int, int]:
    """(M, E, k) of a router's logits [M, E], weights [M, k] and experts int64 [M, k], checked (and the outputs
    writable)."""
    check.ndim(op, "logits", logits, 2)
    check.ndim(op, "weights", weights, 2)
    (m, e), k = logits.shape, weights.shape[1]
    check.shape(op, "weights", weights, (m, k))
    check.index_tensor(op, "experts", experts, (m, k))
    if not 1 <= k <= e:
        check.fail(op, f"k = {k} (weights.shape[1]) must be in [1, {e}], the number of experts (logits.shape[1])")
    check.writable(op, "weights", weights)
    check.writable(op, "experts", experts)
    return m, e, k


_grouped = new_plans()
ROUTER_SCORINGS = {"softmax": 0, "sigmoid": 1}


def moe_router_grouped(weights, experts, logits, bias=None, *, scoring: str = "softmax", n_group: int = 1,
                       topk_group: int = 1, group_top: int = 1, normalize: bool = False,
                       route_scale: float = 1.0) -> None:
    """DeepSeek's group-limited router, per row of logits f32 [M, E]: s = softmax(row) or sigmoid(row)
    (``scoring``), c = s + bias (bias f32 [E], DeepSeek-V3's e_score_correction_bias; None: c = s). With
    ``n_group`` > 1 the experts are n_group consecutive groups; a group scores the sum of its ``group_top``
    largest c (V2: 1, V3: 2), and only the ``topk_group`` best groups' experts can be chosen. experts int64 [M, k]
    = the k largest c, descending (equal c by ascending id); weights [M, k] (f32, f16 or bf16) = their s, divided by
    (their sum + 1e-20) when ``normalize``, times ``route_scale`` (routed_scaling_factor). No buffer may overlap
    another."""
    tensors = (weights, experts, logits, bias)
    options = (scoring, n_group, topk_group, group_top, normalize, route_scale)
    try:  # (the plan holds the options checked: a decode step's routers pass the same ones every layer)
        key = tuple(None if t is None else t._layout for t in tensors) + options
        kernel, fail, device, code, m, e, k, args = _grouped[key]
    except (AttributeError, KeyError, TypeError):
        kernel, fail, device, code, m, e, k, args = _plan_grouped(*tensors, *options)
    named = {"weights": weights, "experts": experts, "logits": logits, "bias": bias}
    for a, b in itertools.combinations(named, 2):
        x, y = named[a], named[b]
        if x is not None and y is not None and x._ptr < y._end and y._ptr < x._end:
            check.overlap("moe_router_grouped", a, b)
    status = kernel(device.index, current_stream_handle(device), code, m, e, k, *args, weights._ptr, experts._ptr,
                    logits._ptr, None if bias is None else bias._ptr)
    if status:
        fail(status)


def _plan_grouped(weights, experts, logits, bias, scoring, n_group, topk_group, group_top, normalize, route_scale):
    op = "moe_router_grouped"
    tensors = {"weights": weights, "experts": experts, "logits": logits}
    if bias is not None:
        tensors["bias"] = bias
    device = check.tensors(op, **tensors)
    check.dtype(op, "weights", weights, check.FLOATS)
    check.dtype(op, "logits", logits, (float32,))
    m, e, k = _router_sizes(op, weights, experts, logits)
    if bias is not None:
        check.dtype(op, "bias", bias, (float32,))
        check.shape(op, "bias", bias, (e,))
    check.contiguous(op, **tensors)
    if scoring not in ROUTER_SCORINGS:
        check.fail(op, f"scoring must be one of {', '.join(map(repr, ROUTER_SCORINGS))}, got {scoring!r}")
    n_group = check.number(op, "n_group", n_group, 1, e, integer=True)
    if e % n_group:
        check.fail(op, f"n_group = {n_group} does not divide the {e} experts")
    per_group = e // n_group
    topk_group = check.number(op, "topk_group", topk_group, 1, n_group, integer=True)
    group_top = check.number(op, "group_top", group_top, 1, per_group, integer=True)
    if k > topk_group * per_group:
        check.fail(op, f"k = {k} experts cannot be chosen from topk_group = {topk_group} groups of {per_group}")
    scale = check.number(op, "route_scale", route_scale)
    if not math.isfinite(scale):
        check.fail(op, f"route_scale must be finite, got {route_scale!r}")
    args = (ROUTER_SCORINGS[scoring], n_group, topk_group, group_top, int(bool(normalize)), scale)
    key = (*(None if t is None else t._layout for t in (weights, experts, logits, bias)), scoring, n_group,
           topk_group, group_top, normalize, route_scale)
    return remember(_grouped, key, (*kernel_for(op, device, m > 0), device, weights.dtype.code, m, e, k, args))


_linear = new_plans()


def moe_linear(out, x, weight, experts) -> None:
    """out [M, k, N] = for each row m and slot j, x_mj @ weight[experts[m, j]].T, with weight [E, N, K],
    experts int64 [M, k] and x_mj = x[m] (x [M, K]: each row's input to all its experts) or x[m, j] (x [M, k,
    K]: one input per slot). An expert id outside [0, E) raises. out must share no memory with the others."""
    try:
        kernel, fail, device, code, m, k, e, n, kk, per_slot = _linear[out._layout, x._layout, weight._layout,
                                                                       experts._layout]
    except (AttributeError, KeyError):
        kernel, fail, device, code, m, k, e, n, kk, per_slot = _plan_linear(out, x, weight, experts)
    o_ptr, o_end = out._ptr, out._end
    for name, t in (("x", x), ("weight", weight), ("experts", experts)):
        if t._ptr < o_end and o_ptr < t._end:
            check.overlap("moe_linear", "out", name)
    status = kernel(device.index, current_stream_handle(device), code, m, k, e, n, kk, per_slot, o_ptr, x._ptr,
                    weight._ptr, experts._ptr)
    if status:
        fail(status)


def _plan_linear(out, x, weight, experts):
    op = "moe_linear"
    device = check.tensors(op, out=out, x=x, weight=weight, experts=experts)
    check.dtype(op, "out", out, check.FLOATS)
    check.same_dtype(op, "out", out, x=x, weight=weight)
    check.ndim(op, "weight", weight, 3)
    check.ndim(op, "experts", experts, 2)
    check.index_tensor(op, "experts", experts)
    (m, k), (e, n, kk) = experts.shape, weight.shape
    if x.ndim not in (2, 3):
        check.fail(op, f"x must be [M, K] (one input per row) or [M, k, K] (one per slot), got shape {x.shape}")
    per_slot = x.ndim == 3
    check.shape(op, "x", x, (m, k, kk) if per_slot else (m, kk))
    check.shape(op, "out", out, (m, k, n))
    check.contiguous(op, out=out, x=x, weight=weight, experts=experts)
    check.writable(op, "out", out)
    # (an empty out still checks its expert ids: a wrong id is an error whatever the sizes)
    return remember(_linear, (out._layout, x._layout, weight._layout, experts._layout),
                    (*kernel_for(op, device, m * k > 0), device, out.dtype.code, m, k, e, n, kk, int(per_slot)))


_linear_i8 = new_plans()


def moe_linear_i8(out, x, weight, scales, experts) -> None:
    """moe_linear with int8 experts: out [M, k, N] = for each row m and slot j, linear_i8 of x_mj (x[m] of x [M,
    K], or x[m, j] of x [M, k, K]) and expert experts[m, j]'s int8 weight, bit for bit what ``linear_i8`` gives
    for that row and expert alone. weight int8 [E, ceil(N / 16), ceil(K / 32), 8, 16, 4] and scales bf16 [E,
    ceil(N / 16), ceil(K / 32), 16] hold each expert's ``linear_i8`` blocks at [e] (``pack_int8`` of its q [N, K]
    and scales). experts int64 [M, k]; an id outside [0, E) raises. out must share no memory with the others."""
    try:
        kernel, fail, device, code, m, k, e, n, kk, per_slot = _linear_i8[out._layout, x._layout, weight._layout,
                                                                          scales._layout, experts._layout]
    except (AttributeError, KeyError):
        kernel, fail, device, code, m, k, e, n, kk, per_slot = _plan_linear_i8(out, x, weight, scales, experts)
    o_ptr, o_end = out._ptr, out._end
    for name, t in (("x", x), ("weight", weight), ("scales", scales), ("experts", experts)):
        if t._ptr < o_end and o_ptr < t._end:
            check.overlap("moe_linear_i8", "out", name)
    status = kernel(device.index, current_stream_handle(device), code, m, k, e, n, kk, per_slot, o_ptr, x._ptr,
                    weight._ptr, scales._ptr, experts._ptr)
    if status:
        fail(status)


def _plan_linear_i8(out, x, weight, scales, experts):
    op = "moe_linear_i8"
    device = check.tensors(op, out=out, x=x, weight=weight, scales=scales, experts=experts)
    check.dtype(op, "out", out, check.FLOATS)
    check.same_dtype(op, "out", out, x=x)
    check.dtype(op, "weight", weight, (int8,))
    check.dtype(op, "scales", scales, (bfloat16,))
    m, k, n, kk, per_slot = _expert_rows(op, out, x, experts)
    if weight.ndim != 6:
        check.fail(op, f"weight must be 6-d [E, ceil(N / 16), ceil(K / 32), 8, 16, 4] (each expert's int8 blocks), "
                       f"got shape {weight.shape}")
    e = weight.shape[0]
    weight_shape, scales_shape = int8_shapes(n, kk)
    if weight.shape != (e, *weight_shape):
        check.fail(op, f"weight has shape {weight.shape}; expected {(e, *weight_shape)}: the int8 blocks of E = {e} "
                       f"experts' [N, K] = [{n}, {kk}] matrices (N from out, K from x; llaisys.ops.pack_int8 makes "
                       f"each)")
    if scales.shape != (e, *scales_shape):
        check.fail(op, f"scales has shape {scales.shape}; expected {(e, *scales_shape)}: one bf16 scale per expert, row "
                       f"and group of {INT8_GROUP} consecutive k, in blocks of 16 rows")
    check.contiguous(op, out=out, x=x, weight=weight, scales=scales, experts=experts)
    check.writable(op, "out", out)
    # (an empty out still checks its expert ids: a wrong id is an error whatever the sizes)
    return remember(_linear_i8, (out._layout, x._layout, weight._layout, scales._layout, experts._layout),
                    (*kernel_for(op, device, m * k > 0), device, out.dtype.code, m, k, e, n, kk, int(per_slot)))


_linear_q = new_plans()


def moe_linear_q(out, x, weight, scales, experts, fmt: str) -> None:
    """moe_linear with each expert's weight in ``linear_q``'s blocks of format ``fmt`` (q8_0, q4_0, q4_1, q4_k,
    q6_k: a GGUF file's stacked experts as stored): out [M, k, N] = for each row m and slot j, linear_q of x_mj
    (x[m] of x [M, K], or x[m, j] of x [M, k, K]) and expert experts[m, j]'s blocks, bit for bit what
    ``linear_q`` gives for that row and expert alone. weight and scales uint8 [E, *quant_shapes(fmt, N, K)[i]]
    hold each expert's blocks at [e] (``pack_quant`` of its matrix). experts int64 [M, k]; an id outside [0, E)
    raises. out must share no memory with the others."""
    try:
        kernel, fail, device, code, fcode, m, k, e, n, kk, per_slot = _linear_q[
            out._layout, x._layout, weight._layout, scales._layout, experts._layout, fmt]
    except (AttributeError, KeyError, TypeError):
        kernel, fail, device, code, fcode, m, k, e, n, kk, per_slot = _plan_linear_q(out, x, weight, scales,
                                                                                     experts, fmt)
    o_ptr, o_end = out._ptr, out._end
    for name, t in (("x", x), ("weight", weight), ("scales", scales), ("experts", experts)):
        if t._ptr < o_end and o_ptr < t._end:
            check.overlap("moe_linear_q", "out", name)
    status = kernel(device.index, current_stream_handle(device), code, fcode, m, k, e, n, kk, per_slot, o_ptr,
                    x._ptr, weight._ptr, scales._ptr, experts._ptr)
    if status:
        fail(status)


def _plan_linear_q(out, x, weight, scales, experts, fmt):
    op = "moe_linear_q"
    device = check.tensors(op, out=out, x=x, weight=weight, scales=scales, experts=experts)
    check.dtype(op, "out", out, check.FLOATS)
    check.same_dtype(op, "out", out, x=x)
    check.dtype(op, "weight", weight, (uint8,))
    check.dtype(op, "scales", scales, (uint8,))
    m, k, n, kk, per_slot = _expert_rows(op, out, x, experts)
    if fmt not in QUANT_FORMATS:
        check.fail(op, f"fmt must be one of {', '.join(QUANT_FORMATS)}, got {fmt!r}")
    f = FORMATS[fmt]
    if f.record == QUANT_SUPER and kk % QUANT_SUPER:
        check.fail(op, f"K = {kk} is not a multiple of {QUANT_SUPER}, which {fmt} blocks need (its super-blocks)")
    if weight.ndim != 4 or scales.ndim != 4:
        check.fail(op, f"weight and scales must be 4-d [E, ...] (each expert's {fmt} blocks, stacked), got shapes "
                       f"{weight.shape} and {scales.shape}")
    e = weight.shape[0]
    weight_shape, scales_shape = f.shapes(n, kk)
    if weight.shape != (e, *weight_shape):
        check.fail(op, f"weight has shape {weight.shape}; expected {(e, *weight_shape)}: the {fmt} blocks of E = {e} "
                       f"experts' [N, K] = [{n}, {kk}] matrices (N from out, K from x; llaisys.ops.pack_quant makes "
                       f"each)")
    if scales.shape != (e, *scales_shape):
        check.fail(op, f"scales has shape {scales.shape}; expected {(e, *scales_shape)}: the {fmt} scale records of "
                       f"E = {e} experts' [N, K] = [{n}, {kk}] matrices")
    check.contiguous(op, out=out, x=x, weight=weight, scales=scales, experts=experts)
    check.writable(op, "out", out)
    # (an empty out still checks its expert ids: a wrong id is an error whatever the sizes)
    key = (out._layout, x._layout, weight._layout, scales._layout, experts._layout, fmt)
    return remember(_linear_q, key, (*kernel_for(op, device, m * k > 0), device, out.dtype.code, f.code, m, k, e, n,
                                     kk, int(per_slot)))


_combine = new_plans()


def moe_combine(out, y, weights) -> None:
    """out [M, N] = sum over j in order of weights[m, j] * y[m, j] (y [M, k, N], weights [M, k]), in f32,
    rounded once. out must share no memory with y or weights."""
    try:
        kernel, fail, device, code, m, k, n = _combine[out._layout, y._layout, weights._layout]
    except (AttributeError, KeyError):
        kernel, fail, device, code, m, k, n = _plan_combine(out, y, weights)
    o_ptr, o_end = out._ptr, out._end
    for name, t in (("y", y), ("weights", weights)):
        if t._ptr < o_end and o_ptr < t._end:
            check.overlap("moe_combine", "out", name)
    status = kernel(device.index, current_stream_handle(device), code, m, k, n, o_ptr, y._ptr, weights._ptr)
    if status:
        fail(status)


def _plan_combine(out, y, weights):
    op = "moe_combine"
    device = check.tensors(op, out=out, y=y, weights=weights)
    check.dtype(op, "out", out, check.FLOATS)
    check.same_dtype(op, "out", out, y=y, weights=weights)
    check.ndim(op, "y", y, 3)
    m, k, n = y.shape
    check.shape(op, "weights", weights, (m, k))
    check.shape(op, "out", out, (m, n))
    check.contiguous(op, out=out, y=y, weights=weights)
    check.writable(op, "out", out)
    return remember(_combine, (out._layout, y._layout, weights._layout),
                    (*kernel_for(op, device, out.numel() > 0), device, out.dtype.code, m, k, n))


def _expert_rows(op: str, out, x, experts) -> tuple[int, int, int, int, bool]:
    """The shapes the block-weight expert linears share: experts int64 [M, k], out [M, k, N], x [M, K] or
    [M, k, K]; returns (M, k, N, K, whether x has one input per slot)."""
    check.ndim(op, "experts", experts, 2)
    check.index_tensor(op, "experts", experts)
    check.ndim(op, "out", out, 3)
    (m, k), n = experts.shape, out.shape[2]
    if x.ndim not in (2, 3):
        check.fail(op, f"x must be [M, K] (one input per row) or [M, k, K] (one per slot), got shape {x.shape}")
    per_slot, kk = x.ndim == 3, x.shape[-1]
    check.shape(op, "x", x, (m, k, kk) if per_slot else (m, kk))
    check.shape(op, "out", out, (m, k, n))
    return m, k, n, kk, per_slot
