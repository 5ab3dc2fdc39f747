"""Verification: which drafted tokens a verify forward keeps, and the token it adds.

A verify forward gives the logits of K+1 rows of a sequence: after its last token, and after each of the
drafts d1 .. dK. Row i is what a plain decode step would have computed for generated token n+i (the
kernels are batch invariant under ``numerics="exact"``), so the verifier decides token n+i from row i
exactly as plain decoding would — argmax when greedy, else the ``sample`` op seeded by
``step_seed(seed, n+i)`` — and keeps going while the token it gets equals the draft: d1, d2, ... are kept
while each matches, the first mismatch is replaced by the model's own token, and when all K match the last
row gives one more. So speculative output is the plain output token for token, greedy or seeded sampling.

For sampling this *is* the rejection-sampling rule (Leviathan et al., Chen et al.) for a drafter that
proposes one token with probability one (every drafter here is deterministic): the rule keeps d with
probability min(1, p(d) / q(d)) = p(d) and otherwise draws from p without d, renormalised; drawing x ~ p
and keeping d iff x == d does both with the same probabilities, coupled to plain decoding's draw. A drafter
that samples its guesses from a distribution q (an EAGLE / Medusa head) needs the general rule,
``rejection_step``, on host probabilities ``target_probs`` (the distribution the ``sample`` op draws from).
Greedy and point-mass verification never copy a vocabulary row to the host (one id per row).

The point-mass rule runs in every verify step: ``sampling.Verifier`` (beside the ``Sampler`` whose choices it
repeats row by row), called by the model runner (runner.py). This file keeps the general rule.
"""

from __future__ import annotations

import numpy as np

from ..sampling import SamplingParams

# -- the general rule, for drafters that sample their guesses ---------------------------------------------

def target_probs(logits: np.ndarray, params: SamplingParams) -> np.ndarray:
    """The float64 distribution [vocab] that ``sample(logits, temperature, top_k, top_p)`` draws from:
    softmax(logits / temperature) over the top_k largest logits (0: all; ties by lower index), then over the
    smallest set of the most probable of those whose probability reaches top_p."""
    z = np.asarray(logits, dtype=np.float64).reshape(-1) / params.temperature
    vocab = z.size
    k = params.top_k if 0 < params.top_k < vocab else vocab
    if k < vocab:
        threshold = np.partition(z, vocab - k)[vocab - k]  # the k-th largest
        above = np.flatnonzero(z > threshold)
        keep = np.concatenate([above, np.flatnonzero(z == threshold)[:k - above.size]])
    else:
        keep = np.arange(vocab)
    weights = np.exp(z[keep] - z[keep].max())
    if params.top_p < 1.0:
        order = np.lexsort((keep, -z[keep]))  # most probable first, lower index first among equals
        cumulative = np.cumsum(weights[order])
        count = int(np.searchsorted(cumulative, params.top_p * cumulative[-1], side="left")) + 1
        chosen = order[:min(count, order.size)]
        keep, weights = keep[chosen], weights[chosen]
    p = np.zeros(vocab, dtype=np.float64)
    p[keep] = weights / weights.sum()
    return p


def rejection_step(p: np.ndarray, q: np.ndarray, draft: int, rng: np.random.Generator) -> tuple[bool, int]:
    """One position of speculative sampling: ``draft`` was drawn from ``q``; keep it with probability
    min(1, p(draft) / q(draft)), else draw from max(p - q, 0) renormalised. Returns (kept, token); the token
    is distributed as ``p`` whatever ``q`` is."""
    if rng.random() * q[draft] < p[draft]:
        return True, draft
    residual = np.maximum(p - q, 0.0)
    cumulative = np.cumsum(residual)
    token = int(np.searchsorted(cumulative, rng.random() * cumulative[-1], side="right"))
    return False, min(token, p.size - 1)
