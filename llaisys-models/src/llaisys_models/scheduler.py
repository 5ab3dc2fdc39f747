"""Continuous batching: which sequences run in the next forward, and how many of their tokens.

Each ``step()`` is one forward pass over every running sequence:

    admit     waiting sequences, oldest first, while the pool has blocks for the whole prompt (reusing
              cached prefix blocks) and there is room (max_running, the step's token budget)
    schedule  every decoding sequence one token (oldest first; a sequence that needs a new block and finds
              none preempts the newest running sequence: its blocks are freed and it waits at the head of
              the queue, to be recomputed later — never an error), then prefill chunks of the sequences
              still reading their prompt, oldest first, within ``max_batch_tokens``
    forward   one ``model.forward_batch`` (logits only for the sequences that finished their pending tokens)
    sample    each of those draws its next token with its own parameters and ``step_seed(seed, n)``, as
              ``model.generate`` does, so its tokens are the same whatever else shares the step

The caller decides when a sequence is done (EOS, length, stop strings) and calls ``finish``. Everything
runs on the caller's thread: no locks.
"""

from __future__ import annotations

import collections
import dataclasses
import itertools
import secrets
import time

import llaisys

from .generation import step_seed
from .paged_kv import KVPool, SequenceKV


@dataclasses.dataclass(frozen=True)
class Sampling:
    """How a sequence chooses its tokens (as ``generate``'s arguments)."""
    greedy: bool = True
    top_k: int = 1
    top_p: float = 1.0
    temperature: float = 1.0
    seed: int = 0


class Sequence:
    """A request inside the scheduler: its tokens so far (prompt + generated) and its KV blocks."""

    _order = itertools.count()

    def __init__(self, prompt: list[int], sampling: Sampling, max_tokens: int, tag=None):
        self.tokens = list(prompt)
        self.prompt_len = len(prompt)
        self.sampling = sampling
        self.max_tokens = max_tokens  # prompt + generated never exceeds prompt_len + max_tokens
        self.tag = tag  # the caller's object
        self.arrival = next(Sequence._order)  # kept through preemption: "newest" means latest arrival
        self.kv: SequenceKV | None = None
        self.generated = 0
        self.reused: int | None = None  # prompt tokens found in the cache at the first admission
        self.first_token_time: float | None = None
        self.preemptions = 0

    @property
    def pending(self) -> int:
        """Tokens whose keys/values are not in the cache yet (the next forward's input)."""
        return len(self.tokens) - len(self.kv) if self.kv is not None else len(self.tokens)

    @property
    def output(self) -> list[int]:
        return self.tokens[self.prompt_len:]


@dataclasses.dataclass
class SchedulerStats:
    steps: int = 0
    preemptions: int = 0
    recomputed_tokens: int = 0  # tokens computed again after a preemption
    prompt_tokens_computed: int = 0  # at first admission: prompt tokens not found in the cache
    prompt_tokens_reused: int = 0


class Scheduler:
    """Runs sequences of one ``model`` through ``pool`` (from ``model.new_kv_pool``).

    ``batched=False`` is the unbatched engine, for comparison: each sequence gets its own forward per
    step and a prompt is prefilled in one piece.
    """

    def __init__(self, model, pool: KVPool, *, max_running: int = 16, max_batch_tokens: int = 128,
                 batched: bool = True):
        if max_running < 1 or max_batch_tokens < 1:
            raise llaisys.LlaisysValueError("max_running and max_batch_tokens must be >= 1")
        self.model = model
        self.pool = pool
        self.max_running = max_running
        self.max_batch_tokens = max_batch_tokens
        self.batched = batched
        self.waiting: collections.deque[Sequence] = collections.deque()
        self.running: list[Sequence] = []  # oldest first
        self.stats = SchedulerStats()

    # -- the caller's side ------------------------------------------------------------------

    def max_length(self) -> int:
        """The longest sequence (prompt + new tokens) this scheduler can ever complete."""
        return min(self.model.config.max_position_embeddings, self.pool.capacity_tokens)

    def add(self, prompt: list[int], sampling: Sampling, max_tokens: int, tag=None) -> Sequence:
        """Queue a sequence that will generate up to ``max_tokens`` tokens after ``prompt``."""
        if not prompt:
            raise llaisys.LlaisysValueError("a sequence needs at least one prompt token")
        total = len(prompt) + max_tokens
        if total > self.pool.capacity_tokens:
            raise llaisys.LlaisysValueError(
                f"prompt + max_tokens = {total} positions exceed the KV cache's {self.pool.capacity_tokens} "
                f"({self.pool.num_blocks} blocks of {self.pool.block_size}); give the cache more memory")
        self.model.check_length(total)
        seq = Sequence(prompt, sampling, max_tokens, tag)
        self.waiting.append(seq)
        return seq

    def finish(self, seq: Sequence) -> None:
        """The caller is done with ``seq`` (finished or cancelled): its blocks go back to the pool; full
        and last blocks stay cached for later prompts that start the same way."""
        if seq.kv is not None:
            seq.kv.release()
            seq.kv = None
        if seq in self.running:
            self.running.remove(seq)
        elif seq in self.waiting:
            self.waiting.remove(seq)

    @property
    def has_work(self) -> bool:
        return bool(self.waiting or self.running)

    # -- one step --------------------------------------------------------------------------------

    def step(self) -> list[tuple[Sequence, int]]:
        """Run one forward; return (sequence, new token) for every sequence that got one."""
        self._admit()
        plan = self._schedule()
        if not plan:
            return []
        self.stats.steps += 1
        model = self.model
        wants = [seq.pending == n for seq, n in plan]  # the chunk reaches the end: a token is drawn
        if self.batched:
            batch = [(seq.kv, seq.tokens[len(seq.kv):len(seq.kv) + n]) for seq, n in plan]
            logits = model.forward_batch(batch, wants)
            rows = iter(range(sum(wants)))
            row_of = [next(rows) if want else None for want in wants]
        else:
            logits, row_of = [], []
            for (seq, n), want in zip(plan, wants):
                out = model.forward_batch([(seq.kv, seq.tokens[len(seq.kv):len(seq.kv) + n])], [want])
                row_of.append(len(logits) if want else None)
                if want:
                    logits.append(out)
        events = []
        for (seq, _), row in zip(plan, row_of):
            if row is None:
                continue
            if self.batched:
                row_logits = logits.slice(0, row, row + 1)
            else:
                row_logits = logits[row]
            s = seq.sampling
            token = model.select(row_logits.view(row_logits.shape[-1]), s.greedy, s.top_k, s.top_p,
                                 s.temperature, step_seed(s.seed, seq.generated))
            seq.tokens.append(token)
            seq.generated += 1
            if seq.first_token_time is None:
                seq.first_token_time = time.perf_counter()
            events.append((seq, token))
        return events

    def _admit(self) -> None:
        while self.waiting and len(self.running) < self.max_running:
            seq = self.waiting[0]
            kv = self.pool.sequence()
            # the last token is always computed: its logits choose the next one
            reused = kv.adopt_prefix(seq.tokens, len(seq.tokens) - 1)
            # room for the whole pending part, keeping a block of growth for every running sequence
            if kv.blocks_for(len(seq.tokens)) + len(self.running) > self.pool.num_free or \
                    not kv.reserve(len(seq.tokens)):
                kv.release()
                if not self.running:  # nothing will free blocks: cached ones are all there is
                    raise RuntimeError("the KV pool cannot hold a single admitted sequence")  # add() prevents it
                return
            self.waiting.popleft()
            seq.kv = kv
            if seq.reused is None:
                seq.reused = reused
                self.stats.prompt_tokens_reused += reused
                self.stats.prompt_tokens_computed += seq.prompt_len - reused
            else:  # back after a preemption
                self.stats.recomputed_tokens += len(seq.tokens) - reused
            self.running.append(seq)
            self.running.sort(key=lambda s: s.arrival)

    def _schedule(self) -> list[tuple[Sequence, int]]:
        plan: dict[int, tuple[Sequence, int]] = {}
        budget = self.max_batch_tokens if self.batched else float("inf")
        for seq in list(self.running):  # decoding sequences: one token each, oldest first
            if seq.kv is None or seq.pending != 1:
                continue
            while seq.kv is not None and not seq.kv.reserve(len(seq.kv) + 1):
                self._preempt(self.running[-1])
            if seq.kv is not None:
                plan[seq.arrival] = (seq, 1)
                budget -= 1
        for seq in self.running:  # prompts (or recomputation), chunked, oldest first
            if budget <= 0:
                break
            if seq.pending > 1:
                n = int(min(seq.pending, budget))
                plan[seq.arrival] = (seq, n)
                budget -= n
        return [plan[a] for a in sorted(plan)]

    def _preempt(self, seq: Sequence) -> None:
        """Free the blocks of a running sequence and queue it first; it recomputes its tokens when
        re-admitted (its generated tokens become part of the tokens to prefill)."""
        seq.kv.release()
        seq.kv = None
        self.running.remove(seq)
        seq.preemptions += 1
        self.stats.preemptions += 1
        position = 0
        while position < len(self.waiting) and self.waiting[position].arrival < seq.arrival:
            position += 1
        self.waiting.insert(position, seq)


def generate_batch(model, prompts, max_new_tokens: int, top_k: int = 1, top_p: float = 1.0,
                   temperature: float = 1.0, seed=None, *, eos_token_ids=None, kv_memory: int | None = None,
                   max_running: int | None = None, max_batch_tokens: int = 128) -> list[list[int]]:
    """``model.generate`` for several prompts at once, through the continuous-batching scheduler.

    Returns prompt + new tokens per prompt, each exactly what ``model.generate(prompt, ...)`` returns with
    the same seed. ``seed``: None (a random seed per prompt), one int for every prompt, or one per prompt.
    ``kv_memory``: the KV pool's bytes (None: room for every sequence at full length; less makes the
    scheduler preempt and recompute, with the same results).
    """
    from .generation import MASK64, check_max_new_tokens, check_sampling

    prompts = [model.check_input_ids(p) for p in prompts]
    if isinstance(seed, (list, tuple)):
        if len(seed) != len(prompts):
            raise llaisys.LlaisysValueError(f"{len(seed)} seeds for {len(prompts)} prompts")
        seeds = list(seed)
    else:
        seeds = [seed] * len(prompts)
    check_max_new_tokens(max_new_tokens)
    for s in seeds:
        check_sampling(top_k, top_p, temperature, s)
    seeds = [secrets.randbits(63) if s is None else int(s) for s in seeds]
    if not prompts or max_new_tokens == 0:
        return [list(p) for p in prompts]
    eos = set(model.eos_token_ids if eos_token_ids is None else eos_token_ids)
    greedy = top_k == 1 or temperature == 0
    block_size = 16
    if kv_memory is None:
        blocks = sum(-(-(len(p) + max_new_tokens) // block_size) for p in prompts)
        pool = model.new_kv_pool(num_blocks=blocks, block_size=block_size)
    else:
        pool = model.new_kv_pool(memory=kv_memory, block_size=block_size)
    scheduler = Scheduler(model, pool, max_running=max_running or len(prompts), max_batch_tokens=max_batch_tokens)
    sequences = [scheduler.add(p, Sampling(greedy, int(top_k), float(top_p), float(temperature), s & MASK64),
                               max_new_tokens) for p, s in zip(prompts, seeds)]
    while scheduler.has_work:
        for seq, token in scheduler.step():
            if token in eos or seq.generated >= max_new_tokens:
                scheduler.finish(seq)
    return [seq.tokens for seq in sequences]
