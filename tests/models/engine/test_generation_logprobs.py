"""Log-probabilities in generation: each generated token's log-probability and top-k alternatives equal float64
torch log_softmax of HF transformers' logits, teacher-forced on our tokens (f32, 1e-4), after temperature and
after penalties; speculative (verified) rows give what plain decoding gives; off means no list at all."""

from __future__ import annotations

import pytest
import torch

from helpers.tiny_models import SPECS, prompt
from llaisys_models.engine.sampling import SamplingParams
from llaisys_models.engine.scheduler import Scheduler
from llaisys_models.engine.speculative import NgramDrafter, Speculation

NAME = "f32_gqa2_hd32"
NEW = 12


def run(model, ids, params):
    pool = model.new_kv_pool(num_blocks=16, block_size=16)
    try:
        scheduler = Scheduler(model, pool)
        seq = scheduler.add(ids, params)
        while scheduler.has_work:
            scheduler.step()
    finally:
        model.release_kv_pool(pool)
    return seq


def hf_logprobs(tiny_models, tokens, prompt_len, temperature, frequency=0.0):
    """float64 log_softmax of HF's float32 logits at each generated position (OpenAI's frequency penalty)."""
    with torch.no_grad():
        logits = tiny_models.hf(NAME)(torch.tensor([tokens])).logits[0].double()
    out = []
    for pos in range(prompt_len, len(tokens)):
        row = logits[pos - 1].clone()
        for t in set(tokens[prompt_len:pos]):
            row[t] -= tokens[prompt_len:pos].count(t) * frequency
        out.append(torch.log_softmax(row / temperature if temperature > 0 else row, dim=0))
    return out


@pytest.mark.parametrize("sampling", [dict(top_k=1), dict(temperature=0.7, seed=3), dict(temperature=1.3, seed=9,
                                                                                          frequency_penalty=0.8)])
def test_logprobs_are_hf_log_softmax(loaded_models, tiny_models, device, sampling):
    model = loaded_models(device, [NAME])[NAME]
    ids = prompt(NAME, 11, SPECS[NAME].vocab)
    params = SamplingParams(NEW, eos_token_ids=frozenset(), logprobs=5, **sampling)
    seq = run(model, ids, params)
    temperature = 0.0 if params.greedy else params.temperature
    want = hf_logprobs(tiny_models, seq.tokens, len(ids), temperature, sampling.get("frequency_penalty", 0.0))
    assert len(seq.logprobs) == NEW
    for step, (got, lp) in enumerate(zip(seq.logprobs, want)):
        token = seq.tokens[len(ids) + step]
        assert got.logprob == pytest.approx(float(lp[token]), abs=1e-4)
        top = torch.topk(lp, 5)
        assert [i for i, _ in got.top] == top.indices.tolist()
        assert [v for _, v in got.top] == pytest.approx(top.values.tolist(), abs=1e-4)


def test_speculative_rows_give_the_logprobs_of_plain_decoding(loaded_models, device):
    model = loaded_models(device, [NAME])[NAME]
    ids = prompt(NAME, 11, SPECS[NAME].vocab) * 3  # repeats: the n-gram drafter finds drafts
    plain = run(model, ids, SamplingParams(NEW, top_k=1, eos_token_ids=frozenset(), logprobs=3))
    # (single-token matches too: the random model's own text repeats few pairs of tokens)
    ngram = Speculation(NgramDrafter(min_ngram=1), 4)
    spec = run(model, ids, SamplingParams(NEW, top_k=1, eos_token_ids=frozenset(), logprobs=3, speculation=ngram))
    assert spec.draft_tokens > 0
    assert spec.tokens == plain.tokens
    for a, b in zip(spec.logprobs, plain.logprobs):
        assert a.logprob == pytest.approx(b.logprob, abs=1e-4)
        assert [i for i, _ in a.top] == [i for i, _ in b.top]


def test_logprobs_off_records_nothing(loaded_models, device):
    model = loaded_models(device, [NAME])[NAME]
    seq = run(model, prompt(NAME, 5, SPECS[NAME].vocab), SamplingParams(4, top_k=1))
    assert seq.logprobs is None
