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
"""

from __future__ import annotations

import numpy as np

import llaisys

from ..penalties import TokenCounts
from ..sampling import Sampler, SamplingParams, step_seed


class Verifier:
    """Decides a verify step's tokens on one device (the ``Sampler``'s argmax / sample buffers)."""

    def __init__(self, sampler: Sampler):
        self.sampler = sampler

    def verify(self, rows: list[llaisys.Tensor], drafts: list[int], params: SamplingParams, seed: int,
               n: int, counts: TokenCounts | None = None, matcher=None, logprobs: list | None = None) -> list[int]:
        """The new tokens of a sequence that drafted ``drafts`` (maybe none): ``rows`` are the 1-D logits of
        its last len(drafts)+1 rows, ``n`` the index of its next generated token, ``counts`` its tokens so far
        (penalties, logit_bias) or None. Returns the drafts that matched and the model's token after them (1 to
        len(drafts)+1 tokens). Row i is penalized as plain decoding would penalize token n+i: with the drafts
        kept before it counted (for the call only: the scheduler counts what it keeps). A grammar ``matcher``
        constrains the choice (the scheduler never drafts for a sequence that has one). ``logprobs``: a list
        that gets each returned token's ``TokenLogprob`` (from its own row) where ``params.logprobs`` is set."""
        if len(rows) != len(drafts) + 1:
            raise ValueError(f"{len(rows)} logit rows for {len(drafts)} drafted tokens")
        out: list[int] = []
        try:
            for i, row in enumerate(rows):
                if counts is not None and out:
                    counts.add(out[-1])
                token = self.sampler.select(row, params, step_seed(seed, n + i), counts, matcher)
                out.append(token)
                if logprobs is not None and params.logprobs is not None:
                    logprobs.append(self.sampler.logprobs(row, token, params))
                if i == len(drafts) or token != drafts[i]:
                    break
        finally:
            if counts is not None:
                for token in out[:-1]:
                    counts.add(token, -1)
        return out


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
