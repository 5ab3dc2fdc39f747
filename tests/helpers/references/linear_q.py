"""The 4-bit block formats' contract reference and random blocks of them."""

from __future__ import annotations

import numpy as np
import torch

import llaisys
from helpers.references.int8 import quantize_x

K_FORMATS = ("q4_k", "q6_k")  # K a multiple of 256


def random_blocks(fmt: str, n: int, k: int, rng) -> tuple:
    """Random codes and scale parameters of format ``fmt`` (pack_quant's arguments), with weights of size
    ~1/sqrt(K) (outputs O(1) for x ~ N(0, 1)) and every code value and sign of scale represented."""
    groups = -(-k // 32)
    size = k ** -0.5
    f16 = lambda a: np.asarray(a, np.float32).astype(np.float16)  # noqa: E731
    sign = lambda shape: rng.choice([-1.0, 1.0], shape)  # noqa: E731
    if fmt == "q8_0":
        return (rng.integers(-127, 128, (n, k), dtype=np.int8), f16(sign((n, groups)) * size / 60 * rng.random((n, groups))))
    if fmt in ("q4_0", "q4_1"):
        codes = rng.integers(0, 16, (n, k), dtype=np.uint8)
        d = f16(sign((n, groups)) * size / 4 * (0.5 + rng.random((n, groups))))
        if fmt == "q4_0":
            return codes, d
        return codes, d, f16(-8 * d.astype(np.float32) + size * rng.standard_normal((n, groups)))
    supers = k // 256
    if fmt == "q4_k":
        codes = rng.integers(0, 16, (n, k), dtype=np.uint8)
        d = f16(size / 4 / 32 * (0.5 + rng.random((n, supers))))
        dmin = f16(size / 32 * rng.random((n, supers)))
        sc = rng.integers(0, 64, (n, groups), dtype=np.uint8)
        mn = rng.integers(0, 64, (n, groups), dtype=np.uint8)
        return codes, d, dmin, sc, mn
    codes = rng.integers(0, 64, (n, k), dtype=np.uint8)
    return (codes, f16(sign((n, supers)) * size / 32 / 64 * (0.5 + rng.random((n, supers)))),
            rng.integers(-128, 128, (n, k // 16), dtype=np.int8))


def integers_and_scales(fmt: str, codes, params, k: int):
    """The contract's arithmetic pieces in float64: q [N, Kp] (the format's integers, offset included, zero past
    K), scale [N, G, subs] (f32 products, as the kernel forms them), min [N, G] (0 without one)."""
    n = codes.shape[0]
    groups = -(-k // 32)
    q = np.zeros((n, groups * 32), np.int64)
    offset = {"q4_0": 8, "q6_k": 32}.get(fmt, 0)
    q[:, :k] = codes.astype(np.int64) - offset
    per_super = lambda a: np.repeat(a.astype(np.float32), 8, axis=1)  # noqa: E731  [N, G]
    if fmt in ("q8_0", "q4_0", "q4_1"):
        scale = params[0].astype(np.float64)[:, :, None]
        mins = params[1].astype(np.float64) if fmt == "q4_1" else np.zeros((n, groups))
    elif fmt == "q4_k":
        d, dmin, sc, mn = params
        scale = (per_super(d) * sc.astype(np.float32)).astype(np.float64)[:, :, None]
        mins = -(per_super(dmin) * mn.astype(np.float32)).astype(np.float64)
    else:
        d, sc = params
        halves = np.repeat(d.astype(np.float32), 16, axis=1) * sc.astype(np.float32)  # [N, K/16]
        scale = halves.astype(np.float64).reshape(n, groups, 2)
        mins = np.zeros((n, groups))
    return q, scale, mins


def contract_reference(fmt, codes, params, w, x_t, bias_t, dtype):
    """The contract's result (float64) for x_t (torch, in ``dtype``) against the blocks of (codes, params), the
    tight bound around it, and (x @ w.T with the unquantized x, the loose bound around that)."""
    m, k = x_t.shape
    n = codes.shape[0]
    groups = -(-k // 32)
    x32 = x_t.to(torch.float32).numpy()
    xq, sx = quantize_x(x32)  # [M, G, 32], [M, G]
    q, scale, mins = integers_and_scales(fmt, codes, params, k)
    subs = scale.shape[2]
    dots = np.einsum("mgsi,ngsi->mngs", xq.reshape(m, groups, subs, -1), q.reshape(n, groups, subs, -1))
    sx64 = sx.astype(np.float64)
    terms = dots * scale[None] * sx64[:, None, :, None]  # [M, N, G, subs]
    min_terms = mins[None] * (sx64 * xq.sum(-1))[:, None, :]  # [M, N, G]
    bias = 0.0 if bias_t is None else bias_t.to(torch.float64).numpy()
    exact = terms.sum((2, 3)) + min_terms.sum(2) + bias
    eps = {llaisys.float32: 2.0 ** -24, llaisys.float16: 2.0 ** -11, llaisys.bfloat16: 2.0 ** -8}[dtype]
    # Tight: the f32 arithmetic (each scale * sx rounded, one multiply-add per term, the bias, partial sums added
    # in any order) errs by at most ~(terms + 3) f32 roundings of the running sum, bounded by the sum of |terms|;
    # then the one rounding to the dtype. xq is the contract's, exactly (kernels and quantize_x follow the same
    # arithmetic).
    magnitude = np.abs(terms).sum((2, 3)) + np.abs(min_terms).sum(2) + np.abs(bias)
    tight = 2 * (groups * (subs + 1) + 3) * 2.0 ** -24 * magnitude + eps * np.abs(exact)
    # Loose: x @ w.T of the weights the blocks hold (exact) and the unquantized x: |x - x'| <= sx / 2 per k.
    wg = np.zeros((n, groups * 32))
    wg[:, :k] = w
    x_err = np.einsum("mg,ngi->mn", sx64 / 2, np.abs(wg.reshape(n, groups, 32)))
    unquantized = x32.astype(np.float64) @ w.T + bias
    return exact, tight, (unquantized, x_err + tight + eps * np.abs(unquantized) + 1e-12)
