"""Fair scheduling (engine/fairness.py) with a scripted runner: one request never holds another up for long.

A request (a group: a prompt and its forks, the n choices) is admitted before the queued sequences of groups that
already run, makes room for itself when another group holds every slot, and shares the prefill budget equally with
the other requests reading prompts; lower priorities go first. Every sequence still draws the tokens it draws
alone (the fake runner's tokens depend on a sequence's own tokens and seed only: helpers/fake_runner.py).
"""

from __future__ import annotations

import pytest

from helpers.fake_runner import alone, run, scheduler
from llaisys_models.engine.fairness import fair_split, prefill_shares
from llaisys_models.engine.sampling import SamplingParams
from llaisys_models.engine.scheduler import Scheduler, Sequence


def params(max_tokens: int, seed: int = 1, **kwargs: object) -> SamplingParams:
    return SamplingParams(max_tokens, seed=seed, eos_token_ids=frozenset(), **kwargs)


def prompt(n: int, start: int = 1) -> list[int]:
    return [(start + i) % 60 + 1 for i in range(n)]


def request(sched: Scheduler, p: list[int], n: int, max_tokens: int, seed: int = 100,
            priority: int = 0) -> list[Sequence]:
    """A request of ``n`` choices, as the server makes it: a sequence and its forks, each with its own seed."""
    first = sched.add(p, params(max_tokens, seed=seed), priority=priority)
    return [first] + [sched.fork(first, params(max_tokens, seed=seed + i)) for i in range(1, n)]


def steps_to_first_token(sched: Scheduler, seq: Sequence, limit: int = 100) -> int:
    steps = 0
    while seq.num_generated == 0:
        sched.step()
        steps += 1
        assert steps < limit
    return steps


def test_a_new_request_starts_within_two_steps_beside_one_of_n64_that_fills_every_slot() -> None:
    """A request of n=64 holds all 16 slots (48 of its forks queued); a chat of another request arriving then is
    admitted at once, the newest sequence of the big request preempted for it, and draws its first token in the
    next step. The big request keeps 15 slots, and every sequence draws what it draws alone."""
    sched, runner = scheduler(num_blocks=1024, block_size=4, max_running=16, max_batch_tokens=128)
    big_prompt = prompt(9)
    big = request(sched, big_prompt, 64, 40)
    for _ in range(3):
        sched.step()
    assert len(sched.running) == 16 and {s.group for s in sched.running} == {big[0].group}
    assert len(sched.waiting) == 48
    chat = sched.add(prompt(6, 30), params(3, seed=7))
    steps = steps_to_first_token(sched, chat)
    assert steps <= 2
    assert sched.stats.fair_preemptions == 1 and sum(s.group == big[0].group for s in sched.running) == 15
    run(sched)
    assert chat.tokens == alone(prompt(6, 30), 7, 3)
    assert [s.tokens for s in big] == [alone(big_prompt, 100 + i, 40) for i in range(64)]
    assert sched.stats.fair_preemptions == 1  # the chat's only; the big request's waiting forks never preempt
    assert sched.pool.check()["used"] == 0


def test_queued_forks_of_a_request_wait_behind_a_request_that_runs_nothing() -> None:
    """Admission: the waiting sequence whose request runs the fewest goes first, whatever its arrival; the
    queued forks of a big request get the slots that free while a newer request still waits for one."""
    sched, runner = scheduler(num_blocks=1024, block_size=4, max_running=4)
    big = request(sched, prompt(5), 12, 30)
    sched.step()
    assert len(sched.running) == 4
    later = [sched.add(prompt(4, 20 + i), params(2 + i, seed=20 + i)) for i in range(3)]
    sched.step()  # the first preempts a fork of the big request; then each runs one group... and the big keeps 1+
    admitted = [s for s in later if s.kv is not None or s.num_generated]
    # room for all three: the big request ran 4, keeps 1 at least (and preempted forks wait behind the newcomers)
    assert len(admitted) == 3 and sum(s.group == big[0].group for s in sched.running) == 1
    run(sched)
    assert [s.tokens for s in later] == [alone(prompt(4, 20 + i), 20 + i, 2 + i) for i in range(3)]
    assert [s.tokens for s in big] == [alone(prompt(5), 100 + i, 30) for i in range(12)]


def test_a_small_prompt_gets_its_first_token_within_two_steps_beside_four_long_prompts() -> None:
    """Prefill: the budget left after decoding is shared equally between the requests reading prompts, so a small
    prompt beside four of 400 tokens is read in one step; every long prompt still advances every step by a fair
    part (no starvation) and the budget is used whole."""
    sched, runner = scheduler(num_blocks=2048, block_size=4, max_running=16, max_batch_tokens=128)
    longs = [sched.add(prompt(400, 7 * i), params(4, seed=i)) for i in range(4)]
    for _ in range(2):
        sched.step()
    small = sched.add(prompt(20, 50), params(3, seed=50))
    assert steps_to_first_token(sched, small) <= 2
    step = {p.id: p.num_tokens for p in runner.steps[-1]}
    assert step[small.id] == 20  # all of it, in one step
    assert all(step[s.id] >= 25 for s in longs) and sum(step.values()) == 128  # floor(128 / 5) or more each
    run(sched)
    for plan in runner.steps:  # every step: every long prompt still reading advanced
        assert sum(p.num_tokens for p in plan) <= 128
    assert small.tokens == alone(prompt(20, 50), 50, 3)
    assert [s.tokens for s in longs] == [alone(prompt(400, 7 * i), i, 4) for i in range(4)]


def test_a_long_prompt_finishes_beside_a_steady_stream_of_small_requests() -> None:
    """No starvation: a new small request every step takes its equal part, never the whole budget; the long
    prompt advances every step and is read within ceil(P / floor(B / k)) steps (k: requests reading at once)."""
    sched, runner = scheduler(num_blocks=4096, block_size=4, max_running=16, max_batch_tokens=64)
    long = sched.add(prompt(600), params(2, seed=1))
    smalls = []
    steps = 0
    while long.num_generated == 0:
        smalls.append(sched.add(prompt(40, len(smalls)), params(2, seed=1000 + len(smalls))))
        sched.step()
        steps += 1
        assert any(p.id == long.id and p.num_tokens > 0 for p in runner.steps[-1])  # it advanced this step
    # at most 16 decoding tokens leave 48 or more, shared by 3 readers at most (a small prompt is read within two
    # steps, one arrives a step): 16 tokens a step or more
    assert steps <= -(-600 // ((64 - 16) // 3))
    assert min(p.num_tokens for step in runner.steps[:steps] for p in step if p.id == long.id) >= 16
    run(sched)
    assert long.tokens == alone(prompt(600), 1, 2)
    assert [s.tokens for s in smalls] == [alone(prompt(40, i), 1000 + i, 2) for i in range(len(smalls))]


def test_a_request_with_one_slot_is_never_preempted_by_fairness() -> None:
    """Fairness preempts only a request that runs more than one sequence: with every slot held by requests of one
    sequence each, a newcomer waits for a slot to free; a request down to one slot keeps it."""
    sched, runner = scheduler(num_blocks=1024, block_size=4, max_running=4)
    for i in range(4):  # requests of one sequence each
        sched.add(prompt(5, i), params(10 + 5 * i, seed=i))
    sched.step()
    newcomer = sched.add(prompt(5, 40), params(3, seed=40))
    steps = steps_to_first_token(sched, newcomer)
    assert steps == 10  # the shortest single finishes its 10 tokens first: then its slot is the newcomer's
    assert sched.stats.preemptions == 0 and sched.stats.fair_preemptions == 0
    run(sched)

    sched, runner = scheduler(num_blocks=1024, block_size=4, max_running=4)
    one = sched.add(prompt(5), params(30, seed=1))
    two = request(sched, prompt(6, 9), 3, 30)
    sched.step()
    assert len(sched.running) == 4
    newcomers = [sched.add(prompt(3, 40 + i), params(12, seed=40 + i)) for i in range(4)]
    run(sched)
    assert one.preemptions == 0  # the request of one sequence was never a victim
    assert sched.stats.fair_preemptions == 2  # the first two newcomers took slots of the request of three
    assert sum(s.preemptions for s in two) == 2
    assert one.tokens == alone(prompt(5), 1, 30)
    assert [s.tokens for s in two] == [alone(prompt(6, 9), 100 + i, 30) for i in range(3)]
    assert [s.tokens for s in newcomers] == [alone(prompt(3, 40 + i), 40 + i, 12) for i in range(4)]


def test_out_of_blocks_the_request_running_the_most_gives_a_sequence_back() -> None:
    """Preemption for blocks picks the newest sequence of the request running the most, not the newest sequence:
    a small request beside a big one is never the victim, and everything completes with its own tokens."""
    sched, runner = scheduler(num_blocks=40, block_size=4, max_running=8, prefix_caching=False)
    big = request(sched, prompt(8), 6, 24)
    sched.step()
    chat = sched.add(prompt(6, 30), params(24, seed=7))
    run(sched)
    assert sched.stats.preemptions > 0 and chat.preemptions == 0
    assert chat.tokens == alone(prompt(6, 30), 7, 24)
    assert [s.tokens for s in big] == [alone(prompt(8), 100 + i, 24) for i in range(6)]
    assert sched.pool.check()["used"] == 0


def test_priority_orders_admission_and_prefill_and_forks_inherit_it() -> None:
    """Lower priority values first (vLLM's convention): admission takes the best priority first, then fairness,
    then arrival; prefill gives the budget to the best priority first; a fork has its parent's priority."""
    sched, runner = scheduler(num_blocks=1024, block_size=4, max_running=1)
    priorities = [3, 1, 2, 0, 1, -1]
    seqs = [sched.add(prompt(3, i), params(2, seed=i), priority=p) for i, p in enumerate(priorities)]
    order = []
    while sched.has_work:
        sched.step()
        order.extend(s.id for s in sched.running if s.id not in order)
    assert order == [s.id for s in sorted(seqs, key=lambda s: (s.priority, s.id))]
    assert [s.tokens for s in seqs] == [alone(prompt(3, i), i, 2) for i in range(6)]

    sched, runner = scheduler(num_blocks=1024, block_size=4, max_batch_tokens=8)
    low = sched.add(prompt(40), params(2, seed=1), priority=1)
    high = sched.add(prompt(24, 9), params(2, seed=2), priority=0)
    fork = sched.fork(high, params(2, seed=3))
    other = sched.fork(high, params(2, seed=4), priority=5)
    assert (fork.priority, fork.group, other.priority, other.group) == (0, high.group, 5, high.group)
    steps = steps_to_first_token(sched, high)
    assert steps == 3 and low.kv is not None and len(low.kv) == 0  # 24 tokens, 8 a step; low read nothing yet
    run(sched)
    assert low.tokens == alone(prompt(40), 1, 2) and high.tokens == alone(prompt(24, 9), 2, 2)
    assert fork.tokens == alone(prompt(24, 9), 3, 2) and other.tokens == alone(prompt(24, 9), 4, 2)


@pytest.mark.parametrize("big_priority, preempted", [(-1, False), (0, True), (1, True)])
def test_fairness_preempts_only_requests_of_the_newcomers_priority_or_worse(big_priority, preempted) -> None:
    sched, runner = scheduler(num_blocks=1024, block_size=4, max_running=4)
    big = request(sched, prompt(5), 8, 20, priority=big_priority)
    sched.step()
    chat = sched.add(prompt(4, 30), params(2, seed=7))
    sched.step()
    assert (sched.stats.fair_preemptions == 1) == preempted and (chat.num_generated == 1) == preempted
    run(sched)
    assert chat.tokens == alone(prompt(4, 30), 7, 2)
    assert [s.tokens for s in big] == [alone(prompt(5), 100 + i, 20) for i in range(8)]


def test_whole_sequence_numerics_admit_fairly_but_never_split_or_preempt() -> None:
    """Under numerics that round by chunk, prompts are read in one piece and nothing is preempted, for fairness
    neither: a newcomer waits for a slot, then takes the first that frees before the big request's queued forks."""
    sched, runner = scheduler(num_blocks=256, block_size=4, numerics="hf", max_running=4, max_batch_tokens=16)
    p = prompt(10)
    first = sched.add(p, params(6, seed=100))
    big = [first] + [sched.fork(first, params(6 + i, seed=100 + i)) for i in range(1, 8)]  # one slot frees a step
    sched.step()
    chat = sched.add(prompt(30, 20), params(3, seed=7))
    small = sched.add(prompt(5, 40), params(3, seed=8))
    admitted: list[int] = []
    while sched.has_work:
        sched.step()
        admitted.extend(s.id for s in sched.running if s.id not in admitted)
    assert admitted.index(chat.id) < admitted.index(small.id) < min(admitted.index(s.id) for s in big[4:])
    assert sched.stats.preemptions == 0 and sched.stats.prompt_tokens_reused == 0
    reads = [p_.num_tokens for step in runner.steps for p_ in step if p_.num_tokens > 1]
    assert sorted(reads) == sorted([10, 30, 5] + [10] * 4)  # every prompt whole (the queued forks' too)
    assert chat.tokens == alone(prompt(30, 20), 7, 3) and small.tokens == alone(prompt(5, 40), 8, 3)
    assert [s.tokens for s in big] == [alone(p, 100 + i, 6 + i) for i in range(8)]


def test_fair_split_is_max_min_fair_with_the_remainder_to_the_oldest() -> None:
    assert fair_split([3, 100, 100], 128) == [3, 63, 62]
    assert fair_split([10, 10], 128) == [10, 10]
    assert fair_split([100, 100, 100], 10) == [4, 3, 3]
    assert fair_split([50, 50, 50, 50], 3) == [1, 1, 1, 0]
    assert fair_split([0, 7, 1], 5) == [0, 4, 1]
    assert fair_split([5], 0) == [0]
    for demands, budget in [([1, 2, 3, 400, 9], 37), ([64] * 7, 100), ([1] * 5, 2)]:
        parts = fair_split(demands, budget)
        assert sum(parts) == min(budget, sum(demands)) and all(0 <= p <= d for p, d in zip(parts, demands))


def test_prefill_shares_go_to_requests_then_to_their_sequences_oldest_first() -> None:
    """A request reading several prompts (sequences of one group) gets one part, not one per sequence."""
    sched, _ = scheduler()
    a = sched.add(prompt(100), params(1))
    a2 = sched.add(prompt(100, 5), params(1), group=a.group)
    b = sched.add(prompt(100, 9), params(1))
    shares = prefill_shares([a, a2, b], 64)
    assert shares == {a.id: 32, b.id: 32}
    shares = prefill_shares([a, a2, b], 250)
    assert shares == {a.id: 100, a2.id: 50, b.id: 100}  # equal parts of 125, b's unused 25 to a


def test_forks_leave_a_slot_for_a_request_that_waits_with_nothing_running() -> None:
    """A chat that comes while the step reading the end of an n=16 request's prompt runs: the forks that start
    from that prompt take every slot but one, so the chat starts in that one next step with no fork preempted
    (none started for nothing)."""
    sched, runner = scheduler(num_blocks=1024, block_size=4, max_running=4, max_batch_tokens=64)
    big_prompt = prompt(30)
    big = request(sched, big_prompt, 16, 6)
    results = runner.execute(sched.schedule())  # reads the whole prompt: its forks start at the commit
    chat = sched.add(prompt(3, 40), params(3, seed=9))  # arrives meanwhile
    sched.commit(results)
    assert len(sched.running) == 3 and chat in sched.waiting
    assert steps_to_first_token(sched, chat) == 1 and sched.stats.fair_preemptions == 0
    run(sched)
    assert chat.tokens == alone(prompt(3, 40), 9, 3)
    assert [s.tokens for s in big] == [alone(big_prompt, 100 + i, 6) for i in range(16)]
