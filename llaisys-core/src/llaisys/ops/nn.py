"""The layers of a transformer block."""

from __future__ import annotations

from . import _checks as check
from ._dispatch import run


def embedding(out, index, weight) -> None:
    """out[i] = weight[index[i]]; an index outside [0, vocab) raises, never reads wild memory."""
    op = "embedding"
    device = check.tensors(op, out=out, index=index, weight=weight)
    check.ndim(op, "index", index, 1)
    check.index_tensor(op, "index", index)
    check.ndim(op, "weight", weight, 2)
    check.dtype(op, "weight", weight, check.FLOATS)
    check.same_dtype(op, "weight", weight, out=out)
    check.shape(op, "out", out, (index.shape[0], weight.shape[1]))
    check.contiguous(op, out=out, index=index, weight=weight)
    check.writable(op, "out", out)
    if out.numel() or index.numel():
        run(op, device, out, index, weight)


def linear(out, x, weight, bias=None) -> None:
    """out = x @ weight.T + bias; x [M, K], weight [N, K], bias [N] or None, out [M, N]."""
    op = "linear"
    device = check.tensors(op, out=out, x=x, weight=weight, bias=bias)
    check.dtype(op, "out", out, check.FLOATS)
    check.same_dtype(op, "out", out, x=x, weight=weight, bias=bias)
    check.ndim(op, "x", x, 2)
    check.ndim(op, "weight", weight, 2)
    (m, k), n = x.shape, weight.shape[0]
    check.shape(op, "weight", weight, (n, k))
    if bias is not None:
        check.shape(op, "bias", bias, (n,))
    check.shape(op, "out", out, (m, n))
    check.contiguous(op, out=out, x=x, weight=weight, bias=bias)
    check.writable(op, "out", out)
    if out.numel():
        run(op, device, out, x, weight, bias)


def rms_norm(out, x, weight, eps: float, numerics: str = "exact") -> None:
    """Per row of x [..., D]: x * weight / sqrt(mean(x^2) + eps). ``numerics``: "exact" or "hf" (the ops'
    rounding modes, see ``llaisys.native.Numerics``)."""
    op = "rms_norm"
    device = check.tensors(op, out=out, x=x, weight=weight)
    code = check.numerics(op, numerics)
    check.dtype(op, "out", out, check.FLOATS)
    check.same_dtype(op, "out", out, x=x, weight=weight)
    if x.ndim < 1:
        check.fail(op, "x must have at least one dimension")
    check.shape(op, "weight", weight, (x.shape[-1],))
    check.shape(op, "out", out, x.shape)
    check.number(op, "eps", eps, low=0)
    check.contiguous(op, out=out, x=x, weight=weight)
    check.writable(op, "out", out)
    if out.numel():
        run(op, device, out, x, weight, float(eps), code)


def rope(out, x, pos_ids, theta: float, numerics: str = "exact") -> None:
    """Rotary embedding, half-split layout: x [seq, heads, d], pos_ids int64 [seq]."""
    op = "rope"
    device = check.tensors(op, out=out, x=x, pos_ids=pos_ids)
    code = check.numerics(op, numerics)
    check.dtype(op, "out", out, check.FLOATS)
    check.same_dtype(op, "out", out, x=x)
    check.ndim(op, "x", x, 3)
    if x.shape[2] % 2:
        check.fail(op, f"the head dim of x must be even, got {x.shape[2]}")
    check.shape(op, "out", out, x.shape)
    check.index_tensor(op, "pos_ids", pos_ids, (x.shape[0],))
    check.number(op, "theta", theta, low=0, low_open=True)
    check.contiguous(op, out=out, x=x, pos_ids=pos_ids)
    check.writable(op, "out", out)
    if out.numel():
        run(op, device, out, x, pos_ids, float(theta), code)


def self_attention(out, q, k, v, scale: float, numerics: str = "exact") -> None:
    """Causal GQA attention, mask aligned bottom-right (query i sees key j iff j <= i + S - L).

    q [L, H, d], k [S, Hkv, d], v [S, Hkv, dv], out [L, H, dv]; head h reads kv head h // (H / Hkv).
    """
    op = "self_attention"
    device = check.tensors(op, out=out, q=q, k=k, v=v)
    code = check.numerics(op, numerics)
    check.dtype(op, "out", out, check.FLOATS)
    check.same_dtype(op, "out", out, q=q, k=k, v=v)
    for name, t in (("q", q), ("k", k), ("v", v), ("out", out)):
        check.ndim(op, name, t, 3)
    (seq_q, heads, d), (seq_k, kv_heads) = q.shape, k.shape[:2]
    check.shape(op, "k", k, (seq_k, kv_heads, d))
    check.shape(op, "v", v, (seq_k, kv_heads, v.shape[2]))
    check.shape(op, "out", out, (seq_q, heads, v.shape[2]))
    if kv_heads == 0 or heads % kv_heads:
        check.fail(op, f"the {heads} query heads must be a multiple of the {kv_heads} kv heads")
    if seq_k < seq_q:
        check.fail(op, f"k has {seq_k} positions, fewer than the {seq_q} queries")
    check.number(op, "scale", scale)
    check.contiguous(op, out=out, q=q, k=k, v=v)
    check.writable(op, "out", out)
    if out.numel():
        run(op, device, out, q, k, v, float(scale), code)
