"""The model runner: executes a step's plan (plan.py) on a model and says what each sequence drew.

    execute(plan)   one forward over every planned sequence (``model.forward_batch``: step inputs built on the
                    host, a decode or verify step replayed from its captured graph, decode_graph.py; in a
                    tensor-parallel group the other ranks run the same forward), then for each sequence whose
                    logits were asked for, its choice: penalties and logit_bias, its grammar's mask (computed on
                    the mask thread while the forward runs), argmax or the seeded ``sample`` op,
                    log-probabilities, and the verify rule over its drafts (``sampling.Verifier``,
                    speculative/verify.py); the forks of a prompt whose end this step reads draw their first
                    token from the same row (a copy of it where their own penalties or grammar would change it)
    forward(...)    one ``forward_batch`` of the runner's pool: every forward of the package goes through here
                    (the scheduler's steps, a draft model's guesses, a ``Session`` fed by hand)
    greedy(row)     the argmax of a row of logits (a draft model's guess)

The runner keeps no state of its own between steps beyond reused buffers; what the tokens mean (kept drafts,
stops, forks that start) is the scheduler's ``commit``. A sequence's choice depends on its own row, parameters,
seed and tokens only, so it is the same whatever else shares the step, and a choice that fails is that
sequence's failure alone (``Sampled.error``): the others of the step are chosen as if it had not been there.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import TYPE_CHECKING, Protocol

import llaisys

from .plan import Sampled, StepPlan, StepResults
from .sampling import Sampler, SamplingParams, TokenLogprob, Verifier
from .sequence import Sequence
from .step_inputs import Batch

if TYPE_CHECKING:
    from .kv_cache import KVPool

GREEDY = SamplingParams(max_tokens=1, top_k=1)


class Runner(Protocol):
    """What the scheduler's ``step`` hands its plan to (tests use one that returns scripted tokens)."""

    def execute(self, plan: StepPlan) -> StepResults:
        """Run ``plan``: append each planned sequence's input ids to its KV blocks and sample the rows asked for."""
        ...


class ForwardModel(Protocol):
    """The part of a model (families/causal_lm.py) a runner uses."""

    device: llaisys.Device
    dtype: llaisys.DType

    def forward_batch(self, pool: KVPool, batch: Batch, logits_of: list[int] | None = None) -> llaisys.Tensor: ...


class ModelRunner:
    """Runs the steps of sequences of ``pool`` on ``model``. ``batched=False`` is the unbatched engine, for
    comparison: a forward per sequence."""

    def __init__(self, model: ForwardModel, pool: KVPool, *, batched: bool = True) -> None:
        self.model = model
        self.pool = pool
        self.batched = batched

    @functools.cached_property
    def sampler(self) -> Sampler:
        """Its result buffers on the model's device (made at the first choice: a ``Session`` never chooses)."""
        return Sampler(self.model.device, self.model.dtype)

    @functools.cached_property
    def verifier(self) -> Verifier:
        return Verifier(self.sampler)

    def forward(self, batch: Batch, logits_of: list[int] | None = None) -> llaisys.Tensor:
        """``model.forward_batch`` over the runner's pool: appends each sequence's ids to its blocks (reserved
        for its new length) and returns the logits of its last ``logits_of[i]`` rows (every row: None)."""
        return self.model.forward_batch(self.pool, batch, logits_of)

    def greedy(self, row: llaisys.Tensor) -> int:
        """The most likely token of a 1-D row of logits."""
        return self.sampler.select(row, GREEDY, 0)

    def execute(self, plan: StepPlan) -> StepResults:
        """One forward over ``plan`` (one per sequence when not batched) and every choice it asks for."""
        scheduled = plan.scheduled
        if not scheduled:
            return StepResults(plan, [])
        counts = [s.num_logits for s in scheduled]
        # the grammar masks of the tokens this step draws depend on tokens drawn already: they are computed on the
        # mask thread while the forward runs (vLLM overlaps its grammar bitmasks with the forward likewise)
        for s in scheduled:
            if s.num_logits:
                if s.seq.grammar is not None:
                    s.seq.grammar.prepare()
                for fork in s.forks:
                    if fork.grammar is not None:
                        fork.grammar.prepare()
        chunks: Batch = []
        for s in scheduled:
            assert s.seq.kv is not None  # a scheduled sequence holds its blocks (the scheduler admitted it)
            chunks.append((s.seq.kv, s.input_ids))
        if self.batched:
            rows = self._rows(self.forward(chunks, counts))
        else:
            rows = []
            for chunk, count in zip(chunks, counts):
                if count:
                    rows.extend(self._rows(self.forward([chunk], [count])))
        sampled, r = [], 0
        for s, count in zip(scheduled, counts):
            if not count:
                sampled.append(Sampled([], []))
                continue
            mine, r = rows[r:r + count], r + count
            # forks first, from the row after the prompt, before the parent's own penalties or grammar change it
            forks = tuple(self._choose(f, [mine[0]], [], own_row=True) for f in s.forks) if s.forks else ()
            chosen = self._choose(s.seq, mine, s.drafts)
            sampled.append(dataclasses.replace(chosen, forks=forks))
        return StepResults(plan, sampled)

    def _choose(self, seq: Sequence, rows: list[llaisys.Tensor], drafts: list[int], own_row: bool = False) -> Sampled:
        """``seq``'s tokens from its rows (the drafts it keeps, then the model's own) and their logprobs (``own_row``:
        a fork's, from a copy of the row where it needs one). Whatever fails here is this sequence's failure alone
        (a grammar that allows nothing, a bad parameter that only its row reveals): its ``Sampled`` carries the
        error and the other sequences of the step still choose."""
        logprobs: list[TokenLogprob] = []
        try:
            forced = seq.thinking.forced if seq.thinking is not None else None
            if forced is not None:  # its thinking's budget is spent: the end of the thinking, unsampled
                if seq.params.logprobs is not None:
                    logprobs.append(self.sampler.logprobs(rows[0], forced, seq.params))
                return Sampled([forced], logprobs)
            if own_row:
                rows = [self._own_row(seq, rows[0])]
            tokens = self.verifier.verify(rows, drafts, seq.params, seq.seed, seq.num_generated, seq.counts,
                                          seq.grammar, logprobs)
        except Exception as e:  # any failure of one sequence's choice is reported as its own
            return Sampled([], [], error=e)
        return Sampled(tokens, logprobs)

    @staticmethod
    def _rows(logits: llaisys.Tensor) -> list[llaisys.Tensor]:
        """The rows of ``logits`` [R, vocab] as 1-D tensors (one view of the whole, then a slice a row)."""
        n, vocab = logits.shape
        if n == 0 or not logits.is_contiguous():
            return [logits.slice(0, r, r + 1).view(vocab) for r in range(n)]
        flat = logits.view(n * vocab)
        return [flat] if n == 1 else [flat.slice(0, r * vocab, (r + 1) * vocab) for r in range(n)]

    @staticmethod
    def _own_row(fork: Sequence, row: llaisys.Tensor) -> llaisys.Tensor:
        """``row`` for a fork to choose from: a copy where its penalties or grammar change it in place (the
        parent and the other forks choose from the same row)."""
        if fork.counts is None and fork.grammar is None:
            return row
        own = llaisys.empty(row.shape, row.dtype, row.device)
        llaisys.ops.rearrange(own, row)
        return own
