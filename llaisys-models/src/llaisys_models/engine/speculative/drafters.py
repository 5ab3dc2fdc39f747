"""Drafters: who guesses a sequence's next tokens for the verifier.

A drafter is deterministic: the same tokens so far give the same drafts. The verifier treats a draft as a
proposal of probability one (a point mass), for which the rejection-sampling rule is "keep the draft iff the
model draws it" (verify.py). A drafter that samples its guesses (an EAGLE / Medusa head with its own
distribution q) would hand the verifier q too, for ``verify.rejection_step``; nothing does yet.
"""

from __future__ import annotations

import numpy as np

import llaisys


class Drafter:
    """Proposes up to ``k`` tokens to follow ``seq.tokens`` (a ``scheduler.Sequence``).

    ``propose`` may return fewer (none: the sequence decodes one token this step). ``release(seq)`` is called
    when the sequence leaves the scheduler: a drafter with per-sequence state drops it there.
    """

    def propose(self, seq, k: int) -> list[int]:
        raise NotImplementedError

    def release(self, seq) -> None:
        """``seq`` is finished: forget what is kept for it (nothing, for a stateless drafter)."""


class NgramDrafter(Drafter):
    """Prompt lookup: find the last ``n`` tokens earlier in the sequence (prompt and text so far) and propose
    the tokens that followed them there. Tries ``max_ngram`` down to ``min_ngram``; the most recent earlier
    match wins (rewrites, summaries and code edits copy spans of their input).

    ``min_ngram`` 2 by default: a single repeated token (a comma, "the") predicts what follows it badly. On
    SmolLM2-135M-Instruct (benchmarks/speculative.py, 7 rounds, one run) going from 1 to 2 raised the kept
    share of drafts from 92 / 62 / 8 / 5% to 100 / 75 / 50 / 18% (rewrite / summarise / code / story) and the
    speed-up from 3.30 / 1.69 / 1.03 / 1.03x to 3.65 / 1.90 / 1.24 / 1.03x."""

    def __init__(self, max_ngram: int = 3, min_ngram: int = 2):
        for name, value in (("max_ngram", max_ngram), ("min_ngram", min_ngram)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise llaisys.LlaisysValueError(f"{name} must be an integer >= 1, got {value!r}")
        if min_ngram > max_ngram:
            raise llaisys.LlaisysValueError(f"min_ngram = {min_ngram} is larger than max_ngram = {max_ngram}")
        self.max_ngram, self.min_ngram = max_ngram, min_ngram

    def __repr__(self) -> str:
        return f"NgramDrafter(max_ngram={self.max_ngram}, min_ngram={self.min_ngram})"

    def propose(self, seq, k: int) -> list[int]:
        return ngram_lookup(seq.tokens, k, self.max_ngram, self.min_ngram)


def ngram_lookup(tokens: list[int], k: int, max_ngram: int, min_ngram: int) -> list[int]:
    """Up to ``k`` tokens that followed the most recent earlier occurrence of the longest suffix of
    ``tokens`` (``max_ngram`` .. ``min_ngram`` long) that occurs earlier."""
    length = len(tokens)
    if k < 1 or length < min_ngram + 1:
        return []
    ids = np.asarray(tokens, dtype=np.int64)
    for n in range(min(max_ngram, length - 1), min_ngram - 1, -1):
        # windows ending before the suffix itself: start s in [0, length - n - 1], continuation at s + n
        hit = np.ones(length - n, dtype=bool)
        for j in range(n):
            hit &= ids[j:length - n + j] == ids[length - n + j]
        found = np.flatnonzero(hit)
        if found.size:
            end = int(found[-1]) + n
            return ids[end:end + k].tolist()
    return []
