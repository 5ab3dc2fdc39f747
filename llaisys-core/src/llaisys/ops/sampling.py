"""Choosing the next token."""

from __future__ import annotations

from . import _checks as check
from ._dispatch import run

UINT64_MAX = (1 << 64) - 1


def argmax(max_idx, max_val, vals) -> None:
    """max_idx (int64 [1]) and max_val ([1]) of the 1-D vals; the first index on ties."""
    op = "argmax"
    device = check.tensors(op, max_idx=max_idx, max_val=max_val, vals=vals)
    check.ndim(op, "vals", vals, 1)
    if vals.numel() == 0:
        check.fail(op, "vals is empty")
    check.dtype(op, "vals", vals, check.FLOATS)
    check.index_tensor(op, "max_idx", max_idx, (1,))
    check.same_dtype(op, "vals", vals, max_val=max_val)
    check.shape(op, "max_val", max_val, (1,))
    check.contiguous(op, vals=vals)
    check.writable(op, "max_idx", max_idx)
    check.writable(op, "max_val", max_val)
    run(op, device, max_idx, max_val, vals)


def sample(out_idx, logits, temperature: float = 1.0, top_k: int = 0, top_p: float = 1.0, seed: int = 0) -> None:
    """Draw a token id from softmax(logits / temperature) restricted to top-k and nucleus top-p.

    top_k=0 keeps every token; top_k=1 or temperature=0 is argmax. The draw is a
    counter-based hash of ``seed``: the same seed gives the same token on every run.
    """
    op = "sample"
    device = check.tensors(op, out_idx=out_idx, logits=logits)
    check.ndim(op, "logits", logits, 1)
    if logits.numel() == 0:
        check.fail(op, "logits is empty")
    check.dtype(op, "logits", logits, check.FLOATS)
    check.index_tensor(op, "out_idx", out_idx, (1,))
    check.number(op, "temperature", temperature, low=0)
    check.number(op, "top_k", top_k, low=0, integer=True)
    check.number(op, "top_p", top_p, low=0, high=1, low_open=True)
    check.number(op, "seed", seed, low=0, high=UINT64_MAX, integer=True)
    check.contiguous(op, logits=logits)
    check.writable(op, "out_idx", out_idx)
    run(op, device, out_idx, logits, float(temperature), int(top_k), float(top_p), int(seed))
