"""Constraining a choice: ``mask_logits`` (frontend as in ``sampling``: plan, overlap test, kernel)."""

from __future__ import annotations

from ..dtype import int32
from . import _checks as check
from ._dispatch import current_stream_handle, kernel_for, new_plans, remember

_mask_logits = new_plans()


def mask_logits(logits, bitmask) -> None:
    """Set the disallowed logits to -inf, in place.

    logits [vocab] or [rows, vocab]; bitmask int32 [words] or [rows, words], words = ceil(vocab / 32), the
    packed layout grammar libraries (llguidance, xgrammar) fill: token t of a row is allowed iff bit t % 32
    (least significant first) of word t // 32 is set. Bits past the vocabulary are ignored. The two share no
    memory.
    """
    try:
        kernel, fail, device, code, rows, vocab = _mask_logits[logits._layout, bitmask._layout]
    except (AttributeError, KeyError):
        kernel, fail, device, code, rows, vocab = _plan_mask_logits(logits, bitmask)
    l_ptr, b_ptr = logits._ptr, bitmask._ptr
    if l_ptr < bitmask._end and b_ptr < logits._end:
        check.overlap("mask_logits", "logits", "bitmask")
    status = kernel(device.index, current_stream_handle(device), code, rows, vocab, l_ptr, b_ptr)
    if status:
        fail(status)


def _plan_mask_logits(logits, bitmask):
    op = "mask_logits"
    device = check.tensors(op, logits=logits, bitmask=bitmask)
    if logits.ndim not in (1, 2):
        check.fail(op, f"logits must be [vocab] or [rows, vocab], got shape {tuple(logits.shape)}")
    check.dtype(op, "logits", logits, check.FLOATS)
    check.dtype(op, "bitmask", bitmask, (int32,))
    rows, vocab = (1, logits.shape[0]) if logits.ndim == 1 else logits.shape
    if vocab == 0:
        check.fail(op, "logits is empty")
    words = (vocab + 31) // 32
    check.shape(op, "bitmask", bitmask, (words,) if logits.ndim == 1 else (rows, words))
    check.contiguous(op, logits=logits, bitmask=bitmask)
    check.writable(op, "logits", logits)
    return remember(_mask_logits, (logits._layout, bitmask._layout),
                    (*kernel_for(op, device), device, logits.dtype.code, rows, vocab))
