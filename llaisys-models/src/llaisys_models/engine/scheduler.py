"""The one generation loop: which sequences run in the next forward, how many of their tokens, what they draw.

Every way of generating goes through ``Scheduler.step``: ``model.generate`` / ``stream_generate`` (a batch
of one), ``model.generate_batch`` and the server's engine thread. Each step is one forward pass over every
running sequence, in three parts: ``schedule()`` plans it (a ``plan.StepPlan``), the model runner executes
the plan (``runner.ModelRunner.execute``: the forward and every choice, a ``plan.StepResults``) and
``commit(results)`` applies what was drawn:

    admit     (schedule) waiting sequences in fair order (engine/fairness.py: the best priority, then the request
              running the fewest sequences, then the oldest) while the pool has blocks for the whole prompt
              (reusing cached prefix blocks of the sequence's scope; where every layer's window gives blocks
              back, for its first chunk: each chunk's are reserved as it is read) and there is room
              (max_running); a request that runs nothing makes room by preempting the newest sequence of the
              request running the most (if that one runs more than one)
    schedule  blocks wholly before every layer's window of a sequence's next forward given back (a model whose
              every layer slides: kv_blocks.SequenceKV.drop_outside_window), then
              every decoding sequence one token (oldest first; a sequence that needs a new block and finds
              none preempts the newest sequence of the request running the most: its blocks are freed and it
              waits in the queue, before newer sequences of its standing, to be recomputed later — never an
              error), then prefill chunks of the sequences still reading their prompt within ``max_batch_tokens``,
              the budget left shared equally between the requests reading (fairness.prefill_shares)
              (a decoding sequence with a ``Speculation`` also gets its drafted tokens, verified in this
              forward, when blocks for them are free: drafts never preempt)
    forward   (runner) one ``model.forward_batch`` (logits only for the sequences that finished their pending
              tokens: the last row, or every verify row of a speculating sequence)
    sample    (runner) each of those draws its next token with its own parameters and ``step_seed(seed, n)``, so
              its tokens are the same whatever else shares the step (penalties and logit_bias first, from the
              counts of its tokens that ``Sequence.counts`` keeps as they are appended); a speculating
              sequence keeps the drafts its rows confirm plus one token (speculative/verify.py)
    commit    the new tokens are appended (a grammar's matcher advanced past them), a speculating sequence's KV
              cache is cut back past its kept drafts; a sequence that drew one of its EOS tokens finishes with
              "stop" (or whose grammar is complete), one that reached max_tokens with "length"; its blocks go
              back to the pool (cached for prompts that start the same way)

Forks (``fork``: n choices of one prompt) wait for their parent's prompt to be read; in the step that reads its
end, each fork takes the parent's KV blocks (``SequenceKV.fork``: full blocks shared, the last one copied) and
draws its first token from the same logits row with its own seed, then decodes as a sequence of its own. A fork
that finds no room then (blocks, ``max_running``) waits in the queue as an ordinary sequence of the same prompt
(the runner drew a first token for it too: ``commit`` drops it, and the fork draws the same one when it runs).

Stop strings are text, so whoever detokenizes applies them and calls ``finish``. Numerics that round
differently when a sequence is computed in other pieces (``numerics="hf"``: a prefill chunk, a recomputed
sequence, a reused prefix) get a policy that never does that: each sequence holds its whole length from
admission (no preemption), reads its prompt in one piece and reuses no cached prefix. Everything runs on
the caller's thread: no locks.
"""

from __future__ import annotations

import collections
import dataclasses
import time
from typing import TYPE_CHECKING, Protocol, cast

import llaisys

from . import fairness
from .grammar import GrammarError
from .kv_blocks import BlockManager
from .plan import Sampled, ScheduledSequence, StepPlan, StepResults
from .runner import ForwardModel, ModelRunner, Runner
from .sampling import SamplingParams, TokenLogprob
from .sequence import Sequence
from .speculative.config import check_numerics, next_draft_length, pause_after

if TYPE_CHECKING:
    from .grammar import Grammar, Matcher
    from .kv_cache import KVPool

__all__ = ["Scheduler", "SchedulerStats", "Sequence"]  # (Sequence: engine/sequence.py)


@dataclasses.dataclass
class SchedulerStats:
    steps: int = 0
    preemptions: int = 0
    fair_preemptions: int = 0  # ... of which made room for a request that ran nothing (engine/fairness.py)
    recomputed_tokens: int = 0  # tokens computed again after a preemption
    prompt_tokens_computed: int = 0  # at first admission: prompt tokens not found in the cache
    prompt_tokens_reused: int = 0
    prompt_tokens_forked: int = 0  # prompt tokens a fork took from its parent's KV blocks (computed once)
    draft_tokens: int = 0  # speculative decoding: tokens drafted and verified
    accepted_tokens: int = 0  # ... of which the model kept


class HasVocab(Protocol):
    @property
    def vocab_size(self) -> int: ...  # read only: a model's config is a frozen dataclass (families/config.py)


class SchedulerModel(ForwardModel, Protocol):
    """What the scheduler reads of its model (families/causal_lm.py): limits, EOS tokens, numerics, vocabulary."""

    eos_token_ids: tuple[int, ...]
    numerics: str

    @property
    def config(self) -> HasVocab: ...

    @property
    def context_length(self) -> int: ...

    def check_length(self, total: int) -> None: ...


class Scheduler:
    """Runs sequences of one ``model`` through ``pool`` (from ``model.new_kv_pool``).

    ``batched=False`` is the unbatched engine, for comparison: each sequence gets its own forward per
    step and a prompt is prefilled in one piece. ``runner``: what executes the plans (default: a
    ``runner.ModelRunner`` of ``model`` and ``pool``; tests of the policy give one that needs no model).

    Scheduling is fair between requests (groups: a sequence and its forks, ``Sequence.group``) and ordered by
    ``priority`` (lower first) — engine/fairness.py: a new request starts within a step or two whatever else runs
    (it takes a slot from the request holding the most, never a request's last), and its prompt is read beside
    long ones with an equal part of the step's budget; every sequence still draws the tokens it draws alone.
    """

    def __init__(self, model: SchedulerModel, pool: KVPool | BlockManager, *, max_running: int = 16,
                 max_batch_tokens: int = 128, batched: bool = True, runner: Runner | None = None) -> None:
        if max_running < 1 or max_batch_tokens < 1:
            raise llaisys.LlaisysValueError("max_running and max_batch_tokens must be >= 1")
        self.model = model
        self.pool = pool
        self.max_running = max_running
        self.max_batch_tokens = max_batch_tokens
        self.batched = batched
        # a BlockManager (blocks without tensors) only with a runner of its own: a ModelRunner needs a KVPool
        self.runner: Runner = runner if runner is not None else ModelRunner(model, cast("KVPool", pool),
                                                                            batched=batched)
        self.waiting: collections.deque[Sequence] = collections.deque()
        self.running: list[Sequence] = []  # oldest first
        # sequences a step ended with an error of their own (finish_reason "error", ``Sequence.error``), until
        # the caller takes them (``take_failed``)
        self.failed: list[Sequence] = []
        self.stats = SchedulerStats()

    # -- the caller's side ------------------------------------------------------------------

    @property
    def max_length(self) -> int:
        """The longest sequence (prompt + new tokens) this scheduler can ever complete."""
        return min(self.model.context_length, self.pool.capacity_tokens)

    @property
    def whole_sequences(self) -> bool:
        """Whether sequences must be computed in one piece each (numerics that round by chunking)."""
        return self.model.numerics != "exact"

    def add(self, prompt: list[int], params: SamplingParams, *, scope: str = "", tag: object = None,
            arrival_time: float | None = None, priority: int = 0, group: int | None = None) -> Sequence:
        """Queue a sequence that will generate up to ``params.max_tokens`` tokens after ``prompt``. ``priority``:
        lower values are served first; ``group``: the request it belongs to for fair scheduling (another
        sequence's ``group``: the prompts of one request; default: a group of its own). See engine/fairness.py."""
        if not prompt:
            raise llaisys.LlaisysValueError("a sequence needs at least one prompt token")
        self._check_length(len(prompt), params)
        eos = frozenset(self.model.eos_token_ids if params.eos_token_ids is None else params.eos_token_ids)
        seq = Sequence(prompt, params, eos, scope=scope, tag=tag, arrival_time=arrival_time, priority=priority,
                       group=group)
        seq.matcher = self._matcher(params)
        if params.max_tokens == 0:
            seq.finish_reason = "length"
        else:
            self.waiting.append(seq)
        return seq

    def fork(self, parent: Sequence, params: SamplingParams, *, tag: object = None,
             priority: int | None = None) -> Sequence:
        """A new sequence continuing ``parent``'s prompt with its own ``params`` (e.g. another seed): it starts
        from the parent's KV blocks when the parent's prompt has been read (or, if the parent has already
        generated or finished, queues as a sequence of that prompt). It belongs to the parent's group and has its
        priority (unless ``priority`` is given)."""
        prompt = parent.tokens[:parent.prompt_len]
        priority = parent.priority if priority is None else priority
        if parent.finished or parent.num_generated or params.max_tokens == 0:
            return self.add(prompt, params, scope=parent.scope, tag=tag, arrival_time=parent.arrival_time,
                            priority=priority, group=parent.group)
        self._check_length(len(prompt), params)
        eos = frozenset(self.model.eos_token_ids if params.eos_token_ids is None else params.eos_token_ids)
        seq = Sequence(prompt, params, eos, scope=parent.scope, tag=tag, arrival_time=parent.arrival_time,
                       priority=priority, group=parent.group)
        seq.matcher = self._matcher(params)
        seq.parent = parent
        parent.forks.append(seq)
        return seq

    def _check_length(self, prompt_len: int, params: SamplingParams) -> None:
        total = prompt_len + params.max_tokens
        if total > self.pool.capacity_tokens:
            raise llaisys.LlaisysValueError(
                f"prompt + max_tokens = {total} positions exceed the KV cache's {self.pool.capacity_tokens} "
                f"({self.pool.num_blocks} blocks of {self.pool.block_size}); give the cache more memory")
        self.model.check_length(total)
        if params.speculation is not None:
            check_numerics(self.model)
            if params.grammar is not None:
                raise llaisys.LlaisysValueError("a grammar (structured output) cannot be combined with speculative "
                                                "decoding: drafted tokens would advance it before verification")

    def _matcher(self, params: SamplingParams) -> Matcher | None:
        """A sequence's own grammar matcher (its position in params.grammar), or None."""
        grammar = cast("Grammar | None", params.grammar)  # (SamplingParams types its field as object)
        return grammar.matcher(self.model.config.vocab_size) if grammar is not None else None

    def _queue(self, seq: Sequence) -> None:
        """Wait in arrival order (a preempted sequence or a fork that could not start goes before newer ones);
        ``_admit`` starts them in fairness's order (engine/fairness.py), arrival breaking ties."""
        position = 0
        while position < len(self.waiting) and self.waiting[position].id < seq.id:
            position += 1
        self.waiting.insert(position, seq)

    def finish(self, seq: Sequence, reason: str = "cancelled") -> None:
        """``seq`` is done (its last token drawn, a stop string found, cancelled): its blocks go back to the
        pool, full and last blocks staying cached for later prompts that start the same way."""
        if seq.finish_reason is None:
            seq.finish_reason = reason
        for fork in seq.forks:  # a parent gone before its prompt was read: its forks go on alone
            fork.parent = None
            self._queue(fork)
        seq.forks = []
        if seq.parent is not None:
            seq.parent.forks.remove(seq)
            seq.parent = None
        if seq.kv is not None:
            seq.kv.release()
            seq.kv = None
        if seq.speculation is not None:
            seq.speculation.drafter.release(seq)
        if seq in self.running:
            self.running.remove(seq)
        elif seq in self.waiting:
            self.waiting.remove(seq)

    @property
    def has_work(self) -> bool:
        return bool(self.waiting or self.running)

    def take_failed(self) -> list[Sequence]:
        """The sequences that failed alone since the last call (each finished with "error", its ``error`` set)."""
        failed, self.failed = self.failed, []
        return failed

    def raise_failed(self) -> None:
        """Raise the first failed sequence's error (a caller that owns every sequence: ``model.generate``)."""
        failed = self.take_failed()
        if failed:
            assert failed[0].error is not None  # (set with it)
            raise failed[0].error

    def _fail(self, seq: Sequence, error: Exception) -> None:
        """End ``seq`` alone with ``error`` (its choice or its grammar failed); the step goes on for the others."""
        seq.error = error
        self.finish(seq, "error")
        self.failed.append(seq)

    # -- one step: schedule, run, commit -------------------------------------------------------

    def step(self) -> list[tuple[Sequence, int]]:
        """Run one forward; return (sequence, new token) for every sequence that got one (a sequence that
        finished with it has its ``finish_reason`` set and is out of the scheduler)."""
        return self.commit(self.runner.execute(self.schedule()))

    def schedule(self) -> StepPlan:
        """Admit what fits, then plan the next forward (empty: nothing to run). Blocks are reserved for every
        planned token; the runner writes them."""
        self._admit()
        planned = self._plan()
        if not planned:
            return StepPlan([])
        self.stats.steps += 1
        scheduled = []
        for seq, n, drafts in planned:
            # rows whose logits are wanted: none for a prompt chunk short of the end, else the last row and the
            # rows after each drafted token
            num_logits = len(drafts) + 1 if seq.pending == n else 0
            assert seq.kv is not None  # planned: admitted, so it holds its blocks
            start = len(seq.kv)
            scheduled.append(ScheduledSequence(seq, n, drafts, seq.tokens[start:start + n] + drafts, num_logits,
                                               tuple(seq.forks) if num_logits and seq.forks else ()))
        return StepPlan(scheduled)

    def commit(self, results: StepResults) -> list[tuple[Sequence, int]]:
        """Apply what the runner drew for ``results.plan``, oldest sequence first: forks of a prompt read to its
        end start from its blocks (where there is room), new tokens are appended, rejected drafts' KV cut back,
        finished sequences leave. Returns (sequence, new token) events in that order."""
        events: list[tuple[Sequence, int]] = []
        for s, sampled in zip(results.plan.scheduled, results.sampled):
            seq = s.seq
            if sampled.error is not None:
                self._fail(seq, sampled.error)  # (its forks are queued as sequences of their own, to fail alone)
                continue
            if not sampled.tokens:
                continue
            if seq.forks:  # they draw their first token from the row after the prompt, before the parent extends
                firsts = dict(zip(map(id, s.forks), sampled.forks))
                for fork, first in list(zip(s.forks, sampled.forks)):
                    if first.error is not None and fork in seq.forks:
                        self._fail(fork, first.error)
                for fork in self._spawn(seq, firsts):
                    first = firsts[id(fork)]
                    events.extend(self._extend_or_fail(fork, first.tokens, [], first.logprobs))
            events.extend(self._extend_or_fail(seq, sampled.tokens, s.drafts, sampled.logprobs))
        return events

    def _extend_or_fail(self, seq: Sequence, new: list[int], drafts: list[int],
                        logprobs: list[TokenLogprob]) -> list[tuple[Sequence, int]]:
        """``_extend``, where a failure (its grammar refusing a token) ends ``seq`` alone."""
        try:
            return self._extend(seq, new, drafts, logprobs)
        except Exception as e:  # the sequence's own failure: the step goes on for the others
            self._fail(seq, e)
            return []

    def _spawn(self, parent: Sequence, drawn: dict[int, Sampled]) -> list[Sequence]:
        """``parent``'s forks that start now from its KV blocks (its prompt was just read; ``drawn``: the first
        tokens drawn for them, by ``id``); the others are queued as sequences of their own."""
        started = []
        whole = self.whole_sequences
        # a slot stays free for a waiting request that runs nothing: it would take one back from the forks next step
        counts = fairness.running_counts(self.running)
        waits = not whole and any(counts.get(w.group, 0) == 0 and w.group != parent.group for w in self.waiting)
        slots = self.max_running - waits
        for seq in parent.forks:
            seq.parent = None
            kv = None
            if len(self.running) < slots and id(seq) in drawn:
                assert parent.kv is not None  # the parent is running: it just read its prompt
                kv = parent.kv.fork(parent.prompt_len)
            # room as admission asks: the whole length under whole-sequence numerics, a block of growth each
            length = seq.prompt_len + seq.params.max_tokens if whole else seq.prompt_len
            spare = self.pool.num_groups * len(self.running)
            if kv is not None and (kv.blocks_for(length) + spare > self.pool.num_free or not kv.reserve(length)):
                kv.release()
                kv = None
            if kv is None:
                self._queue(seq)
                continue
            seq.kv = kv
            seq.reused = parent.reused
            self.stats.prompt_tokens_forked += seq.prompt_len
            self.running.append(seq)
            started.append(seq)
        parent.forks = []
        self.running.sort(key=lambda s: s.id)
        return started

    def _extend(self, seq: Sequence, new: list[int], drafts: list[int],
                logprobs: list[TokenLogprob] | None = None) -> list[tuple[Sequence, int]]:
        """Append a sequence's new tokens (up to its EOS or max_tokens) and cut its KV cache back to them: the
        keys and values of rejected drafts (and of tokens past the end) are dropped, their blocks freed."""
        for token in new:  # its thinking, then its grammar (one token: a sequence with a grammar drafts nothing)
            # the grammar reads the answer's tokens only: none of the thinking, its tags included
            part = seq.thinking.advance(token) if seq.thinking is not None else "answer"
            if seq.matcher is not None and token in seq.eos and (part != "answer" or not seq.matcher.accepting):
                raise GrammarError("the output ended where its grammar does not allow it to end (before its "
                                   "answer, or a grammar with no finite output)")
            if seq.matcher is not None and part == "answer":
                seq.matcher.accept(token)
        if drafts:
            assert seq.speculation is not None  # only a speculative sequence drafts
            kept = len(new) - 1
            seq.draft_tokens += len(drafts)
            seq.accepted_tokens += kept
            seq.draft_misses = 0 if kept else seq.draft_misses + 1
            seq.draft_pause = pause_after(seq.draft_misses)
            seq.draft_length = next_draft_length(seq.draft_length, len(drafts), kept, seq.speculation.num_tokens)
            self.stats.draft_tokens += len(drafts)
            self.stats.accepted_tokens += kept
        end = next((i + 1 for i, t in enumerate(new) if t in seq.eos), len(new))
        new = new[:min(end, seq.params.max_tokens - seq.num_generated)]
        keep = len(seq.tokens) + len(new) - 1  # the last new token is the next forward's input
        assert seq.kv is not None  # it ran this step: it holds its blocks
        if len(seq.kv) > keep:
            seq.kv.truncate(keep)
        events = []
        if seq.logprobs is not None and logprobs:
            seq.logprobs.extend(logprobs[:len(new)])  # new[i]'s TokenLogprob, read by whoever consumes it
        for token in new:
            seq.tokens.append(token)
            if seq.counts is not None:
                seq.counts.add(token)
            events.append((seq, token))
        if seq.first_token_time is None:
            seq.first_token_time = time.perf_counter()
        if new[-1] in seq.eos or (seq.matcher is not None and seq.matcher.done):  # the grammar is complete
            self.finish(seq, "stop")
        elif seq.num_generated >= seq.params.max_tokens:
            self.finish(seq, "length")
        return events

    def _admit(self) -> None:
        """Start waiting sequences in fairness's order (engine/fairness.py) while there is room; one whose group
        runs nothing makes room by preempting the newest sequence of the group running the most (not under
        whole-sequence numerics, which never preempt). The first in that order that does not fit stops it."""
        whole = self.whole_sequences
        while self.waiting:
            counts = fairness.running_counts(self.running)
            seq = fairness.next_to_admit(self.waiting, counts)
            newcomer = not whole and counts[seq.group] == 0  # its request runs nothing: it may make room
            if len(self.running) >= self.max_running:
                if not (newcomer and self._make_room(seq)):
                    return
                continue
            if not self._adapter_fits(seq):  # its LoRA adapter would be one more than the slots hold
                return
            kv = self.pool.sequence(seq.scope, seq.adapter)
            # the last token is always computed: its logits choose the next one
            reused = 0 if whole else kv.adopt_prefix(seq.tokens, len(seq.tokens) - 1)
            # room for the pending part (whole: for every position the sequence may reach), keeping a block of
            # growth for every running sequence
            length = seq.prompt_len + seq.params.max_tokens if whole else len(seq.tokens)
            if self.pool.gives_back and not whole:  # windows that give blocks back: a prompt's blocks are reserved
                length = min(length, len(kv) + self.max_batch_tokens)  # chunk by chunk (_plan), as it is read
            spare = self.pool.num_groups * len(self.running)  # a block of growth for each running table
            if kv.blocks_for(length) + spare > self.pool.num_free or not kv.reserve(length):
                kv.release()
                if newcomer and self._make_room(seq):
                    continue
                if not self.running:  # nothing will free blocks: cached ones are all there is
                    raise RuntimeError("the KV pool cannot hold a single admitted sequence")  # add() prevents it
                return
            self.waiting.remove(seq)
            seq.kv = kv
            if seq.reused is None:
                seq.reused = reused
                self.stats.prompt_tokens_reused += reused
                self.stats.prompt_tokens_computed += seq.prompt_len - reused
            else:  # back after a preemption
                self.stats.recomputed_tokens += len(seq.tokens) - reused
            self.running.append(seq)
            self.running.sort(key=lambda s: s.id)

    def _plan(self) -> list[tuple[Sequence, int, list[int]]]:
        """(sequence, pending tokens to run, drafted tokens to verify after them), oldest first."""
        plan: dict[int, tuple[Sequence, int, list[int]]] = {}
        for seq in self.running:  # blocks before every layer's window (a model whose every layer slides) go back
            if seq.kv is not None:  # (the next forward reads from len(seq.kv) - window on; kv_blocks.py)
                seq.kv.drop_outside_window()
        for seq in list(self.running):  # decoding sequences: one token each, oldest first
            if seq.kv is None or seq.pending != 1:
                continue
            # out of blocks: the newest sequence of the group running the most gives its own back (fairness.victim;
            # it may be one planned already)
            while seq.kv is not None and not seq.kv.reserve(len(seq.kv) + 1):
                victim = fairness.victim(self.running)
                assert victim is not None  # seq itself runs
                self._preempt(victim)
            if seq.kv is not None:
                plan[seq.id] = (seq, 1, [])
        plan = {i: p for i, p in plan.items() if p[0].kv is not None}
        budget = (self.max_batch_tokens if self.batched else float("inf")) - len(plan)
        for seq, _, drafts in plan.values():  # then their drafts, in blocks no decoding sequence needs
            drafts.extend(self._draft(seq))
            budget -= len(drafts)
        readers = [s for s in self.running if s.kv is not None and s.pending > 1]  # prompts (or recomputation)
        if self.whole_sequences or not self.batched:
            for seq in sorted(readers, key=lambda s: (s.priority, s.id)):
                if budget <= 0:
                    break
                # in one piece where chunks would round differently: the first prompt of a step may exceed the
                # budget; one that does not fit beside it waits for a step where it comes first (a smaller one may
                # run meanwhile: it delays no older prompt)
                if seq.pending > budget and any(n > 1 for _, n, _ in plan.values()):
                    continue
                plan[seq.id] = (seq, seq.pending, [])
                budget -= seq.pending
        elif budget > 0:  # chunked, the budget shared fairly between the requests reading prompts
            by_id = {s.id: s for s in readers}
            for i, n in fairness.prefill_shares(readers, int(budget)).items():
                plan[i] = (by_id[i], n, [])
        for i in sorted(plan):  # blocks for each prompt chunk (reserved at admission unless windows give back;
            seq, n, _ = plan[i]  # a decoding sequence's are reserved above: nothing to take)
            while seq.kv is not None and not seq.kv.reserve(len(seq.kv) + n):
                victim = fairness.victim(self.running)  # out of blocks: as a decoding sequence (above)
                assert victim is not None  # seq itself runs
                self._preempt(victim)
        return [plan[i] for i in sorted(plan) if plan[i][0].kv is not None]

    def _draft(self, seq: Sequence) -> list[int]:
        """The tokens ``seq``'s drafter proposes to verify this step, with blocks reserved for them: at most
        one fewer than the tokens it may still generate, none where the blocks are not free."""
        if seq.speculation is None:
            return []
        if seq.draft_pause:  # its recent drafts all failed: a verify row costs more than it brings
            seq.draft_pause -= 1
            return []
        k = min(seq.draft_length, seq.params.max_tokens - seq.num_generated - 1)
        thinking_left = seq.thinking.left if seq.thinking is not None else None
        if thinking_left is not None:  # no draft past its thinking budget: the forced end comes there, as unbatched
            k = min(k, thinking_left - 1)
        if k < 1:
            return []
        vocab = self.model.config.vocab_size
        drafts = []
        for token in seq.speculation.drafter.propose(seq, k)[:k]:
            if isinstance(token, bool) or not isinstance(token, int) or not 0 <= token < vocab:
                break  # a drafter's bad guess is never run
            drafts.append(token)
        assert seq.kv is not None  # a running sequence holds its blocks
        while drafts and not seq.kv.reserve(len(seq.kv) + 1 + len(drafts)):
            drafts.pop()
        return drafts

    def _adapter_fits(self, seq: Sequence) -> bool:
        """Whether ``seq`` may run beside the running sequences: a forward holds at most ``max_loras`` LoRA
        adapters (the model's slots, lora/slots.py), so one more adapter waits for a running one to finish."""
        if seq.adapter is None:
            return True
        running = {s.adapter.uid for s in self.running if s.adapter is not None}
        return seq.adapter.uid in running or len(running) < getattr(self.model, "max_loras", 0)

    def _make_room(self, newcomer: Sequence) -> bool:
        """Preempt the newest sequence of the group running the most (more than one, of ``newcomer``'s priority or
        worse) for ``newcomer``, whose group runs nothing; False: there is none."""
        seq = fairness.victim(self.running, newcomer)
        if seq is None:
            return False
        self._preempt(seq)
        self.stats.fair_preemptions += 1
        return True

    def _preempt(self, seq: Sequence) -> None:
        """Free the blocks of a running sequence and queue it first; it recomputes its tokens when
        re-admitted (its generated tokens become part of the tokens to prefill)."""
        assert seq.kv is not None  # running: it holds its blocks
        seq.kv.release()
        seq.kv = None
        self.running.remove(seq)
        seq.preemptions += 1
        self.stats.preemptions += 1
        self._queue(seq)
