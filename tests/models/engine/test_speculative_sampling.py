"""The distributions of speculative sampling, checked statistically with fixed seeds (so never flaky):
many draws of a verify step on synthetic logits follow the distribution plain sampling draws from, the
acceptance rate is p(draft), and the general rejection rule (a drafter with its own distribution q) gives
p whatever q is. Each check is run on a deliberately biased sampler too, and must fail there."""

from __future__ import annotations

import numpy as np
import pytest

import llaisys
from llaisys_models.engine.sampling import Sampler, SamplingParams
from llaisys_models.engine.speculative import Verifier, rejection_step, target_probs

VOCAB = 8
DRAWS = 6000
# 0.999 quantile of chi-square with VOCAB - 1 = 7 degrees of freedom: a correct sampler exceeds it once in 1000
# seeds; the seeds below are fixed, so a pass stays a pass
CHI2_7_999 = 24.32


def chi_square(tokens, p: np.ndarray) -> float:
    """Pearson's statistic of the drawn ``tokens`` against ``p`` (cells of tiny expectation pooled)."""
    counts = np.bincount(np.asarray(tokens, dtype=np.int64), minlength=p.size).astype(np.float64)
    expected = p * counts.sum()
    big = expected >= 5
    stat = float(((counts[big] - expected[big]) ** 2 / expected[big]).sum())
    rest_c, rest_e = counts[~big].sum(), expected[~big].sum()
    if rest_e > 0:
        stat += (rest_c - rest_e) ** 2 / rest_e
    elif rest_c > 0:
        return float("inf")  # drew a token of probability zero
    return stat


def logits_rows(seed=0):
    rng = np.random.default_rng(seed)
    return [rng.normal(0, 1.5, VOCAB).astype(np.float32) for _ in range(3)]


PARAMS = [SamplingParams(8, temperature=1.0), SamplingParams(8, temperature=0.7, top_k=5),
          SamplingParams(8, temperature=1.3, top_p=0.8)]


@pytest.mark.parametrize("params", PARAMS, ids=["plain", "top_k", "top_p"])
def test_target_probs_are_what_the_sample_op_draws(device, params):
    sampler = Sampler(device, llaisys.float32)
    row = logits_rows(1)[0]
    t = llaisys.from_numpy(row, device)
    p = target_probs(row, params)
    assert abs(p.sum() - 1) < 1e-12
    tokens = [sampler.select(t, params, s) for s in range(DRAWS)]
    assert chi_square(tokens, p) < CHI2_7_999
    biased = target_probs(row, SamplingParams(8, temperature=params.temperature * 1.3, top_k=params.top_k,
                                              top_p=params.top_p))
    assert chi_square(tokens, biased) > CHI2_7_999  # the test tells a wrong distribution apart


def verify_draws(device, params, drafts, verifier_cls=Verifier):
    rows = [llaisys.from_numpy(r, device) for r in logits_rows(2)[:len(drafts) + 1]]
    verifier = verifier_cls(Sampler(device, llaisys.float32))
    return [verifier.verify(rows, drafts, params, seed, 0) for seed in range(DRAWS)]


class AlwaysKeepsTheFirstDraft(Verifier):
    """A biased verifier: keeps d1 whatever the model says."""

    def verify(self, rows, drafts, params, seed, n):
        return [drafts[0], *super().verify(rows[1:], drafts[1:], params, seed, n + 1)]


@pytest.mark.parametrize("params", PARAMS, ids=["plain", "top_k", "top_p"])
def test_verified_tokens_follow_the_model_distribution(device, params):
    rows = logits_rows(2)
    p = [target_probs(r, params) for r in rows]
    d1 = int(np.argsort(p[0])[-2])  # a likely but not the likeliest token, then any token
    d2 = int(np.argmax(p[1]))
    outs = verify_draws(device, params, [d1, d2])
    first = [o[0] for o in outs]
    assert chi_square(first, p[0]) < CHI2_7_999
    kept = np.mean([o[0] == d1 for o in outs])
    assert abs(kept - p[0][d1]) < 4 * np.sqrt(p[0][d1] * (1 - p[0][d1]) / DRAWS)  # acceptance = p(d1)
    second = [o[1] for o in outs if o[0] == d1]  # after a kept d1: distributed as the next row says
    assert chi_square(second, p[1]) < CHI2_7_999
    assert all(len(o) == 3 for o in outs if o[:2] == [d1, d2])  # both kept: one more token
    assert all(len(o) == 1 for o in outs if o[0] != d1)  # a rejection ends the step

    biased = [o[0] for o in verify_draws(device, params, [d1, d2], AlwaysKeepsTheFirstDraft)]
    assert chi_square(biased, p[0]) > CHI2_7_999


def test_rejection_step_gives_p_whatever_q():
    rng = np.random.default_rng(5)
    p = rng.dirichlet(np.ones(VOCAB))
    for q in (rng.dirichlet(np.ones(VOCAB)), rng.dirichlet(np.full(VOCAB, 0.3)), p.copy()):
        draws = [rejection_step(p, q, int(rng.choice(VOCAB, p=q)), rng) for _ in range(DRAWS)]
        tokens = [token for _, token in draws]
        assert chi_square(tokens, p) < CHI2_7_999
        accepted = np.mean([kept for kept, _ in draws])
        assert abs(accepted - np.minimum(p, q).sum()) < 0.03  # the rule's acceptance rate: sum min(p, q)
    # a biased rule: on a rejection, draw from p again instead of from max(p - q, 0)
    q = rng.dirichlet(np.full(VOCAB, 0.3))
    biased = []
    for _ in range(DRAWS):
        draft = int(rng.choice(VOCAB, p=q))
        biased.append(draft if rng.random() * q[draft] < p[draft] else int(rng.choice(VOCAB, p=p)))
    assert chi_square(biased, p) > CHI2_7_999
