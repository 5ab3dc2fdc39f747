"""The scheduler (continuous batching): a sequence's tokens are the same alone (``generate``) or batched with
others, chunked, preempted and recomputed; KV blocks shared between prompts are freed exactly once and never
across cache scopes; numerics that round by chunk never chunk, preempt or reuse."""

from __future__ import annotations

import gc

import numpy as np
import pytest

import llaisys
import llaisys_models
from helpers.tiny_models import SPECS, prompt
from llaisys_models.engine.sampling import SamplingParams
from llaisys_models.engine.scheduler import Scheduler

NAMES = ["f32_gqa2_hd32", "bf16_mha_hd64", "f16_gqa3_hd64_legacy"]
LENGTHS = (1, 5, 13, 16, 17, 40, 70)  # around and across blocks of 16 and chunks of 16
NEW = 24


@pytest.fixture
def models(loaded_models, device):
    return loaded_models(device, NAMES)


def prompts(name):
    vocab = SPECS[name].vocab
    return [prompt(name, n, vocab) for n in LENGTHS]


@pytest.mark.parametrize("name", NAMES)
def test_greedy_batch_equals_generate(models, name):
    model = models[name]
    alone = [model.generate(p, NEW, eos_token_ids=()) for p in prompts(name)]
    # 16 tokens a step: prompts are read in chunks while the others decode
    assert model.generate_batch(prompts(name), NEW, eos_token_ids=(), max_batch_tokens=16) == alone


@pytest.mark.parametrize("name", NAMES)
def test_seeded_sampling_batch_equals_generate(models, name):
    model = models[name]
    seeds = [1000 + i for i in range(len(LENGTHS))]
    sampling = dict(top_k=0, top_p=0.95, temperature=0.9)
    alone = [model.generate(p, NEW, seed=s, eos_token_ids=(), **sampling) for p, s in zip(prompts(name), seeds)]
    batched = model.generate_batch(prompts(name), NEW, seed=seeds, eos_token_ids=(), max_batch_tokens=16, **sampling)
    assert batched == alone
    other = model.generate_batch(prompts(name), NEW, seed=[s + 1 for s in seeds], eos_token_ids=(), **sampling)
    assert other != alone  # the seeds are really used


def test_each_sequence_stops_at_its_own_eos(models):
    model = models["f32_gqa2_hd32"]
    ps = prompts("f32_gqa2_hd32")
    full = [model.generate(p, NEW, eos_token_ids=()) for p in ps]
    eos = full[2][len(ps[2]) + 3]  # the 4th new token of prompt 2 plays EOS
    alone = [model.generate(p, NEW, eos_token_ids=(eos,)) for p in ps]
    assert model.generate_batch(ps, NEW, eos_token_ids=(eos,)) == alone
    assert len(alone[2]) == len(ps[2]) + 4


def greedy(max_tokens: int) -> SamplingParams:
    return SamplingParams(max_tokens, top_k=1, eos_token_ids=frozenset())  # no EOS: exactly max_tokens


def run(scheduler, sequences):
    """Step until every sequence finished by itself (at max_tokens: the scheduler stops it)."""
    while scheduler.has_work:
        scheduler.step()
    assert all(seq.finish_reason == "length" for seq in sequences)
    return [seq.tokens for seq in sequences]


@pytest.mark.parametrize("name", ["f32_gqa2_hd32", "bf16_mha_hd64"])
def test_preemption_under_a_tiny_kv_budget_completes_every_request(models, name):
    model = models[name]
    ps = prompts(name)
    sampling = SamplingParams(NEW, top_k=0, top_p=1.0, temperature=1.0, seed=5, eos_token_ids=frozenset())
    alone = [model.generate(p, NEW, top_k=0, seed=5, eos_token_ids=()) for p in ps]
    # room for the longest request and a little more: the others take turns, preempting the newest
    pool = model.new_kv_pool(num_blocks=(70 + NEW) // 16 + 3, block_size=16)
    scheduler = Scheduler(model, pool, max_running=len(ps), max_batch_tokens=32)
    sequences = [scheduler.add(p, sampling) for p in ps]
    assert run(scheduler, sequences) == alone
    assert scheduler.stats.preemptions > 0 and scheduler.stats.recomputed_tokens > 0
    assert pool.check()["used"] == 0


def test_a_request_that_can_never_fit_is_refused(models):
    model = models["f32_gqa2_hd32"]
    scheduler = Scheduler(model, model.new_kv_pool(num_blocks=2, block_size=16))
    with pytest.raises(llaisys.LlaisysValueError, match="exceed the KV cache's 32"):
        scheduler.add(list(range(30)), greedy(3))
    with pytest.raises(llaisys.LlaisysValueError, match="exceed the KV cache's 32"):
        model.generate_batch([list(range(30))], 3, kv_memory=2 * 16 * model.kv_shape.bytes_per_token)


def test_shared_prefix_blocks_are_freed_exactly_once(models, device):
    model = models["bf16_mha_hd64"]
    vocab = SPECS["bf16_mha_hd64"].vocab
    rng = np.random.default_rng(3)
    system = rng.integers(0, vocab, 45).tolist()  # ~3 blocks every request starts with
    tails = [rng.integers(0, vocab, n).tolist() for n in (3, 9, 1, 17, 30)]
    ps = [system + t for t in tails]
    alone = [model.generate(p, 12, eos_token_ids=()) for p in ps]

    pool = model.new_kv_pool(num_blocks=64, block_size=16)
    scheduler = Scheduler(model, pool, max_running=8, max_batch_tokens=64)
    run(scheduler, [scheduler.add(rng.integers(0, vocab, 20).tolist(), greedy(4))])  # warm up
    model.clear_decode_graphs()  # captured decode steps keep their buffers: counted out on both sides
    gc.collect()
    baseline = llaisys.memory_stats(device)["allocated_bytes"]

    first = scheduler.add(ps[0], greedy(12))
    run(scheduler, [first])  # the system prompt is now cached
    rest = [scheduler.add(p, greedy(12)) for p in ps[1:]]
    shared_seen = []
    while scheduler.has_work:
        shared_seen.append(max(pool.refcount(b) for b in range(pool.num_blocks)))
        scheduler.step()
    assert [first.tokens] + [s.tokens for s in rest] == alone
    assert max(shared_seen) == len(rest)  # the system prompt's blocks were held by every request at once
    assert all(s.reused >= 32 for s in rest)
    assert pool.check() == {"used": 0, "cached": pool.stats()["cached"], "free": pool.stats()["free"]}
    assert all(pool.refcount(b) == 0 for b in range(pool.num_blocks))
    model.clear_decode_graphs()
    gc.collect()
    assert llaisys.memory_stats(device)["allocated_bytes"] == baseline  # every step's tensors came back
    del scheduler, pool, first, rest
    gc.collect()
    # the pool's memory came back (and whatever step buffers the scheduler still held)
    assert llaisys.memory_stats(device)["allocated_bytes"] <= baseline - 64 * 16 * model.kv_shape.bytes_per_token


def test_cache_scopes_never_share_blocks(models):
    """Two tenants of a server: a prompt of scope "b" reuses nothing that scope "a" cached, however alike
    the prompts; the same scope reuses it, with the same tokens."""
    model = models["f32_gqa2_hd32"]
    p = prompt("f32_gqa2_hd32", 40, SPECS["f32_gqa2_hd32"].vocab)
    alone = model.generate(p, 6, eos_token_ids=())
    pool = model.new_kv_pool(num_blocks=32, block_size=16)
    scheduler = Scheduler(model, pool)
    first = scheduler.add(p, greedy(6), scope="a")
    other = scheduler.add(p, greedy(6), scope="b")
    run(scheduler, [first, other])
    again = scheduler.add(p, greedy(6), scope="a")
    stranger = scheduler.add(p, greedy(6), scope="b2")
    run(scheduler, [again, stranger])
    assert first.reused == 0 and other.reused == 0, "a scope found blocks another scope was still computing"
    assert again.reused == len(p) - 1 and stranger.reused == 0
    assert [s.tokens for s in (first, other, again, stranger)] == [alone] * 4
    assert pool.check()["used"] == 0


def test_hf_numerics_never_chunk_preempt_or_reuse(tiny_models, device):
    """numerics="hf" rounds attention by the pieces a sequence is computed in, so a chunked prefill, a reused
    prefix or a recomputed (preempted) sequence would change its tokens: under that mode the scheduler gives
    each sequence its whole length at admission and reads each prompt in one piece, and batched tokens equal
    the solo runs even in a KV budget that makes exact mode preempt."""
    name = "bf16_mha_hd64"
    model = llaisys_models.load(tiny_models.path(name), device=device, numerics="hf")
    ps = prompts(name)
    alone = [model.generate(p, NEW, eos_token_ids=()) for p in ps]
    pool = model.new_kv_pool(num_blocks=(70 + NEW) // 16 + 3, block_size=16)
    scheduler = Scheduler(model, pool, max_running=len(ps), max_batch_tokens=16)
    sequences = [scheduler.add(p, greedy(NEW)) for p in ps]
    reads = []
    real_forward = model.forward_batch

    def recording(pool, batch, logits_of=None):
        reads.extend(len(ids) for _, ids in batch)
        return real_forward(pool, batch, logits_of)

    model.forward_batch = recording
    assert run(scheduler, sequences) == alone
    assert scheduler.stats.preemptions == 0 and scheduler.stats.prompt_tokens_reused == 0
    assert sorted(n for n in reads if n > 1) == sorted(n for n in LENGTHS if n > 1), "a prompt was chunked"


def test_forks_share_the_prompt_blocks_and_draw_as_they_would_alone(models):
    """n choices of one prompt: the prompt is computed once, its full blocks held by every choice (the partly
    filled one copied), and each choice's tokens are those of its seed alone."""
    model = models["f32_gqa2_hd32"]
    p = prompt("f32_gqa2_hd32", 40, SPECS["f32_gqa2_hd32"].vocab)  # 2 full blocks of 16 and 8 positions
    seeds = [11, 12, 13, 14]
    sampling = dict(top_k=0, top_p=0.9, temperature=1.0)
    alone = [model.generate(p, NEW, seed=s, eos_token_ids=(), **sampling) for s in seeds]
    pool = model.new_kv_pool(num_blocks=64, block_size=16, prefix_caching=False)  # sharing by the fork only
    scheduler = Scheduler(model, pool, max_running=8, max_batch_tokens=16)
    params = [SamplingParams(NEW, seed=s, eos_token_ids=frozenset(), **sampling) for s in seeds]
    parent = scheduler.add(p, params[0])
    forks = [scheduler.fork(parent, q) for q in params[1:]]
    while parent.num_generated == 0:
        scheduler.step()
    assert all(f.num_generated == 1 for f in forks)  # their first tokens came from the parent's step
    assert [pool.refcount(b) for b in parent.kv.blocks[:2]] == [4, 4]  # the full blocks: held by all four
    assert len({f.kv.blocks[2] for f in forks} | {parent.kv.blocks[2]}) == 4  # the partial one: copied
    assert pool.stats()["used"] == 2 + 4
    assert scheduler.stats.prompt_tokens_computed == 40 and scheduler.stats.prompt_tokens_forked == 3 * 40
    assert run(scheduler, [parent, *forks]) == alone
    assert len(set(map(tuple, alone))) == 4  # the seeds differ, so do the choices
    assert pool.check()["used"] == 0


def test_forks_without_room_or_without_their_parent_still_complete(models):
    model = models["f32_gqa2_hd32"]
    p = prompt("f32_gqa2_hd32", 21, SPECS["f32_gqa2_hd32"].vocab)
    alone = [model.generate(p, 8, seed=s, top_k=0, eos_token_ids=()) for s in (1, 2, 3)]
    params = [SamplingParams(8, top_k=0, seed=s, eos_token_ids=frozenset()) for s in (1, 2, 3)]
    # max_running 2: the second fork cannot start with its parent and queues as a sequence of its own
    scheduler = Scheduler(model, model.new_kv_pool(num_blocks=16, block_size=16), max_running=2)
    parent = scheduler.add(p, params[0])
    forks = [scheduler.fork(parent, q) for q in params[1:]]
    assert run(scheduler, [parent, *forks]) == alone
    # a parent cancelled before its prompt is read: its forks go on alone
    parent = scheduler.add(p, params[0])
    forks = [scheduler.fork(parent, q) for q in params[1:]]
    scheduler.finish(parent, "cancelled")
    assert run(scheduler, forks) == alone[1:]
    # a fork of a finished sequence is an ordinary sequence of its prompt
    assert run(scheduler, [scheduler.fork(parent, params[2])]) == alone[2:]


def test_forks_under_a_tiny_kv_budget_are_preempted_and_recomputed_unseen(models):
    model = models["f32_gqa2_hd32"]
    vocab = SPECS["f32_gqa2_hd32"].vocab
    ps = [prompt("f32_gqa2_hd32", 37, vocab)]
    sampling = dict(top_k=0, top_p=1.0, temperature=1.0)
    alone = [[model.generate(p, NEW, seed=s, eos_token_ids=(), **sampling) for s in (21, 22, 23)] for p in ps]
    # 7 blocks: the prompt's 3, a copy of its last for each fork; at position 48 the three need 3 more, 2 are free
    pool = model.new_kv_pool(num_blocks=7, block_size=16)
    scheduler = Scheduler(model, pool, max_running=6, max_batch_tokens=32)
    groups = []
    for p in ps:
        parent = scheduler.add(p, SamplingParams(NEW, seed=21, eos_token_ids=frozenset(), **sampling))
        groups.append([parent] + [scheduler.fork(parent, SamplingParams(NEW, seed=s, eos_token_ids=frozenset(),
                                                                         **sampling)) for s in (22, 23)])
    run(scheduler, [s for g in groups for s in g])
    assert [[s.tokens for s in g] for g in groups] == alone
    assert scheduler.stats.prompt_tokens_forked == 2 * 37 and scheduler.stats.preemptions > 0
    assert pool.check()["used"] == 0


def test_forks_under_hf_numerics_hold_their_whole_length(tiny_models, device):
    """numerics="hf": a fork's KV is its parent's prompt, computed in one piece as it would be alone; each fork
    reserves its whole length when it starts, and the tokens equal the solo runs."""
    name = "bf16_mha_hd64"
    model = llaisys_models.load(tiny_models.path(name), device=device, numerics="hf")
    p = prompt(name, 29, SPECS[name].vocab)
    sampling = dict(top_k=0, top_p=0.9, temperature=1.0)
    alone = [model.generate(p, NEW, seed=s, eos_token_ids=(), **sampling) for s in (4, 5)]
    pool = model.new_kv_pool(num_blocks=16, block_size=16)
    scheduler = Scheduler(model, pool, max_running=4, max_batch_tokens=16)
    parent = scheduler.add(p, SamplingParams(NEW, seed=4, eos_token_ids=frozenset(), **sampling))
    fork = scheduler.fork(parent, SamplingParams(NEW, seed=5, eos_token_ids=frozenset(), **sampling))
    while parent.num_generated == 0:
        scheduler.step()
    assert len(fork.kv.blocks) == -(-(29 + NEW) // 16)  # reserved at once, as admission does under hf
    assert run(scheduler, [parent, fork]) == alone
    assert scheduler.stats.prompt_tokens_forked == 29
