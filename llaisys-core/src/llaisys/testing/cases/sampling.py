"""Choosing the next token: argmax, sample, mask_logits, penalize_logits and logprobs.

sample's draw is a hash of the seed that backend.h leaves to the backend, so its cases check the properties the
contract fixes: top_k=1 and temperature 0 are argmax, a seed gives the same token every time, a draw stays in
the top k and the nucleus, and the tokens of 400 seeds follow softmax(logits / T) (counts within 5 standard
deviations, which a correct kernel misses with probability ~1e-6 per token).
"""

from __future__ import annotations

from functools import partial

import numpy as np

from ... import ops
from ...dtype import bfloat16, float16, float32, int64
from ...stream import synchronize
from ..case import ALIASING, CONTIGUOUS, ODD, PROPERTY, Case, Ctx
from ..compare import TOLERANCE, CaseFailed, close, identical, refused
from ..references import descending, log_softmax, softmax

FLOATS = (float32, float16, bfloat16)
LOGITS8 = [1.0, 2.0, 0.5, -1.0, 3.0, 0.0, 2.5, -0.5]


# ---- argmax: the first index of the maximum, NaN counting as the maximum -----------------------------------

def _argmax_check(ctx: Ctx, vals: np.ndarray) -> None:
    vals = vals.astype(ctx.dtype.numpy)
    idx, val = ctx.full((1,), -7, int64), ctx.nan((1,))
    ops.argmax(idx, val, ctx.upload(vals))
    wide = vals.astype(np.float64)
    nan = np.isnan(wide)
    want = int(np.argmax(nan)) if nan.any() else int(np.argmax(wide))  # np.argmax: the first on ties
    got = int(idx.numpy()[0])
    if got != want:
        raise CaseFailed(f"n={len(vals)}: index {got}, expected {want} (the first maximum, NaN counting as it)")
    identical(val.numpy(), vals[want:want + 1], "max_val (the element itself, bit for bit)")


def _argmax(n: int, ctx: Ctx) -> None:
    _argmax_check(ctx, ctx.rng.standard_normal(n) * 5)
    _argmax_check(ctx, -ctx.rng.random(n) - 1)  # all negative: padded lanes must not win


def _argmax_ties(n: int, ctx: Ctx) -> None:
    for first, second in ((0, n - 1), (n // 2, n - 1), (15, 16), (31, 33)):
        if not 0 <= first < second < n:
            continue
        v = ctx.rng.standard_normal(n)
        v[first] = v[second] = 10.0
        _argmax_check(ctx, v)
        v[second] = np.nan  # NaN beats the maximum
        _argmax_check(ctx, v)
        v[first] = np.nan  # the first of two NaN
        _argmax_check(ctx, v)


def _argmax_specials(ctx: Ctx) -> None:
    for values in ([-0.0, 0.0], [0.0, -0.0], [-np.inf, -np.inf], [1.0, np.inf, np.inf, np.nan, 2.0], [3.0, 3.0, 3.0]):
        _argmax_check(ctx, np.array(values))


def _argmax_overlap(ctx: Ctx) -> None:
    vals, _ = ctx.normal((8,))
    refused(lambda: ops.argmax(ctx.full((1,), 0, int64), vals.slice(0, 3, 4), vals), "overlap")


# ---- sample ---------------------------------------------------------------------------------------------------

def _draws(ctx: Ctx, logits, seeds, **kw) -> np.ndarray:
    """One draw per seed, each into its own element of one int64 buffer (read back once)."""
    out = ctx.full((len(seeds),), -1, int64)
    for i, seed in enumerate(seeds):
        ops.sample(out.slice(0, i, i + 1), logits, seed=seed, **kw)
    return out.numpy()


def _sample_is_argmax(n: int, how: str, ctx: Ctx) -> None:
    v = (ctx.rng.standard_normal(n) * 3).astype(ctx.dtype.numpy)
    v[n // 3] = v[n - 1] = v.astype(np.float64).max() + 1  # a tie: the first wins
    want = int(np.argmax(v.astype(np.float64)))
    kw = dict(top_k=1, temperature=0.8) if how == "top_k=1" else dict(temperature=0.0)
    got = _draws(ctx, ctx.upload(v), range(8), **kw)
    if (got != want).any():
        raise CaseFailed(f"{how}: drew {sorted(set(got.tolist()))}, expected the argmax {want} for every seed")


def _sample_reproducible(ctx: Ctx) -> None:
    logits = ctx.upload(np.zeros(64, ctx.dtype.numpy))  # uniform: every token as likely
    first, again = _draws(ctx, logits, range(40)), _draws(ctx, logits, range(40))
    identical(again, first, "tokens drawn again with the same seeds")
    if len(set(first.tolist())) < 10:
        raise CaseFailed(f"40 seeds over 64 equally likely tokens drew only {sorted(set(first.tolist()))}")


def _sample_top_k(ctx: Ctx) -> None:
    v = ctx.rng.permutation(1000).astype(np.float64) / 250  # distinct logits in [0, 4)
    logits = v.astype(ctx.dtype.numpy)
    allowed = set(descending(logits.astype(np.float64))[:5].tolist())
    got = _draws(ctx, ctx.upload(logits), range(32), top_k=5, temperature=2.0)
    stray = sorted(set(got.tolist()) - allowed)
    if stray:
        raise CaseFailed(f"top_k=5 drew {stray}, outside the 5 largest logits {sorted(allowed)}")


def _sample_top_p(ctx: Ctx) -> None:
    logits = np.array(LOGITS8).astype(ctx.dtype.numpy)
    x = logits.astype(np.float64)
    order = descending(x)
    p = softmax(x)[order]
    before = np.concatenate(([0.0], np.cumsum(p)[:-1]))  # the mass of the tokens before each
    allowed = set(order[before < 0.6 + 1e-6].tolist())  # the nucleus: tokens needed to reach 0.6
    got = _draws(ctx, ctx.upload(logits), range(50), top_p=0.6)
    stray = sorted(set(got.tolist()) - allowed)
    if stray:
        raise CaseFailed(f"top_p=0.6 drew {stray}, outside the nucleus {sorted(allowed)}")


def _sample_distribution(temperature: float, top_k: int, ctx: Ctx) -> None:
    seeds = 400
    logits = np.array(LOGITS8).astype(ctx.dtype.numpy)
    x = logits.astype(np.float64)
    p = softmax(x / temperature)
    if top_k:
        p[descending(x)[top_k:]] = 0.0
        p /= p.sum()
    counts = np.bincount(_draws(ctx, ctx.upload(logits), range(seeds), temperature=temperature, top_k=top_k),
                         minlength=len(x))
    expected = p * seeds
    sigma = np.sqrt(seeds * p * (1 - p))
    bad = np.abs(counts - expected) > 5 * sigma + 2
    if bad.any():
        raise CaseFailed(f"T={temperature} top_k={top_k}: token counts {counts.tolist()} over {seeds} seeds, expected "
                         f"{np.round(expected, 1).tolist()} (tokens {np.flatnonzero(bad).tolist()} beyond 5 sigma)")


# ---- mask_logits: disallowed logits become -inf, allowed ones keep their bits ---------------------------------

def _mask(shape, allowed: float, ctx: Ctx) -> None:
    rows, vocab = (1, shape[0]) if len(shape) == 1 else shape
    words = (vocab + 31) // 32
    x = (ctx.rng.standard_normal((rows, vocab)) * 3).astype(ctx.dtype.numpy)
    keep = ctx.rng.random((rows, words * 32)) < allowed  # bits past the vocabulary random too (ignored)
    packed = np.packbits(keep, axis=1, bitorder="little").view(np.int32)
    logits = ctx.upload(x.reshape(shape))
    ops.mask_logits(logits, ctx.upload(packed.reshape(*shape[:-1], words)))
    want = np.where(keep[:, :vocab], x, np.array(-np.inf, x.dtype))
    identical(logits.numpy().reshape(rows, vocab), want, "logits")


# ---- penalize_logits: bias, then repetition (prompt + generated), then frequency / presence ------------------

def _penalize_reference(x, ids, counts, bias, repetition, frequency, presence) -> np.ndarray:
    out = x.astype(np.float64).copy()
    for i, token in enumerate(ids):
        p, g = counts[i]
        value = out[token] + (0.0 if bias is None else float(bias[i]))
        if p + g > 0:
            value = value * repetition if value < 0 else value / repetition
        out[token] = value - g * frequency - (presence if g > 0 else 0.0)
    return out


def _penalize(vocab: int, with_bias: bool, ctx: Ctx) -> None:
    x = (ctx.rng.standard_normal(vocab) * 4).astype(ctx.dtype.numpy)
    prompt = ctx.rng.integers(0, vocab, 40).tolist()
    generated = ctx.rng.integers(0, vocab, 25).tolist() + prompt[:3] * 2
    ids = sorted(set(prompt) | set(generated))
    counts = np.array([(prompt.count(t), generated.count(t)) for t in ids], np.int64)
    bias = np.linspace(-100, 100, len(ids)).astype(np.float32) if with_bias else None
    logits = ctx.upload(x)
    ops.penalize_logits(logits, ctx.upload(np.array(ids, np.int64)), ctx.upload(counts),
                        None if bias is None else ctx.upload(bias), repetition_penalty=1.3, frequency_penalty=0.7,
                        presence_penalty=-0.4)
    got = logits.numpy()
    close(got, _penalize_reference(x, ids, counts, bias, 1.3, 0.7, -0.4), ctx.dtype, TOLERANCE[ctx.dtype], "logits")
    untouched = np.ones(vocab, bool)
    untouched[ids] = False
    identical(got[untouched], x[untouched], "the logits of ids not listed")


def _penalize_bad_ids(ctx: Ctx) -> None:
    x = ctx.rng.standard_normal(10).astype(ctx.dtype.numpy)
    logits = ctx.upload(x)

    def call():
        ops.penalize_logits(logits, ctx.upload(np.array([1, 5, 5])), ctx.upload(np.ones((3, 2), np.int64)),
                            repetition_penalty=2.0)
        synchronize(ctx.device)
    refused(call)
    identical(logits.numpy(), x, "logits after the refused call (nothing may be written)")


def _penalize_overlap(ctx: Ctx) -> None:
    logits, _ = ctx.normal((8,), dtype=float32)
    ids, counts = ctx.upload(np.array([0, 1])), ctx.upload(np.ones((2, 2), np.int64))
    refused(lambda: ops.penalize_logits(logits, ids, counts, logits.slice(0, 6, 8)), "overlap")


# ---- logprobs: log softmax(logits / T) of the chosen token and the top k, ties by lower id -------------------

def _logprobs_check(ctx: Ctx, x: np.ndarray, chosen: int, temperature: float, k: int) -> None:
    top_ids, values = ctx.full((k,), -1, int64), ctx.nan((k + 1,), float32)
    ops.logprobs(top_ids, values, ctx.upload(x), chosen, temperature)
    wide = x.astype(np.float64)
    lp = log_softmax(wide / temperature if temperature > 0 else wide)
    order = descending(wide)[:k]
    got_ids = top_ids.numpy()
    if got_ids.tolist() != order.tolist():
        raise CaseFailed(f"top ids {got_ids.tolist()}, expected {order.tolist()} (logit descending, lower id first)")
    close(values.numpy(), np.concatenate(([lp[chosen]], lp[order])), float32, 1e-4, "values")


def _logprobs(n: int, k: int, temperature: float, ctx: Ctx) -> None:
    _logprobs_check(ctx, (ctx.rng.standard_normal(n) * 3).astype(ctx.dtype.numpy), n // 2, temperature, k)


def _logprobs_ties(ctx: Ctx) -> None:
    _logprobs_check(ctx, np.array([1.0, 3.0, 2.0, 3.0, 3.0, -np.inf, 2.0]).astype(ctx.dtype.numpy), 5, 1.0, 6)


def _logprobs_nan(ctx: Ctx) -> None:
    x = ctx.upload(np.array([0.0, np.nan, 1.0]).astype(ctx.dtype.numpy))
    top_ids, values = ctx.full((1,), -1, int64), ctx.nan((2,), float32)

    def call():
        ops.logprobs(top_ids, values, x, 0)
        synchronize(ctx.device)
    refused(call)


def _logprobs_overlap(ctx: Ctx) -> None:
    logits, _ = ctx.normal((8,), dtype=float32)
    refused(lambda: ops.logprobs(ctx.full((1,), 0, int64), logits.slice(0, 6, 8), logits, 0), "overlap")


def cases() -> list[Case]:
    out: list[Case] = []
    for dtype in FLOATS:
        out += [Case("argmax", dtype, ODD, f"n={n}", partial(_argmax, n)) for n in (1, 3, 17)]
        out += [Case("argmax", dtype, CONTIGUOUS, f"n={n}", partial(_argmax, n)) for n in (4097, 151936)]
        out += [Case("argmax", dtype, PROPERTY, f"ties and NaN n={n}", partial(_argmax_ties, n)) for n in (2, 33, 4097)]
        out.append(Case("argmax", dtype, PROPERTY, "-0, inf, all equal", _argmax_specials))
        out += [Case("sample", dtype, PROPERTY, f"{how} is argmax n={n}", partial(_sample_is_argmax, n, how))
                for how in ("top_k=1", "temperature=0") for n in (17, 4097)]
        out += [Case("sample", dtype, PROPERTY, "a seed draws the same token", _sample_reproducible),
                Case("sample", dtype, PROPERTY, "draws stay in the top k", _sample_top_k),
                Case("sample", dtype, PROPERTY, "draws stay in the nucleus", _sample_top_p),
                Case("sample", dtype, PROPERTY, "distribution T=1", partial(_sample_distribution, 1.0, 0)),
                Case("sample", dtype, PROPERTY, "distribution T=0.7 top_k=3", partial(_sample_distribution, 0.7, 3))]
        out += [Case("mask_logits", dtype, ODD, "x".join(map(str, s)), partial(_mask, s, 0.5))
                for s in ((1,), (31,), (33,))]
        out += [Case("mask_logits", dtype, CONTIGUOUS, "x".join(map(str, s)), partial(_mask, s, 0.5))
                for s in ((2, 100), (3, 4099))]
        out += [Case("mask_logits", dtype, PROPERTY, f"{what} allowed", partial(_mask, (2, 1000), allowed))
                for what, allowed in (("none", 0.0), ("all", 1.0))]
        out += [Case("penalize_logits", dtype, ODD, f"vocab {v}", partial(_penalize, v, True)) for v in (3, 17)]
        out += [Case("penalize_logits", dtype, CONTIGUOUS, "vocab 4097", partial(_penalize, 4097, True)),
                Case("penalize_logits", dtype, CONTIGUOUS, "vocab 4097 no bias", partial(_penalize, 4097, False)),
                Case("penalize_logits", dtype, PROPERTY, "ids not increasing writes nothing", _penalize_bad_ids)]
        out += [Case("logprobs", dtype, ODD if n < 100 else CONTIGUOUS, f"n={n} k={k} T={t}", partial(_logprobs, n, k, t))
                for n, k, t in ((1, 1, 1.0), (7, 0, 0.7), (33, 5, 0.0), (4099, 20, 1.3))]
        out += [Case("logprobs", dtype, PROPERTY, "ties by lower id, -inf", _logprobs_ties),
                Case("logprobs", dtype, PROPERTY, "NaN logit refused", _logprobs_nan)]
    out += [Case("argmax", float32, ALIASING, "max_val overlaps vals", _argmax_overlap),
            Case("penalize_logits", float32, ALIASING, "bias overlaps logits", _penalize_overlap),
            Case("logprobs", float32, ALIASING, "values overlaps logits", _logprobs_overlap)]
    return out


def _perf_argmax(ctx: Ctx):
    vals, _ = ctx.normal((151936,))
    idx, val = ctx.full((1,), 0, int64), ctx.nan((1,))
    return lambda: ops.argmax(idx, val, vals)


def _perf_sample(ctx: Ctx):
    logits, _ = ctx.normal((151936,), 4.0)
    out = ctx.full((1,), 0, int64)
    return lambda: ops.sample(out, logits, temperature=0.8, top_k=50, top_p=0.9, seed=1)


def _perf_mask(ctx: Ctx):
    logits, _ = ctx.normal((151936,))
    bitmask = ctx.upload(ctx.rng.integers(-(2 ** 31), 2 ** 31, 4748).astype(np.int32))
    return lambda: ops.mask_logits(logits, bitmask)


def _perf_penalize(ctx: Ctx):
    logits, _ = ctx.normal((151936,))
    ids = ctx.upload(np.sort(ctx.rng.permutation(151936)[:512]).astype(np.int64))
    counts = ctx.upload(np.ones((512, 2), np.int64))
    return lambda: ops.penalize_logits(logits, ids, counts, repetition_penalty=1.0, frequency_penalty=0.0)


def _perf_logprobs(ctx: Ctx):
    logits, _ = ctx.normal((151936,), 4.0)
    top_ids, values = ctx.full((20,), 0, int64), ctx.nan((21,), float32)
    return lambda: ops.logprobs(top_ids, values, logits, 5, 0.8)


PERF = {"argmax": ("151936", _perf_argmax), "sample": ("151936 top_k 50 top_p 0.9", _perf_sample),
        "mask_logits": ("151936", _perf_mask), "penalize_logits": ("512 ids of 151936", _perf_penalize),
        "logprobs": ("151936 top 20", _perf_logprobs)}
