"""The scheduling policy with a scripted runner (no model): admission, the batch token budget, preemption and
recomputation, fairness, forks (n choices), drafts, stops and finish reasons, whole-sequence numerics.

The runner (helpers/fake_runner.py) draws each sequence's tokens from its own tokens and seed, so "the same tokens
as alone" holds here exactly when the scheduler feeds each sequence what a plain run would: what the
model-backed tests (test_scheduler.py, test_speculative.py) check with real kernels, this checks for the policy.
"""

from __future__ import annotations

import pytest

import llaisys
from helpers.fake_runner import EOS, ScriptedDrafter, ScriptedRunner, alone, next_token, run, scheduler
from llaisys_models.engine.plan import StepPlan
from llaisys_models.engine.sampling import SamplingParams
from llaisys_models.engine.speculative import Speculation


def params(max_tokens: int, seed: int = 1, **kwargs: object) -> SamplingParams:
    return SamplingParams(max_tokens, seed=seed, eos_token_ids=frozenset(), **kwargs)


def prompt(n: int, start: int = 1) -> list[int]:
    return [(start + i) % 60 + 1 for i in range(n)]


def test_step_is_schedule_then_run_then_commit() -> None:
    """``schedule()`` plans and reserves but appends nothing; the runner writes the planned tokens' KV; ``commit``
    appends what it drew. An empty scheduler plans nothing (and counts no step)."""
    sched, runner = scheduler()
    assert not sched.schedule() and sched.step() == [] and runner.steps == [[]] and sched.stats.steps == 0
    seq = sched.add(prompt(6), params(3))
    plan = sched.schedule()
    assert isinstance(plan, StepPlan) and [s.seq for s in plan.scheduled] == [seq]
    assert plan.scheduled[0].input_ids == prompt(6) and plan.scheduled[0].num_logits == 1 and plan.num_tokens == 6
    assert seq.num_generated == 0 and len(seq.kv) == 0 and len(seq.kv.blocks) == 2  # reserved, not written
    results = runner.execute(plan)
    assert len(seq.kv) == 6 and seq.num_generated == 0
    events = sched.commit(results)
    assert events == [(seq, alone(prompt(6), 1, 1)[-1])] and seq.num_generated == 1
    run(sched)
    assert seq.tokens == alone(prompt(6), 1, 3) and seq.finish_reason == "length"
    assert sched.stats.steps == 3 and sched.pool.check()["used"] == 0


def test_admission_stops_at_max_running_and_goes_in_arrival_order() -> None:
    sched, runner = scheduler(max_running=2)
    seqs = [sched.add(prompt(3, i), params(4 + i, seed=i)) for i in range(5)]
    admitted = []
    while sched.has_work:
        sched.step()
        assert len(sched.running) <= 2 and len(runner.steps[-1]) <= 2
        admitted.extend(s.id for s in sched.running if s.id not in admitted)
    assert admitted == [s.id for s in seqs]  # oldest first
    assert [s.tokens for s in seqs] == [alone(prompt(3, i), i, 4 + i) for i in range(5)]


def test_admission_waits_for_blocks_keeping_one_of_growth_per_running_sequence() -> None:
    """A prompt is admitted when the pool holds its blocks plus a block of growth for every running sequence."""
    sched, runner = scheduler(num_blocks=6, block_size=4)
    first = sched.add(prompt(12), params(2))  # 3 blocks
    second = sched.add(prompt(9, 5), params(2, seed=2))  # 3 blocks: 3 + 1 (growth of the first) > 3 free
    sched.step()
    assert sched.running == [first] and list(sched.waiting) == [second]
    run(sched)
    assert second.tokens == alone(prompt(9, 5), 2, 2) and sched.stats.preemptions == 0


def test_decoding_goes_first_and_prompts_are_chunked_within_the_token_budget() -> None:
    """Each step runs one token of every decoding sequence, then prompt chunks (the rest of the budget shared
    between the prompts: test_fair_scheduling.py), up to ``max_batch_tokens`` rows in all; the sequences' tokens
    are those of plain runs."""
    sched, runner = scheduler(num_blocks=128, max_batch_tokens=8)
    lengths = (5, 20, 3, 11)
    seqs = [sched.add(prompt(n, n), params(6, seed=n)) for n in lengths]
    run(sched)
    for step in runner.steps:
        assert sum(p.num_tokens + len(p.drafts) for p in step) <= 8
        decoding = [p for p in step if p.num_tokens == 1 and p.num_logits]
        chunks = [p for p in step if p not in decoding]
        assert [p.id for p in step] == sorted(p.id for p in step)  # oldest first
        # a prompt is cut short of its end only where the budget is used up (the budget is never left unused)
        if any(not p.num_logits for p in chunks):
            assert sum(p.num_tokens + len(p.drafts) for p in step) == 8
    assert [s.tokens for s in seqs] == [alone(prompt(n, n), n, 6) for n in lengths]
    reads = [p.num_tokens for step in runner.steps for p in step if p.id == seqs[1].id and p.num_tokens > 1]
    assert sum(reads) == 20 and max(reads) <= 8  # the 20-token prompt was read in chunks


def test_a_new_request_gets_its_first_token_within_bounded_steps() -> None:
    """Fairness: however long the others run, a new prompt is read with the budget the decoding sequences
    leave (max_batch_tokens - their count), so its first token comes within ceil(prompt / that) steps."""
    sched, runner = scheduler(num_blocks=256, max_running=4, max_batch_tokens=16)
    for i in range(3):
        sched.add(prompt(4, i), params(200, seed=i))
    for _ in range(5):
        sched.step()
    late = sched.add(prompt(40, 9), params(3, seed=9))
    steps = 0
    while late.num_generated == 0:
        sched.step()
        steps += 1
    assert steps <= -(-40 // (16 - 3))
    assert all(s.num_generated == 5 + steps for s in sched.running if s is not late)  # nobody waited for it


def test_preemption_frees_the_newest_and_recomputes_it_first() -> None:
    """A decoding sequence that needs a block and finds none preempts the newest running sequence: its blocks
    are freed, it waits at the head of the queue (before newer requests) and, readmitted, recomputes its prompt
    and generated tokens, then goes on with the tokens it would have drawn anyway."""
    sched, runner = scheduler(num_blocks=8, block_size=4, prefix_caching=False, max_batch_tokens=64)
    seqs = [sched.add(prompt(6, i), params(14, seed=i)) for i in range(3)]
    newer = None
    while sched.has_work:
        before = {s.id: s for s in sched.running}
        sched.step()
        lost = {i for i, s in before.items() if s.kv is None and not s.finished}
        if lost:
            assert lost == {max(before)}  # the newest running sequence
            if newer is None:
                newer = sched.add(prompt(2, 40), params(2, seed=40))
            assert sched.waiting[0].id in lost  # at the head of the queue, before the newer request
    assert sched.stats.preemptions > 0 and sched.stats.recomputed_tokens > 0
    assert [s.tokens for s in seqs] == [alone(prompt(6, i), i, 14) for i in range(3)]
    assert newer is not None and newer.tokens == alone(prompt(2, 40), 40, 2)
    assert sum(s.preemptions for s in seqs) == sched.stats.preemptions
    assert sched.pool.check()["used"] == 0


def test_recomputation_reuses_cached_blocks_of_the_preempted_sequence() -> None:
    sched, runner = scheduler(num_blocks=8, block_size=4, prefix_caching=True, max_batch_tokens=64)
    seqs = [sched.add(prompt(6, i), params(14, seed=i)) for i in range(3)]
    run(sched)
    assert [s.tokens for s in seqs] == [alone(prompt(6, i), i, 14) for i in range(3)]
    assert sched.stats.preemptions > 0
    assert sched.stats.prompt_tokens_reused == 0  # at first admission nothing was cached


def test_prefix_blocks_are_reused_within_a_scope_only() -> None:
    sched, runner = scheduler(num_blocks=32, block_size=4)
    p = prompt(10)
    first = sched.add(p, params(2), scope="a")
    run(sched)
    again, stranger = sched.add(p, params(2), scope="a"), sched.add(p, params(2), scope="b")
    run(sched)
    assert again.reused == 9 and stranger.reused == 0  # (the last token is always computed)
    assert sched.stats.prompt_tokens_reused == 9 and sched.stats.prompt_tokens_computed == 10 + 1 + 10
    assert first.tokens == again.tokens == stranger.tokens == alone(p, 1, 2)
    reads = {p_.id: p_.num_tokens for step in runner.steps for p_ in step if p_.num_tokens > 1}
    assert again.id not in reads and reads[stranger.id] == 10


def test_forks_start_from_the_parents_blocks_in_the_step_that_reads_its_prompt() -> None:
    """n choices: the prompt is computed once; in the step that reads its end every fork takes the parent's blocks
    (full ones shared, the partial one copied) and draws its first token with its own seed."""
    sched, runner = scheduler(num_blocks=32, block_size=4, prefix_caching=False, max_batch_tokens=4)
    p = prompt(10)
    parent = sched.add(p, params(5, seed=1))
    forks = [sched.fork(parent, params(5, seed=s)) for s in (2, 3, 4)]
    while parent.num_generated == 0:
        sched.step()
    assert [f.num_generated for f in forks] == [1, 1, 1] and runner.steps[-1][0].forks == tuple(f.id for f in forks)
    assert [sched.pool.refcount(b) for b in parent.kv.blocks[:2]] == [4, 4]
    assert len({f.kv.blocks[2] for f in forks} | {parent.kv.blocks[2]}) == 4
    run(sched)
    assert [s.tokens for s in (parent, *forks)] == [alone(p, s, 5) for s in (1, 2, 3, 4)]
    assert sched.stats.prompt_tokens_computed == 10 and sched.stats.prompt_tokens_forked == 30
    assert sched.pool.check()["used"] == 0


def test_a_fork_without_room_waits_and_runs_as_a_sequence_of_its_own() -> None:
    """Forks count against max_running: one that finds no room when the prompt is read queues (the token the
    runner drew for it is dropped) and later reads the prompt itself, drawing the same tokens."""
    sched, runner = scheduler(num_blocks=32, block_size=4, max_running=2)
    p = prompt(7)
    parent = sched.add(p, params(3, seed=1))
    started, queued = sched.fork(parent, params(3, seed=2)), sched.fork(parent, params(3, seed=3))
    sched.step()
    assert started.num_generated == 1 and queued.num_generated == 0 and list(sched.waiting) == [queued]
    assert queued.parent is None and queued.kv is None
    run(sched)
    assert [s.tokens for s in (parent, started, queued)] == [alone(p, s, 3) for s in (1, 2, 3)]
    assert sched.stats.prompt_tokens_forked == 7


def test_forks_of_a_cancelled_parent_go_on_alone() -> None:
    sched, runner = scheduler(max_batch_tokens=4)
    p = prompt(10)
    parent = sched.add(p, params(3))
    fork = sched.fork(parent, params(3, seed=2))
    sched.step()  # a chunk of the prompt
    sched.finish(parent)
    assert parent.finish_reason == "cancelled" and parent.kv is None and fork.parent is None
    run(sched)
    assert fork.tokens == alone(p, 2, 3) and fork.finish_reason == "length"


def test_stops_at_eos_and_at_max_tokens_and_frees_the_blocks() -> None:
    sched, runner = scheduler(num_blocks=16, block_size=4)
    p = prompt(5)
    eos = alone(p, 1, 6)[len(p) + 2]  # the third new token plays EOS
    stopped = sched.add(p, SamplingParams(6, seed=1, eos_token_ids=frozenset({eos})))
    long = sched.add(p, params(6))
    zero = sched.add(p, params(0))
    run(sched)
    assert stopped.tokens == alone(p, 1, 3) and stopped.finish_reason == "stop"
    assert long.tokens == alone(p, 1, 6) and long.finish_reason == "length"
    assert zero.finish_reason == "length" and zero.tokens == p and zero.kv is None
    assert sched.pool.check()["used"] == 0
    model_eos = sched.add(p, SamplingParams(4, seed=1))  # the model's EOS (0), never drawn here: runs to length
    run(sched)
    assert model_eos.eos == frozenset({EOS}) and model_eos.finish_reason == "length"


@pytest.mark.parametrize("right", [0, 1, 2, 4])
def test_drafts_are_verified_and_rejected_ones_cut_from_the_kv_cache(right: int) -> None:
    """Kept drafts are appended with the runner's own token after them; the KV of rejected drafts is cut back
    (blocks freed); the draft length adapts; the tokens are those of plain decoding."""
    sched, runner = scheduler(num_blocks=64, block_size=4)
    drafter = ScriptedDrafter(right)
    p = prompt(6)
    seq = sched.add(p, params(20, speculation=Speculation(drafter, 4)))
    while sched.has_work:
        sched.step()
        if seq.kv is not None:
            assert len(seq.kv) == len(seq.tokens) - 1  # nothing past the kept tokens stays cached
            assert len(seq.kv.blocks) <= -(-len(seq.tokens) // 4) + 1
    assert seq.tokens == alone(p, 1, 20)
    drafted = [len(p_.drafts) for step in runner.steps for p_ in step if p_.drafts]
    assert sched.stats.draft_tokens == seq.draft_tokens == sum(drafted) > 0
    assert sched.stats.accepted_tokens == seq.accepted_tokens
    if right >= 4:
        assert seq.accepted_tokens == seq.draft_tokens and sched.stats.steps < 20
    elif right == 0:
        assert seq.accepted_tokens == 0 and seq.draft_pause + seq.draft_misses > 0  # it drafts less and less
    assert drafter.released == [seq.id] and sched.pool.check()["used"] == 0


def test_drafts_never_preempt_and_stay_within_max_tokens() -> None:
    """Drafts take only blocks no decoding sequence needs (they are trimmed to what is free) and never exceed
    the tokens a sequence may still generate."""
    sched, runner = scheduler(num_blocks=6, block_size=4, max_batch_tokens=64)
    drafter = ScriptedDrafter(8)
    seqs = [sched.add(prompt(7, i), params(5, seed=i, speculation=Speculation(drafter, 8))) for i in range(2)]
    run(sched)
    assert sched.stats.preemptions == 0
    assert [s.tokens for s in seqs] == [alone(prompt(7, i), i, 5) for i in range(2)]
    for step in runner.steps:
        for p_ in step:
            assert len(p_.drafts) <= 4  # max_tokens - generated - 1 at most


def test_bad_drafts_are_never_run() -> None:
    class Wild(ScriptedDrafter):
        def propose(self, seq, k):
            return [next_token(seq.tokens, seq.seed), 10_000, 3]

    sched, runner = scheduler()
    seq = sched.add(prompt(5), params(6, speculation=Speculation(Wild(1), 4)))
    run(sched)
    assert seq.tokens == alone(prompt(5), 1, 6)
    assert all(all(0 <= d < 64 for d in p_.drafts) and len(p_.drafts) <= 1 for step in runner.steps for p_ in step)


def test_whole_sequence_numerics_never_chunk_preempt_or_reuse() -> None:
    """numerics="hf" rounds by the pieces a sequence is computed in: each prompt is read in one piece (the first
    of a step even beyond the budget), each sequence holds its whole length from admission, nothing is reused."""
    sched, runner = scheduler(num_blocks=14, block_size=4, numerics="hf", max_batch_tokens=8)
    lengths = (13, 3, 20, 5)
    seqs = [sched.add(prompt(n, n), params(8, seed=n)) for n in lengths]
    again = sched.add(prompt(13, 13), params(8, seed=13))
    run(sched)
    reads = sorted(p_.num_tokens for step in runner.steps for p_ in step if p_.num_tokens > 1)
    assert reads == sorted([*lengths, 13])  # every prompt in one piece, the repeated one computed again
    assert sched.stats.preemptions == 0 and sched.stats.prompt_tokens_reused == 0 and again.reused == 0
    assert [s.tokens for s in seqs] == [alone(prompt(n, n), n, 8) for n in lengths]


def test_requests_that_can_never_fit_are_refused_at_add() -> None:
    sched, runner = scheduler(num_blocks=4, block_size=4)
    with pytest.raises(llaisys.LlaisysValueError, match="exceed the KV cache's 16"):
        sched.add(prompt(10), params(7))
    with pytest.raises(llaisys.LlaisysValueError, match="at least one prompt token"):
        sched.add([], params(1))
    hf, _ = scheduler(numerics="hf")
    with pytest.raises(llaisys.LlaisysValueError, match="numerics='exact'"):
        hf.add(prompt(3), params(3, speculation=Speculation(ScriptedDrafter(1), 2)))


def test_a_custom_runner_is_what_step_calls() -> None:
    """The scheduler builds no model runner of its own when given one (a scheduler for a model it never runs)."""
    runner = ScriptedRunner()
    sched, _ = scheduler()
    sched.runner = runner
    seq = sched.add(prompt(3), params(2))
    run(sched)
    assert len(runner.steps) == 2 and seq.tokens == alone(prompt(3), 1, 2)
