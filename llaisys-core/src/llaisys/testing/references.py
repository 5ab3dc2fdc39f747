"""Float64 references of the ops, written from backend.h's contract with numpy alone (no torch).

Inputs are the values the kernel sees (already rounded to the dtype, widened exactly to float64); each
function returns the exact result in float64, which ``compare`` rounds once to the output dtype.
"""

from __future__ import annotations

import math

import numpy as np

GROUP = 32  # k per group of the int8 / block formats (llaisys.ops.INT8_GROUP, QUANT_GROUP)


def silu(x: np.ndarray) -> np.ndarray:
    with np.errstate(over="ignore"):
        return x / (1.0 + np.exp(-x))


def gelu_tanh(x: np.ndarray) -> np.ndarray:
    """x / 2 (1 + tanh(z)), z = sqrt(2/pi) (x + 0.044715 x^3), as x * sigmoid(2 z) (no cancellation in 1 + tanh)."""
    z = 2.0 * math.sqrt(2.0 / math.pi) * (x + 0.044715 * x ** 3)
    with np.errstate(over="ignore"):
        return x / (1.0 + np.exp(-z))


def rms_norm(x: np.ndarray, weight: np.ndarray, eps: float) -> np.ndarray:
    return x * weight / np.sqrt((x * x).mean(-1, keepdims=True) + eps)


def rope_angles(pos: np.ndarray, inv_freq: np.ndarray) -> np.ndarray:
    """[seq, d/2]: the f32 angle f32(p) * inv_freq[j] rounded to f32 (backend.h), as float64."""
    return (pos.astype(np.float32)[:, None] * inv_freq.astype(np.float32)[None, :]).astype(np.float64)


def rope(x: np.ndarray, angles: np.ndarray) -> np.ndarray:
    """x [seq, heads, d] rotated by angles [seq, d/2], half-split (rotate_half) layout."""
    half = x.shape[-1] // 2
    c, s = np.cos(angles)[:, None, :], np.sin(angles)[:, None, :]
    x1, x2 = x[..., :half], x[..., half:]
    return np.concatenate((x1 * c - x2 * s, x2 * c + x1 * s), -1)


def attention(q: np.ndarray, k: np.ndarray, v: np.ndarray, scale: float, window: int = 0) -> np.ndarray:
    """Causal GQA attention, mask aligned bottom-right: q [L, H, d], k [S, Hkv, d], v [S, Hkv, dv] -> [L, H, dv];
    with a window, query i (at position p = i + S - L) sees only keys j with p - window < j <= p."""
    L, H, _ = q.shape
    S, Hkv, _ = k.shape
    group = H // Hkv
    k, v = np.repeat(k, group, axis=1), np.repeat(v, group, axis=1)
    scores = np.einsum("lhd,shd->hls", q, k) * scale
    position = np.arange(L)[:, None] + (S - L)
    visible = np.arange(S)[None, :] <= position
    if window:
        visible &= np.arange(S)[None, :] > position - window
    scores = np.where(visible[None], scores, -np.inf)
    weights = np.exp(scores - scores.max(-1, keepdims=True))
    weights /= weights.sum(-1, keepdims=True)
    return np.einsum("hls,shd->lhd", weights, v)


def descending(values: np.ndarray) -> np.ndarray:
    """Indices of a 1-D array by value descending, the lower index first among equals."""
    return np.argsort(-values, kind="stable")


def softmax(x: np.ndarray, axis: int = -1) -> np.ndarray:
    e = np.exp(x - x.max(axis, keepdims=True))
    return e / e.sum(axis, keepdims=True)


def sigmoid(x: np.ndarray) -> np.ndarray:
    with np.errstate(over="ignore"):
        return 1.0 / (1.0 + np.exp(-x))


def grouped_router(logits: np.ndarray, k: int, bias: np.ndarray | None = None, scoring: str = "softmax",
                   n_group: int = 1, topk_group: int = 1, group_top: int = 1, normalize: bool = False,
                   route_scale: float = 1.0) -> tuple[np.ndarray, np.ndarray]:
    """moe_router_grouped (DeepSeek-V2 / V3) of logits [M, E]: (experts int64 [M, k], weights float64 [M, k]).
    s = softmax or sigmoid of a row, c = s + bias (NaN as -inf); the topk_group groups whose group_top largest c
    sum highest (equal sums: the lower group) keep their experts; the k largest c, equal c by ascending id; the
    weights are their s, over (their sum + 1e-20) when normalizing, times route_scale."""
    m, e = logits.shape
    s = softmax(logits) if scoring == "softmax" else sigmoid(logits)
    c = s if bias is None else s + bias
    c = np.where(np.isnan(c), -np.inf, c)
    if topk_group < n_group:
        per = e // n_group
        groups = -np.sort(-c.reshape(m, n_group, per), -1)[..., :group_top].sum(-1)
        kept = np.zeros((m, n_group), bool)
        np.put_along_axis(kept, np.argsort(-groups, 1, kind="stable")[:, :topk_group], True, 1)
        c = np.where(np.repeat(kept, per, 1), c, -np.inf)
    experts = np.argsort(-c, 1, kind="stable")[:, :k]
    weights = np.take_along_axis(s, experts, 1)
    if normalize:
        weights = weights / (weights.sum(1, keepdims=True) + 1e-20)
    return experts.astype(np.int64), weights * route_scale


def log_softmax(x: np.ndarray) -> np.ndarray:
    finite_max = x.max()
    with np.errstate(divide="ignore"):
        return x - finite_max - np.log(np.exp(x - finite_max).sum())


def quantize_x(x32: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """backend.h's activation quantizer (linear_i8 / linear_q / moe_linear_i8), in its f32 arithmetic: per row and
    group of 32 k, sx = max|x| / 127 (an f32 division), xq = round-half-to-even(x / sx) (an f32 division), 0 where
    sx = 0. Returns (xq [M, Kp] int64, zero past K; sx [M, G] float32)."""
    m, k = x32.shape
    groups = -(-k // GROUP)
    padded = np.zeros((m, groups * GROUP), np.float32)
    padded[:, :k] = x32
    grouped = padded.reshape(m, groups, GROUP)
    sx = (np.abs(grouped).max(-1, initial=0) / np.float32(127)).astype(np.float32)
    with np.errstate(divide="ignore", invalid="ignore"):
        xq = np.where(sx[:, :, None] > 0, np.rint(grouped / sx[:, :, None]), 0)
    return np.clip(xq, -127, 127).astype(np.int64).reshape(m, -1), sx


def quantized_linear(x32: np.ndarray, w: np.ndarray) -> np.ndarray:
    """out [M, N] = x' @ w.T in float64, x' = xq * sx the quantized activations (quantize_x) and w [N, K] the exact
    weights the blocks hold: the contract's sum of scaled integer dots, exactly."""
    m, k = x32.shape
    xq, sx = quantize_x(x32)
    xs = (xq.reshape(m, sx.shape[1], GROUP) * sx.astype(np.float64)[:, :, None]).reshape(m, -1)[:, :k]
    return xs @ w.T


def int8_weights(q: np.ndarray, scales: np.ndarray) -> np.ndarray:
    """w [N, K] = scale(n, k // 32) * q[n, k] in float64 (linear_i8's weights: q int8 [N, K], scales bf16 [N, G])."""
    k = q.shape[1]
    return np.repeat(scales.astype(np.float64), GROUP, axis=1)[:, :k] * q.astype(np.float64)


def quant_weights(fmt: str, codes: np.ndarray, *params: np.ndarray) -> np.ndarray:
    """w [N, K] in float64 exactly as backend.h's formulas give them from pack_quant's arguments (the products
    exact, the sums unrounded: what linear_q's split arithmetic computes before its f32 roundings)."""
    n, k = codes.shape
    per = lambda p, size: np.repeat(p.astype(np.float64), size, axis=1)[:, :k]  # noqa: E731
    c = codes.astype(np.float64)
    if fmt == "q8_0":
        return per(params[0], 32) * c
    if fmt == "q4_0":
        return per(params[0], 32) * (c - 8)
    if fmt == "q4_1":
        return per(params[0], 32) * c + per(params[1], 32)
    if fmt == "q4_k":
        d, dmin, sc, mn = params
        return per(d, 256) * per(sc, 32) * c - per(dmin, 256) * per(mn, 32)
    if fmt == "q6_k":
        d, sc = params
        return per(d, 256) * per(sc, 16) * (c - 32)
    raise ValueError(f"unknown format {fmt!r}")
