"""Speculative decoding: greedy tokens are the plain greedy tokens on every test model, alone and in mixed
batches, through accepted, partly accepted and rejected drafts, EOS and max_tokens inside a verify step,
preemption; the KV cache is cut back past rejected drafts (blocks freed); the draft length follows what is
kept; sampled runs are seeded and reproducible; bad arguments fail clearly. The rejection rule's
distribution: test_speculative_sampling.py."""

from __future__ import annotations

import numpy as np
import pytest

import llaisys
import llaisys_models
from helpers.tiny_models import SPECS, prompt
from llaisys_models.engine.sampling import SamplingParams
from llaisys_models.engine.scheduler import Scheduler
from llaisys_models.engine.speculative import Drafter, NgramDrafter, Speculation
from llaisys_models.engine.speculative.config import next_draft_length
from llaisys_models.engine.speculative.drafters import ngram_lookup

NEW = 20
@pytest.fixture
def models(loaded_models, device):
    return loaded_models(device, list(SPECS))


def repetitive(name: str, length: int = 40) -> list[int]:
    """A prompt that repeats a phrase, so prompt lookup finds matches."""
    phrase = prompt(name, 7, SPECS[name].vocab)
    return (phrase * (length // 7 + 1))[:length]


class Oracle(Drafter):
    """Drafts the known plain continuation, wrong at every ``wrong``-th drafted position: drafts are accepted,
    partly accepted and rejected."""

    def __init__(self, full: list[int], wrong: int = 3, vocab: int = 256):
        self.full, self.wrong, self.vocab, self.calls = full, wrong, vocab, 0

    def propose(self, seq, k):
        n = len(seq.tokens)
        drafts = list(self.full[n:n + k])
        self.calls += 1
        if self.calls % self.wrong == 0 and drafts:
            i = self.calls % len(drafts)
            drafts[i] = (drafts[i] + 1) % self.vocab
        return drafts


def run(scheduler, sequences, check=None):
    while scheduler.has_work:
        scheduler.step()
        if check:
            check(scheduler, sequences)
    return [s.tokens for s in sequences]


def check_rolled_back(scheduler, sequences):
    """After a step: every kept position belongs to a kept token, and no block is held past them."""
    for seq in sequences:
        if seq.kv is not None:
            assert seq.kv.tokens == seq.tokens[:len(seq.kv)] and len(seq.kv) == len(seq.tokens) - 1
            assert len(seq.kv.blocks) == -(-len(seq.kv) // scheduler.pool.block_size)
    assert scheduler.pool.check()["used"] == sum(len(s.kv.blocks) for s in sequences if s.kv is not None)


# -- the n-gram lookup ----------------------------------------------------------------------

def test_ngram_lookup_proposes_what_followed_the_latest_match():
    assert ngram_lookup([1, 2, 3, 4, 9, 2, 3], 3, 3, 1) == [4, 9, 2]
    assert ngram_lookup([1, 2, 3, 4, 5, 1, 2, 3, 7, 1, 2, 3], 2, 3, 1) == [7, 1]  # the latest match wins
    assert ngram_lookup([5, 6, 7, 6], 4, 3, 1) == [7, 6]  # only "6" matches: what followed it
    assert ngram_lookup([5, 6, 7, 8], 4, 3, 1) == []
    assert ngram_lookup([5, 6, 7, 6], 4, 3, 2) == []  # min_ngram 2: "7 6" never occurred before
    assert ngram_lookup([3, 3, 3], 4, 2, 1) == [3]  # the continuation stops at the end
    assert ngram_lookup([1], 4, 3, 1) == []


def test_drafter_arguments_are_checked():
    for kwargs in ({"max_ngram": 0}, {"min_ngram": 3, "max_ngram": 2}, {"max_ngram": 1.5}):
        with pytest.raises(llaisys.LlaisysValueError, match="ngram"):
            NgramDrafter(**kwargs)


# -- greedy: token for token the plain greedy output ----------------------------------------

@pytest.mark.parametrize("name", sorted(SPECS))
def test_greedy_ngram_equals_plain_on_every_model(models, name):
    model = models[name]
    for p in (repetitive(name), prompt(name, 13, SPECS[name].vocab)):
        plain = model.generate(p, NEW, eos_token_ids=())
        assert model.generate(p, NEW, eos_token_ids=(), speculative="ngram", num_speculative_tokens=4) == plain
        assert list(model.stream_generate(p, NEW, eos_token_ids=(), speculative="ngram")) == plain[len(p):]


@pytest.mark.parametrize("name", ["f32_gqa2_hd32", "bf16_mha_hd64", "f16_gqa3_hd64_legacy", "llama_f32_tied"])
def test_greedy_with_accepted_and_rejected_drafts_equals_plain(models, name):
    model = models[name]
    p = prompt(name, 21, SPECS[name].vocab)
    plain = model.generate(p, NEW, eos_token_ids=())
    for k in (1, 3, 7):
        oracle = Oracle(plain, wrong=2, vocab=SPECS[name].vocab)
        pool = model.new_kv_pool(num_blocks=8, block_size=16)
        scheduler = Scheduler(model, pool)
        seq = scheduler.add(p, SamplingParams(NEW, top_k=1, eos_token_ids=frozenset(),
                                              speculation=Speculation(oracle, k)))
        assert run(scheduler, [seq], check_rolled_back) == [plain]
        assert 0 < seq.accepted_tokens < seq.draft_tokens  # some drafts kept, some rejected
        assert scheduler.stats.steps < NEW + 1 or k == 1  # fewer forwards than tokens
        assert pool.check()["used"] == 0


@pytest.mark.parametrize("name", ["f32_gqa2_hd32", "bf16_mha_hd64"])
def test_mixed_batches_equal_plain(models, name):
    """Speculating and plain sequences, prompts being read in chunks, one step: each sequence's tokens are its
    solo plain greedy tokens."""
    model = models[name]
    vocab = SPECS[name].vocab
    ps = [repetitive(name, 30), prompt(name, 5, vocab), prompt(name, 40, vocab), repetitive(name, 17),
          prompt(name, 1, vocab)]
    plain = [model.generate(p, NEW, eos_token_ids=()) for p in ps]
    assert model.generate_batch(ps, NEW, eos_token_ids=(), max_batch_tokens=16, speculative="ngram") == plain
    pool = model.new_kv_pool(num_blocks=32, block_size=16)
    scheduler = Scheduler(model, pool, max_batch_tokens=16)
    specs = [Speculation(NgramDrafter(), 5), None, Speculation(Oracle(plain[2], vocab=vocab), 3),
             Speculation(Oracle(plain[3], wrong=1, vocab=vocab), 2), None]
    sequences = [scheduler.add(p, SamplingParams(NEW, top_k=1, eos_token_ids=frozenset(), speculation=s))
                 for p, s in zip(ps, specs)]
    assert run(scheduler, sequences) == plain
    assert scheduler.stats.accepted_tokens > 0 and scheduler.stats.draft_tokens > scheduler.stats.accepted_tokens
    assert pool.check()["used"] == 0


def test_preemption_with_speculation_equals_plain(models):
    """KV budgets in which sequences are preempted and recomputed while others verify drafts."""
    model = models["f32_gqa2_hd32"]
    vocab = SPECS["f32_gqa2_hd32"].vocab
    ps = [prompt("f32_gqa2_hd32", n, vocab) for n in (1, 5, 13, 16, 17, 40, 70)]
    plain = [model.generate(p, NEW, eos_token_ids=()) for p in ps]
    preemptions = 0
    for blocks in (6, 7, 8):  # room for the longest request and a little more: the others take turns
        for budget in (16, 32):
            pool = model.new_kv_pool(num_blocks=blocks, block_size=16)
            scheduler = Scheduler(model, pool, max_running=len(ps), max_batch_tokens=budget)
            sequences = [scheduler.add(p, SamplingParams(NEW, top_k=1, eos_token_ids=frozenset(),
                                                         speculation=Speculation(Oracle(full, vocab=vocab), 4)))
                         for p, full in zip(ps, plain)]
            assert run(scheduler, sequences) == plain
            assert scheduler.stats.accepted_tokens > 0 and pool.check()["used"] == 0
            preemptions += scheduler.stats.preemptions
    assert preemptions > 0


def test_eos_and_max_tokens_inside_a_verify_step(models):
    model = models["f32_gqa2_hd32"]
    p = prompt("f32_gqa2_hd32", 9, SPECS["f32_gqa2_hd32"].vocab)
    plain = model.generate(p, NEW, eos_token_ids=())
    eos = plain[len(p) + 6]  # the 7th new token is an EOS: the run stops right after it
    stopped = model.generate(p, NEW, eos_token_ids=(eos,))
    spec = Speculation(Oracle(plain, wrong=10**9), 5)  # always right: the EOS comes inside accepted drafts
    assert model.generate(p, NEW, eos_token_ids=(eos,), speculative=spec) == stopped
    assert stopped[-1] == eos
    for n in (1, 2, 6, 7):  # max_tokens falls inside a verify step: never more than asked
        assert model.generate(p, n, eos_token_ids=(), speculative=spec) == plain[:len(p) + n]


def test_next_draft_length():
    assert [next_draft_length(n, n, n, 6) for n in (1, 2, 3, 4, 6)] == [2, 4, 6, 6, 6]  # all kept: twice as many
    assert next_draft_length(4, 2, 2, 8) == 8  # a short draft (the match ran out), all kept: grows too
    assert [next_draft_length(6, 6, kept, 6) for kept in (0, 1, 5)] == [1, 2, 6]  # else one more than kept


def test_draft_length_follows_what_is_kept(models):
    """Each draft asks for twice the tokens of a fully kept one (up to K), one more than were kept after a
    rejection; a verify step that kept nothing also pauses drafting for a step. The tokens stay plain's."""
    model = models["f32_gqa2_hd32"]
    vocab = SPECS["f32_gqa2_hd32"].vocab
    p = prompt("f32_gqa2_hd32", 9, vocab)
    plain = model.generate(p, 40, eos_token_ids=())

    class Scripted(Drafter):
        """The plain continuation, off at position wrong[call] of some calls; records each k asked."""

        def __init__(self):
            self.asked, self.wrong = [], {1: 2, 3: 0}

        def propose(self, seq, k):
            call, n = len(self.asked), len(seq.tokens)
            self.asked.append(k)
            drafts = list(plain[n:n + k])
            if call in self.wrong:
                drafts[self.wrong[call]] = (drafts[self.wrong[call]] + 1) % vocab
            return drafts

    drafter = Scripted()
    assert model.generate(p, 40, eos_token_ids=(), speculative=drafter, num_speculative_tokens=6) == plain
    # kept 6 of 6, 2 of 6, 3 of 3, 0 of 6 (then one step without drafts), 1 of 1, 2 of 2, ...
    assert drafter.asked[:7] == [6, 6, 3, 6, 1, 2, 4]


# -- sampling: the same tokens as plain seeded sampling ---------------------------------------------------

@pytest.mark.parametrize("name", ["f32_gqa2_hd32", "bf16_mha_hd64", "llama_f32_tied"])
def test_seeded_speculative_sampling_equals_plain_sampling(models, name):
    """Each token is drawn from its row as plain decoding draws it (the point-mass rejection rule, coupled):
    the same seed gives the same tokens with or without drafts, alone or batched."""
    model = models[name]
    vocab = SPECS[name].vocab
    sampling = dict(top_k=0, top_p=0.95, temperature=0.8, eos_token_ids=())
    ps = [repetitive(name, 30), prompt(name, 18, vocab)]
    plain = [model.generate(p, NEW, seed=7 + i, **sampling) for i, p in enumerate(ps)]
    assert [model.generate(p, NEW, seed=7 + i, speculative="ngram", **sampling) for i, p in enumerate(ps)] == plain
    assert model.generate_batch(ps, NEW, seed=[7, 8], speculative="ngram", **sampling) == plain
    oracle = Oracle(plain[1], wrong=3, vocab=vocab)
    assert model.generate(ps[1], NEW, seed=8, speculative=oracle, **sampling) == plain[1]
    assert model.generate(ps[0], NEW, seed=99, speculative="ngram", **sampling) != plain[0]  # the seed is used


# -- the draft model ------------------------------------------------------------------------

def test_draft_model_greedy_equals_plain(models, tiny_models, device):
    target = models["bf16_mha_hd64"]
    twin = llaisys_models.load(tiny_models.path("bf16_mha_hd64"), device=device)  # drafts what the target says
    other = models["f32_mha_hd64_tied"]  # the same vocabulary, other weights: drafts mostly rejected
    p = prompt("bf16_mha_hd64", 19, 512)
    plain = target.generate(p, NEW, eos_token_ids=())
    pool = target.new_kv_pool(num_blocks=16, block_size=16)
    scheduler = Scheduler(target, pool)
    twin_seq = scheduler.add(p, SamplingParams(NEW, top_k=1, eos_token_ids=frozenset(),
                                               speculation=Speculation(llaisys_models.engine.speculative.DraftModelDrafter.of(
                                                   twin, target), 4)))
    assert run(scheduler, [twin_seq]) == [plain]
    assert twin_seq.accepted_tokens == twin_seq.draft_tokens > 0
    assert scheduler.stats.steps <= 1 + -(-(NEW - 1) // 5)  # 5 tokens per verify step
    drafter = llaisys_models.engine.speculative.DraftModelDrafter.of(twin, target)
    assert drafter.pool.check()["used"] == 0  # released with the sequence
    assert target.generate(p, NEW, eos_token_ids=(), speculative=other, num_speculative_tokens=3) == plain
    assert target.generate_batch([p, p[:7]], NEW, eos_token_ids=(), speculative=twin) == [
        plain, target.generate(p[:7], NEW, eos_token_ids=())]


def test_draft_model_must_share_the_vocabulary(models):
    with pytest.raises(llaisys.LlaisysValueError, match="vocabulary"):
        models["bf16_mha_hd64"].generate([1, 2], 3, speculative=models["f32_gqa2_hd32"])
    with pytest.raises(llaisys.LlaisysValueError, match="target model itself"):
        models["bf16_mha_hd64"].generate([1, 2], 3, speculative=models["bf16_mha_hd64"])


# -- bad arguments --------------------------------------------------------------------------

def test_bad_speculative_arguments_fail_clearly(models):
    model = models["f32_gqa2_hd32"]
    for kwargs, match in [({"speculative": "medusa"}, "speculative"), ({"speculative": 3}, "speculative"),
                          ({"speculative": "ngram", "num_speculative_tokens": 0}, "num_speculative_tokens"),
                          ({"speculative": "ngram", "num_speculative_tokens": 2.0}, "num_speculative_tokens"),
                          ({"num_speculative_tokens": 2}, "needs speculative")]:
        with pytest.raises(llaisys.LlaisysValueError, match=match):
            model.generate([1, 2, 3], 4, **kwargs)
        with pytest.raises(llaisys.LlaisysValueError, match=match):
            model.generate_batch([[1, 2, 3]], 4, **kwargs)


def test_hf_numerics_refuse_speculation(tiny_models, device):
    model = llaisys_models.load(tiny_models.path("bf16_mha_hd64"), device=device, numerics="hf")
    with pytest.raises(llaisys.LlaisysValueError, match="numerics='exact'"):
        model.generate([1, 2, 3], 4, speculative="ngram")
    scheduler = Scheduler(model, model.new_kv_pool(num_blocks=4))
    with pytest.raises(llaisys.LlaisysValueError, match="numerics='exact'"):
        scheduler.add([1, 2], SamplingParams(3, speculation=Speculation(NgramDrafter())))


def test_a_drafter_s_bad_tokens_are_never_run(models):
    model = models["f32_gqa2_hd32"]
    p = prompt("f32_gqa2_hd32", 8, SPECS["f32_gqa2_hd32"].vocab)

    class Wild(Drafter):
        def propose(self, seq, k):
            return [5, -1, 10**9][:k]

    assert model.generate(p, 8, eos_token_ids=(), speculative=Wild()) == model.generate(p, 8, eos_token_ids=())


def test_verify_rows_of_forward_batch_equal_decode_rows(models):
    """The basis of exactness: the logits of a verify forward over [t, d1, d2] are those of three decode steps."""
    model = models["bf16_gqa4_hd128_sharded"]
    p = prompt("bf16_gqa4_hd128_sharded", 20, 512)
    one = model.session()
    one.forward(p[:-3])
    steps = [one.forward([t]).numpy() for t in p[-3:]]
    many = model.session()
    many.forward(p[:-3])
    pool = many.pool
    many.kv.reserve(len(p))
    rows = model.forward_batch(pool, [(many.kv, p[-3:])], [3]).numpy()
    assert np.array_equal(np.concatenate(steps), rows)
