"""Choosing the next token (frontends as in ``elementwise``: plan, overlap test, kernel)."""

from __future__ import annotations

import math

from ..abi import INT64_MAX, UINT64_MAX
from ..dtype import float32, int64
from . import _checks as check
from ._dispatch import current_stream_handle, kernel_for, new_plans, remember

_argmax = new_plans()


def argmax(max_idx, max_val, vals) -> None:
    """max_idx (int64 [1]) and max_val ([1]) of the 1-D vals; the first index on ties.

    The two outputs share no memory with vals or with each other.
    """
    try:
        kernel, fail, device, code, n = _argmax[max_idx._layout, max_val._layout, vals._layout]
    except (AttributeError, KeyError):
        kernel, fail, device, code, n = _plan_argmax(max_idx, max_val, vals)
    i_ptr, m_ptr, v_ptr = max_idx._ptr, max_val._ptr, vals._ptr
    if v_ptr < max_idx._end and i_ptr < vals._end:
        check.overlap("argmax", "max_idx", "vals")
    if v_ptr < max_val._end and m_ptr < vals._end:
        check.overlap("argmax", "max_val", "vals")
    if m_ptr < max_idx._end and i_ptr < max_val._end:
        check.overlap("argmax", "max_idx", "max_val")
    status = kernel(device.index, current_stream_handle(device), code, n, i_ptr, m_ptr, v_ptr)
    if status:
        fail(status)


def _plan_argmax(max_idx, max_val, vals):
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
    return remember(_argmax, (max_idx._layout, max_val._layout, vals._layout),
                    (*kernel_for(op, device), device, vals.dtype.code, vals.numel()))


_sample = new_plans()


def sample(out_idx, logits, temperature: float = 1.0, top_k: int = 0, top_p: float = 1.0, seed: int = 0) -> None:
    """Draw a token id from softmax(logits / temperature) restricted to top-k and nucleus top-p.

    top_k=0 keeps every token; top_k=1 or temperature=0 is argmax. The draw is a
    counter-based hash of ``seed``: the same seed gives the same token on every run.
    out_idx shares no memory with logits.
    """
    op = "sample"
    try:
        kernel, fail, device, code, n = _sample[out_idx._layout, logits._layout]
    except (AttributeError, KeyError):
        kernel, fail, device, code, n = _plan_sample(out_idx, logits)
    temperature = check.number(op, "temperature", temperature, low=0)
    top_k = check.number(op, "top_k", top_k, low=0, high=INT64_MAX, integer=True)  # int64 in C
    top_p = check.number(op, "top_p", top_p, low=0, high=1, low_open=True)
    seed = check.number(op, "seed", seed, low=0, high=UINT64_MAX, integer=True)  # uint64 in C
    o_ptr, l_ptr = out_idx._ptr, logits._ptr
    if l_ptr < out_idx._end and o_ptr < logits._end:
        check.overlap(op, "out_idx", "logits")
    status = kernel(device.index, current_stream_handle(device), code, n, o_ptr, l_ptr, temperature, top_k, top_p, seed)
    if status:
        fail(status)


def _plan_sample(out_idx, logits):
    op = "sample"
    device = check.tensors(op, out_idx=out_idx, logits=logits)
    check.ndim(op, "logits", logits, 1)
    if logits.numel() == 0:
        check.fail(op, "logits is empty")
    check.dtype(op, "logits", logits, check.FLOATS)
    check.index_tensor(op, "out_idx", out_idx, (1,))
    check.contiguous(op, logits=logits)
    check.writable(op, "out_idx", out_idx)
    return remember(_sample, (out_idx._layout, logits._layout),
                    (*kernel_for(op, device), device, logits.dtype.code, logits.numel()))


_penalize = new_plans()


def penalize_logits(logits, ids, counts, bias=None, repetition_penalty: float = 1.0, frequency_penalty: float = 0.0,
                    presence_penalty: float = 0.0) -> None:
    """Adjust logits [vocab] in place at the token ids ``ids``: a logit bias, then the repetition, frequency
    and presence penalties, the one path for both (a decode step calls it once per row, before choosing).

    ids int64 [n]: token ids in strictly increasing order, each < vocab (n = 0: nothing to do);
    counts int64 [n, 2]: (p, g) = (occurrences of ids[i] in the prompt, occurrences among the generated
    tokens), both >= 0; bias float32 [n] or None. For each i, in f32 (the penalties rounded to f32), as HF
    transformers computes on its float32 logits:

        x = logits[ids[i]] + bias[i]
        if p + g > 0: x = x * repetition_penalty if x < 0 else x / repetition_penalty   # HF, over prompt + generated
        x = x - g * frequency_penalty - (g > 0) * presence_penalty                     # OpenAI, over the generated

    and the result is rounded once to the logits' dtype. An entry (0, 0) gets its bias only, so the ids of a
    ``logit_bias`` share the list with the sequence's tokens. repetition_penalty > 0 (1 = off), the others
    finite (0 = off). An id out of range or not above the one before, or a negative count, is a
    LlaisysValueError naming its position (the kernel reads them: an asynchronous device reports it at the
    next synchronizing call), and nothing is written. logits shares no memory with ids, counts or bias.
    """
    op = "penalize_logits"
    try:
        kernel, fail, device, code, vocab, n = _penalize[logits._layout, ids._layout, counts._layout,
                                                          None if bias is None else bias._layout]
    except (AttributeError, KeyError):
        kernel, fail, device, code, vocab, n = _plan_penalize(logits, ids, counts, bias)
    repetition = check.number(op, "repetition_penalty", repetition_penalty, low=0, low_open=True)
    frequency = check.number(op, "frequency_penalty", frequency_penalty)
    presence = check.number(op, "presence_penalty", presence_penalty)
    for name, value in (("repetition_penalty", repetition), ("frequency_penalty", frequency),
                        ("presence_penalty", presence)):
        if not math.isfinite(value):
            check.fail(op, f"{name} must be finite, got {value!r}")
    l_ptr, l_end = logits._ptr, logits._end
    for name, t in (("ids", ids), ("counts", counts), ("bias", bias)):
        if t is not None and t._ptr < l_end and l_ptr < t._end:
            check.overlap(op, "logits", name)
    status = kernel(device.index, current_stream_handle(device), code, vocab, n, l_ptr, ids._ptr, counts._ptr,
                    None if bias is None else bias._ptr, repetition, frequency, presence)
    if status:
        fail(status)


def _plan_penalize(logits, ids, counts, bias):
    op = "penalize_logits"
    device = check.tensors(op, logits=logits, ids=ids, counts=counts, bias=bias)
    check.ndim(op, "logits", logits, 1)
    if logits.numel() == 0:
        check.fail(op, "logits is empty")
    check.dtype(op, "logits", logits, check.FLOATS)
    check.ndim(op, "ids", ids, 1)
    check.dtype(op, "ids", ids, (int64,))
    n = ids.shape[0]
    check.dtype(op, "counts", counts, (int64,))
    check.shape(op, "counts", counts, (n, 2))
    if bias is not None:
        check.dtype(op, "bias", bias, (float32,))
        check.shape(op, "bias", bias, (n,))
    check.contiguous(op, logits=logits, ids=ids, counts=counts, bias=bias)
    check.writable(op, "logits", logits)
    key = (logits._layout, ids._layout, counts._layout, None if bias is None else bias._layout)
    return remember(_penalize, key, (*kernel_for(op, device, n > 0), device, logits.dtype.code, logits.numel(), n))


_logprobs = new_plans()
LOGPROBS_MAX_K = 20  # OpenAI's top_logprobs maximum


def logprobs(top_ids, values, logits, chosen: int, temperature: float = 1.0) -> None:
    """Log-probabilities of the 1-D logits [n] under softmax(logits / temperature), as OpenAI defines them
    (after temperature; temperature 0, greedy, is the raw logits' distribution).

    values float32 [k + 1]: values[0] = log p(chosen); top_ids int64 [k] (0 <= k <= 20, k <= n) and
    values[1:]: the k most probable tokens, logit descending, the lower id first among equals. In f32 with
    a stable log-sum-exp (m = max(logits), d = (logits - m) / t in f32, log p = d - log(sum exp(d))).
    A NaN or +inf logit, or logits all -inf, is a LlaisysValueError. The outputs share no memory with logits
    or with each other.
    """
    op = "logprobs"
    try:
        kernel, fail, device, code, n, k = _logprobs[top_ids._layout, values._layout, logits._layout]
    except (AttributeError, KeyError):
        kernel, fail, device, code, n, k = _plan_logprobs(top_ids, values, logits)
    chosen = check.number(op, "chosen", chosen, low=0, high=n - 1, integer=True)
    temperature = check.number(op, "temperature", temperature, low=0)
    if not math.isfinite(temperature):
        check.fail(op, f"temperature must be finite, got {temperature!r}")
    l_ptr, l_end = logits._ptr, logits._end
    for name, t in (("top_ids", top_ids), ("values", values)):
        if t.numel() and t._ptr < l_end and l_ptr < t._end:
            check.overlap(op, name, "logits")
    if k and top_ids._ptr < values._end and values._ptr < top_ids._end:
        check.overlap(op, "top_ids", "values")
    status = kernel(device.index, current_stream_handle(device), code, n, l_ptr, chosen, temperature, k,
                    top_ids._ptr if k else None, values._ptr)
    if status:
        fail(status)


def _plan_logprobs(top_ids, values, logits):
    op = "logprobs"
    device = check.tensors(op, top_ids=top_ids, values=values, logits=logits)
    check.ndim(op, "logits", logits, 1)
    if logits.numel() == 0:
        check.fail(op, "logits is empty")
    check.dtype(op, "logits", logits, check.FLOATS)
    check.ndim(op, "top_ids", top_ids, 1)
    check.dtype(op, "top_ids", top_ids, (int64,))
    k = top_ids.shape[0]
    if k > min(LOGPROBS_MAX_K, logits.numel()):
        check.fail(op, f"top_ids holds {k} ids: at most {LOGPROBS_MAX_K} and at most the {logits.numel()} logits")
    check.dtype(op, "values", values, (float32,))
    check.shape(op, "values", values, (k + 1,))
    check.contiguous(op, top_ids=top_ids, values=values, logits=logits)
    check.writable(op, "top_ids", top_ids)
    check.writable(op, "values", values)
    return remember(_logprobs, (top_ids._layout, values._layout, logits._layout),
                    (*kernel_for(op, device), device, logits.dtype.code, logits.numel(), k))
