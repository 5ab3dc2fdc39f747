"""Repetition control and logit_bias in generation: greedy tokens identical to HF transformers'
``generate(repetition_penalty=...)`` in float32 (eager, decode graphs, numerics="hf"); frequency / presence
checked step by step against a float64 reference of OpenAI's formula on HF's logits; logit_bias bans and
forces; batched, preempted and speculative runs give the tokens of a run alone; the incremental counts equal a
recount; bad values fail naming the argument."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import llaisys
import llaisys_models
from helpers.tiny_models import EOS_ID, SPECS, prompt
from llaisys_models.engine.penalties import TokenCounts
from llaisys_models.engine.sampling import SamplingParams
from llaisys_models.engine.scheduler import Scheduler
from llaisys_models.engine.speculative import NgramDrafter

F32_MODELS = ["f32_gqa2_hd32", "f32_mha_hd64_tied", "llama_f32_tied"]
NEW = 24


@pytest.fixture
def models(loaded_models, device):
    return loaded_models(device, F32_MODELS)


def hf_greedy(tiny_models, name, ids, new, **kwargs) -> list[int]:
    hf = tiny_models.hf(name)
    with torch.no_grad():
        x = torch.tensor([ids])
        out = hf.generate(x, attention_mask=torch.ones_like(x), max_new_tokens=new, do_sample=False, top_k=None,
                          top_p=None, temperature=None, pad_token_id=EOS_ID, **kwargs)
    return out[0].tolist()


@pytest.mark.parametrize("name", F32_MODELS)
@pytest.mark.parametrize("penalty", [1.3, 0.8])
def test_repetition_penalty_greedy_is_hf_token_for_token(models, tiny_models, name, penalty):
    model = models[name]
    for length in (13, 40):
        ids = prompt(name, length, SPECS[name].vocab)
        want = hf_greedy(tiny_models, name, ids, NEW, repetition_penalty=penalty)
        assert model.generate(ids, NEW, repetition_penalty=penalty) == want, (length, penalty)
        assert want != model.generate(ids, NEW), "the penalty changed nothing"


def test_repetition_penalty_on_decode_graphs_and_eager_and_hf_numerics(tiny_models, monkeypatch):
    """Every path that produces logits: replayed decode graphs, eager steps, numerics='hf'."""
    name = "f32_gqa2_hd32"
    ids = prompt(name, 13, SPECS[name].vocab)
    want = hf_greedy(tiny_models, name, ids, NEW, repetition_penalty=1.3)
    graphed = llaisys_models.load(tiny_models.path(name), device="cpu")
    assert graphed.generate(ids, NEW, repetition_penalty=1.3) == want
    assert graphed._decode_graphs.replays > NEW // 2, "the decode steps did not replay graphs"
    hf_numerics = llaisys_models.load(tiny_models.path(name), device="cpu", numerics="hf")
    assert hf_numerics.generate(ids, NEW, repetition_penalty=1.3) == want
    monkeypatch.setenv("LLAISYS_GRAPHS", "0")
    eager = llaisys_models.load(tiny_models.path(name), device="cpu")
    assert eager.generate(ids, NEW, repetition_penalty=1.3) == want
    assert eager._decode_graphs.replays == 0


def openai_reference(logits: torch.Tensor, generated: list[int], frequency: float, presence: float) -> torch.Tensor:
    """OpenAI's formula in float64: mu[j] - c[j] * frequency - (c[j] > 0) * presence."""
    out = logits.to(torch.float64).clone()
    for token in set(generated):
        c = generated.count(token)
        out[token] -= c * frequency + presence
    return out


@pytest.mark.parametrize("frequency,presence", [(0.8, 0.0), (0.0, 1.5), (1.2, -0.5), (-2.0, 2.0)])
def test_frequency_and_presence_penalties_match_openai_formula(models, tiny_models, frequency, presence):
    """Teacher-forced on our own tokens: each is the argmax of HF's float32 logits after the float64 formula."""
    name = "f32_gqa2_hd32"
    ids = prompt(name, 13, SPECS[name].vocab)
    ours = models[name].generate(ids, NEW, frequency_penalty=frequency, presence_penalty=presence,
                                 eos_token_ids=())
    assert ours != models[name].generate(ids, NEW, eos_token_ids=()), "the penalties changed nothing"
    hf = tiny_models.hf(name)
    with torch.no_grad():
        logits = hf(torch.tensor([ours])).logits[0].to(torch.float64)  # row i: the logits after ours[:i + 1]
    for step in range(NEW):
        at = len(ids) + step
        adjusted = openai_reference(logits[at - 1], ours[len(ids):at], frequency, presence)
        top = adjusted.max()
        chosen = ours[at]
        # a near-tie (f32 forward vs HF's own f32) is the only excuse: within 1e-4 of the maximum
        assert adjusted[chosen] >= top - 1e-4 * max(1.0, abs(float(top))), (step, chosen, int(adjusted.argmax()))


def test_logit_bias_bans_and_forces(models):
    name = "f32_gqa2_hd32"
    model = models[name]
    ids = prompt(name, 13, SPECS[name].vocab)
    plain = model.generate(ids, NEW, eos_token_ids=())[len(ids):]
    banned = plain[0]
    with_ban = model.generate(ids, NEW, eos_token_ids=(), logit_bias={banned: -100})[len(ids):]
    assert banned not in with_ban and with_ban != plain
    forced = next(t for t in range(SPECS[name].vocab) if t not in plain)
    assert model.generate(ids, NEW, eos_token_ids=(), logit_bias={forced: 100})[len(ids):] == [forced] * NEW
    sampled = model.generate(ids, NEW, top_k=0, temperature=1.0, seed=3, eos_token_ids=(),
                             logit_bias={forced: 100})[len(ids):]
    assert sampled == [forced] * NEW  # e^100 outweighs the rest of the vocabulary: sampling too


PENALTY_SETS = [dict(repetition_penalty=1.3), dict(frequency_penalty=0.9, presence_penalty=0.4),
                dict(repetition_penalty=0.9, frequency_penalty=-0.5, logit_bias={7: 5.0, 9: -100.0}), {},
                dict(presence_penalty=1.0, logit_bias={11: 3.0})]


@pytest.mark.parametrize("name", ["f32_mha_hd64_tied", "bf16_mha_hd64"])
def test_batched_preempted_and_alone_are_the_same(loaded_models, device, name):
    """A batch mixing penalties, biases, plain, greedy and seeded sampling, in a pool small enough to preempt:
    each sequence gets the tokens it gets alone (bf16 logits too: penalized in f32, rounded once)."""
    model = loaded_models(device, [name])[name]
    prompts = [prompt(name, n, SPECS[name].vocab) for n in (5, 17, 9, 30, 12)]
    sampling = [dict(), dict(top_k=0, temperature=0.8, seed=11), dict(), dict(top_k=20, top_p=0.9, seed=5), dict()]
    alone = [model.generate(p, NEW, eos_token_ids=(), **s, **k) for p, s, k in zip(prompts, sampling, PENALTY_SETS)]
    pool = model.new_kv_pool(num_blocks=9, block_size=16)  # 144 positions for ~220: preemption
    try:
        scheduler = Scheduler(model, pool, max_running=5, max_batch_tokens=32)
        sequences = []
        for p, s, k in zip(prompts, sampling, PENALTY_SETS):
            bias = tuple(sorted(k.get("logit_bias", {}).items()))
            params = SamplingParams(NEW, top_k=s.get("top_k", 1), temperature=s.get("temperature", 1.0),
                                    top_p=s.get("top_p", 1.0), seed=s.get("seed"), eos_token_ids=frozenset(),
                                    repetition_penalty=k.get("repetition_penalty", 1.0),
                                    frequency_penalty=k.get("frequency_penalty", 0.0),
                                    presence_penalty=k.get("presence_penalty", 0.0), logit_bias=bias)
            sequences.append(scheduler.add(p, params))
        while scheduler.has_work:
            scheduler.step()
        assert scheduler.stats.preemptions > 0
    finally:
        model.release_kv_pool(pool)
    assert [s.tokens for s in sequences] == alone
    assert model.generate_batch(prompts, NEW, eos_token_ids=(), repetition_penalty=1.3) == \
        [model.generate(p, NEW, eos_token_ids=(), repetition_penalty=1.3) for p in prompts]


def test_choices_of_one_prompt_with_penalties_draw_as_they_would_alone(models):
    """n choices of one prompt (forks) draw their first tokens from the same logits row: each applies its
    penalties and logit_bias to a copy of its own, so every choice, the first included, gets its seed's tokens."""
    name = "f32_gqa2_hd32"
    model = models[name]
    p = prompt(name, 20, SPECS[name].vocab)
    penalties = dict(repetition_penalty=1.8, presence_penalty=1.5, logit_bias={3: 4.0})
    seeds = [1, 2, 3, 4]
    alone = [model.generate(p, 8, top_k=0, seed=s, eos_token_ids=(), **penalties) for s in seeds]
    pool = model.new_kv_pool(num_blocks=16, block_size=16)
    try:
        scheduler = Scheduler(model, pool)
        params = [SamplingParams(8, top_k=0, seed=s, eos_token_ids=frozenset(), repetition_penalty=1.8,
                                 presence_penalty=1.5, logit_bias=((3, 4.0),)) for s in seeds]
        parent = scheduler.add(p, params[0])
        forks = [scheduler.fork(parent, q) for q in params[1:]]
        while scheduler.has_work:
            scheduler.step()
        assert scheduler.stats.prompt_tokens_forked == 3 * len(p)
    finally:
        model.release_kv_pool(pool)
    assert [s.tokens for s in (parent, *forks)] == alone


@pytest.mark.parametrize("penalties", PENALTY_SETS[:3], ids=["repetition", "frequency-presence", "all"])
def test_speculative_decoding_with_penalties_is_plain_decoding(models, penalties):
    """Row i of a verify step is penalized with the drafts kept before it counted: the plain tokens."""
    name = "f32_gqa2_hd32"
    model = models[name]
    phrase = prompt(name, 7, SPECS[name].vocab)
    ids = (phrase * 6)[:40]  # repeats: prompt lookup drafts, and some drafts are kept
    for sampling in (dict(), dict(top_k=0, temperature=0.7, seed=2)):
        plain = model.generate(ids, 32, eos_token_ids=(), **sampling, **penalties)
        before = model.generator.scheduler.stats.accepted_tokens
        ngram = NgramDrafter(min_ngram=1)  # (single-token matches too: the random model repeats few pairs)
        assert model.generate(ids, 32, eos_token_ids=(), speculative=ngram, **sampling, **penalties) == plain
        if not sampling:
            assert model.generator.scheduler.stats.accepted_tokens > before, "no draft was kept: nothing tested"


def test_token_counts_are_kept_incrementally_as_a_recount_gives(device):
    rng = np.random.default_rng(0)
    prompt_ids = rng.integers(0, 50, 30).tolist()
    params = SamplingParams(10, repetition_penalty=1.2, frequency_penalty=0.1, logit_bias=((3, 1.0), (77, -2.0)))
    counts = TokenCounts(prompt_ids, params)
    generated = []
    for token in rng.integers(0, 90, 200).tolist():
        counts.add(token)
        generated.append(token)
    counts.add(generated[-1], -1)  # a tentative token taken back
    generated.pop()
    expected = {t: (prompt_ids.count(t), generated.count(t)) for t in set(prompt_ids) | set(generated) | {3, 77}}
    n = counts.n
    assert list(counts.ids[:n]) == sorted(expected)
    assert [tuple(c) for c in counts.counts[:n]] == [expected[t] for t in sorted(expected)]
    assert {int(t): float(b) for t, b in zip(counts.ids[:n], counts.bias[:n]) if b} == {3: 1.0, 77: -2.0}


@pytest.mark.parametrize("kwargs,needle", [
    (dict(repetition_penalty=0), "repetition_penalty must be > 0"),
    (dict(repetition_penalty=float("inf")), "repetition_penalty must be a finite number"),
    (dict(frequency_penalty=2.5), r"frequency_penalty must be >= -2.0 and <= 2.0"),
    (dict(presence_penalty="1"), "presence_penalty must be a finite number"),
    (dict(logit_bias={384: 1.0}), r"logit_bias: 384 is not a token id in \[0, 384\)"),
    (dict(logit_bias={"5": 1.0}), r"logit_bias: '5' is not a token id"),
    (dict(logit_bias={5: 101}), r"logit_bias\[5\] must be >= -100.0 and <= 100.0"),
    (dict(logit_bias=[5]), "logit_bias must be a mapping"),
])
def test_bad_penalties_name_the_argument(models, kwargs, needle):
    model = models["f32_gqa2_hd32"]
    for call in (lambda: model.generate([1, 2], 3, **kwargs), lambda: model.stream_generate([1, 2], 3, **kwargs),
                 lambda: model.generate_batch([[1, 2]], 3, **kwargs)):
        with pytest.raises(llaisys.LlaisysValueError, match=needle):
            call()
