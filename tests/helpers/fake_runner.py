"""A scheduler without a model: a fake model (limits, EOS, numerics, vocabulary) and a runner that draws
scripted tokens, for tests of the scheduling policy (admission, preemption, budgets, forks, drafts, stops).

The runner's "model" is a hash: a sequence's next token is a function of its tokens so far and its seed, so a
sequence draws the same tokens alone or batched, chunked, preempted and recomputed, or forked, exactly as the
real kernels' batch invariance makes a real model do; ``alone`` computes them directly. It never draws the EOS
token (0) unless a sequence's own ``eos_token_ids`` name a token it draws.
"""

from __future__ import annotations

import dataclasses
import hashlib
from types import SimpleNamespace

import llaisys
from llaisys_models.engine.kv_blocks import BlockManager
from llaisys_models.engine.plan import Sampled, StepPlan, StepResults
from llaisys_models.engine.scheduler import Scheduler, Sequence
from llaisys_models.engine.speculative import Drafter

VOCAB = 64
EOS = 0


def next_token(tokens: list[int], seed: int) -> int:
    """The fake model's choice after ``tokens`` for a sequence of ``seed``: 1 .. VOCAB-1 (never EOS)."""
    digest = hashlib.blake2b(repr((tokens, seed)).encode(), digest_size=4).digest()
    return 1 + int.from_bytes(digest, "little") % (VOCAB - 1)


def alone(prompt: list[int], seed: int, max_tokens: int, eos: frozenset[int] = frozenset()) -> list[int]:
    """What a sequence of ``prompt`` generates by itself (up to its first EOS token, included)."""
    tokens = list(prompt)
    while len(tokens) - len(prompt) < max_tokens:
        tokens.append(next_token(tokens, seed))
        if tokens[-1] in eos:
            break
    return tokens


class FakeModel:
    """What the scheduler reads of a model, and nothing else (no weights, no device)."""

    def __init__(self, context_length: int = 4096, numerics: str = "exact") -> None:
        self.config = SimpleNamespace(vocab_size=VOCAB)
        self.eos_token_ids = (EOS,)
        self.numerics = numerics
        self.context_length = context_length
        self.device = None
        self.dtype = None

    def check_length(self, total: int) -> None:
        if total > self.context_length:
            raise llaisys.LlaisysValueError(f"{total} positions exceed the model's {self.context_length}")

    def forward_batch(self, *args: object) -> None:
        raise AssertionError("the fake runner never runs the model")


@dataclasses.dataclass(frozen=True)
class Planned:
    """One sequence's part of an executed plan, as the runner saw it."""
    id: int
    num_tokens: int
    drafts: tuple[int, ...]
    num_logits: int
    forks: tuple[int, ...]


class ScriptedRunner:
    """Executes plans as a model runner would, without a model: each planned sequence's input ids are written
    to its blocks (``SequenceKV.commit``, as ``forward_batch`` does, after checking the blocks were reserved),
    then each sequence asked for logits draws ``next_token`` row by row, keeping its drafts while they match
    (the verify rule), and its forks draw their first token with their own seeds. ``steps`` records every plan."""

    def __init__(self) -> None:
        self.steps: list[list[Planned]] = []

    def execute(self, plan: StepPlan) -> StepResults:
        self.steps.append([Planned(s.seq.id, s.num_tokens, tuple(s.drafts), s.num_logits,
                                   tuple(f.id for f in s.forks)) for s in plan.scheduled])
        for s in plan.scheduled:
            kv = s.seq.kv
            assert kv is not None, "a planned sequence holds no blocks"
            assert all(len(kv) + len(s.input_ids) <= len(part.blocks) * kv.manager.block_size
                       for part in kv.parts), "blocks not reserved"
            assert s.input_ids == s.seq.tokens[len(kv):len(kv) + s.num_tokens] + s.drafts
            kv.commit(s.input_ids)
        sampled = []
        for s in plan.scheduled:
            if not s.num_logits:
                sampled.append(Sampled([], []))
                continue
            tokens = list(s.seq.tokens)
            new: list[int] = []
            for i in range(len(s.drafts) + 1):
                new.append(next_token(tokens + new, s.seq.seed))
                if i == len(s.drafts) or new[-1] != s.drafts[i]:
                    break
            forks = tuple(Sampled([next_token(f.tokens, f.seed)], []) for f in s.forks)
            sampled.append(Sampled(new, [], forks))
        return StepResults(plan, sampled)


class ScriptedDrafter(Drafter):
    """Proposes the fake model's own next tokens, the first ``right`` of them right and the rest wrong."""

    def __init__(self, right: int) -> None:
        self.right = right
        self.released: list[int] = []

    def propose(self, seq: Sequence, k: int) -> list[int]:
        tokens = list(seq.tokens)
        drafts = []
        for i in range(k):
            token = next_token(tokens, seq.seed)
            drafts.append(token if i < self.right else token % (VOCAB - 1) + 1)  # (another token, never EOS)
            tokens.append(token)
        return drafts

    def release(self, seq: Sequence) -> None:
        self.released.append(seq.id)


def scheduler(num_blocks: int = 64, block_size: int = 4, *, prefix_caching: bool = True,
              numerics: str = "exact", **kwargs: object) -> tuple[Scheduler, ScriptedRunner]:
    """A scheduler over a block manager (no tensors) with a scripted runner."""
    runner = ScriptedRunner()
    pool = BlockManager(num_blocks, block_size, prefix_caching=prefix_caching)
    return Scheduler(FakeModel(numerics=numerics), pool, runner=runner, **kwargs), runner


def run(scheduler: Scheduler, limit: int = 10_000) -> int:
    """Step until nothing is left; the number of steps."""
    steps = 0
    while scheduler.has_work:
        scheduler.step()
        steps += 1
        assert steps < limit, "the scheduler does not finish"
    return steps
