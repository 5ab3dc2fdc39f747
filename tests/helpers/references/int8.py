"""The int8 linear contract's quantizers and the two references its outputs are held to."""

from __future__ import annotations

import ml_dtypes
import numpy as np

import llaisys

GROUP = 32


def quantize_weight(w: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The contract's weight quantizer: per row and group of 32, scale = max|w| / 127 rounded up to bf16,
    q = round-half-to-even(w / scale) in [-127, 127]. Returns (q int8 [N, K], scales bf16 [N, G])."""
    n, k = w.shape
    groups = -(-k // GROUP)
    wp = np.zeros((n, groups * GROUP), np.float32)
    wp[:, :k] = w
    amax = np.abs(wp.reshape(n, groups, GROUP)).max(-1)  # [N, G]
    scale32 = (amax / np.float32(127)).astype(np.float32)
    bits = scale32.view(np.uint32)
    rounded_up = np.where(bits & 0xFFFF, (bits & 0xFFFF0000) + 0x10000, bits).astype(np.uint32)  # scales >= 0
    scale = rounded_up.view(np.float32)
    assert (scale >= scale32).all()
    with np.errstate(divide="ignore", invalid="ignore"):
        q = np.where(scale[:, :, None] > 0, np.rint(wp.reshape(n, groups, GROUP) / scale[:, :, None]), 0)
    assert np.abs(q).max(initial=0) <= 127
    return q.reshape(n, -1)[:, :k].astype(np.int8), scale.astype(ml_dtypes.bfloat16)


def quantize_x(x32: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The contract's activation quantizer, in the kernel's f32 arithmetic: sx = max|x| / 127 (an f32
    division), xq = round-half-to-even(x / sx) (an f32 division), 0 where sx = 0. Returns (xq [M, G, 32]
    int64, zero-padded; sx [M, G] f32)."""
    m, k = x32.shape
    groups = -(-k // GROUP)
    xp = np.zeros((m, groups * GROUP), np.float32)
    xp[:, :k] = x32
    xg = xp.reshape(m, groups, GROUP)
    sx = (np.abs(xg).max(-1) / np.float32(127)).astype(np.float32)
    with np.errstate(divide="ignore", invalid="ignore"):
        xq = np.where(sx[:, :, None] > 0, np.rint(xg / sx[:, :, None]), 0)
    return np.clip(xq, -127, 127).astype(np.int64), sx


def check_int8_outputs(got: np.ndarray, x32: np.ndarray, q: np.ndarray, scales: np.ndarray, w_exact: np.ndarray,
                       bias64, dtype, what: str) -> None:
    """``got`` [M, N] (float64) of linear_i8 (x32 [M, K] as the kernel saw it, q [N, K] and scales [N, G] from
    quantize_weight of w_exact, bias64 [N] or 0) against the two references (module docstring)."""
    m, k = x32.shape
    n = q.shape[0]
    groups = -(-k // GROUP)
    xq, sx = quantize_x(x32)
    qp = np.zeros((n, groups * GROUP), np.int64)
    qp[:, :k] = q
    dots = np.einsum("mgi,ngi->mng", xq, qp.reshape(n, groups, GROUP))  # exact integers
    scale64 = scales.astype(np.float64)  # [N, G]
    terms = dots * scale64[None] * sx.astype(np.float64)[:, None, :]  # [M, N, G]
    exact = terms.sum(-1) + bias64
    eps = {llaisys.float32: 2.0 ** -24, llaisys.float16: 2.0 ** -11, llaisys.bfloat16: 2.0 ** -8}[dtype]
    # Tight: the f32 arithmetic (scales[g, n] * sx rounded, each term's multiply-add, one add per group and
    # the bias) errs by at most ~(G + 3) f32 roundings of the running sum's size, bounded by the sum of
    # |terms|; then the result is rounded once to the dtype (eps of it). No allowance for a differently
    # quantized x: a tie (x / sx exactly at .5) resolved the other way would move an output by
    # scales[g, n] * sx[m, g] * |q[n, k]|, but the contract fixes the arithmetic (an f32 division, round half
    # to even), the kernel and quantize_x both follow it, so xq agrees exactly and any flip is a bug. In f32
    # this catches an integer dot off by 1 in one group.
    magnitude = np.abs(terms).sum(-1) + np.abs(bias64)
    tight = 2 * (groups + 3) * 2.0 ** -24 * magnitude + eps * np.abs(exact)
    err = np.abs(got - exact)
    bad = ~(err <= tight)
    assert not bad.any(), (f"{dtype.name} {what}: {int(bad.sum())} outputs off the exact int8 arithmetic; first "
                           f"{np.argwhere(bad)[0]}: got {got[bad][0]}, expected {exact[bad][0]}, allowed "
                           f"{tight[bad][0]:.3g}")
    # Loose: against x @ w.T of the unquantized weights. Per k, |x w - x' w'| <= |x - x'| |w| + |x'| |w - w'|
    # with |x - x'| <= sx / 2 and |w - w'| <= scale / 2 (round to nearest, no clipping: scales are rounded up),
    # |x'| <= |x| + sx / 2: a worst-case bound per output, plus the tight allowance and the dtype's rounding.
    xg = np.zeros((m, groups * GROUP))
    xg[:, :k] = x32
    xg = xg.reshape(m, groups, GROUP)
    wg = np.zeros((n, groups * GROUP))
    wg[:, :k] = w_exact
    wg = wg.reshape(n, groups, GROUP)
    sx64, s64 = sx.astype(np.float64), scale64
    x_err = np.einsum("mg,ngi->mn", sx64 / 2, np.abs(wg))
    w_err = np.einsum("mgi,ng->mn", np.abs(xg) + sx64[:, :, None] / 2, s64 / 2)
    unquantized = x32.astype(np.float64) @ w_exact.T + bias64
    loose = x_err + w_err + tight + eps * np.abs(unquantized)
    bad = ~(np.abs(got - unquantized) <= loose)
    assert not bad.any(), f"{dtype.name} {what}: {int(bad.sum())} outputs beyond the quantization bound"
