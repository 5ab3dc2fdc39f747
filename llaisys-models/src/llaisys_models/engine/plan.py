"""What passes between the scheduler and the model runner in one step: the plan and its results.

    plan = scheduler.schedule()        # StepPlan: which sequences, how many of their tokens, their drafts
    results = runner.execute(plan)     # StepResults: the tokens each sampled (runner.py)
    events = scheduler.commit(results)  # tokens appended, stops, KV cut back, forks started (scheduler.py)

The plan says everything the runner needs besides the sequences' own sampling state (parameters, seed,
token counts for penalties, grammar matcher, read from ``seq``): the runner changes no scheduler state but
the KV blocks' contents (``forward_batch`` appends the step's tokens to each sequence's blocks); the results
say what was drawn (drafts already verified), and the scheduler alone decides what it means: tokens past EOS or
max_tokens are dropped, a grammar's matcher advances, rejected drafts' KV is cut back, a fork that finds no room
waits. A sequence whose choice failed carries its error in its ``Sampled``; the scheduler ends that sequence
alone (``Scheduler.failed``) and every other sequence of the step goes on.
"""

from __future__ import annotations

import dataclasses

from .sampling import TokenLogprob
from .sequence import Sequence


@dataclasses.dataclass(slots=True)
class ScheduledSequence:
    """One sequence's part of a step: ``input_ids`` (its next ``num_tokens`` pending tokens, then ``drafts``)
    are run; the logits of its last ``num_logits`` rows are sampled (0: a prompt chunk short of the prompt's end;
    else 1 + len(drafts)); ``forks`` draw their first token from its first sampled row (n choices of a prompt
    whose end this step reads)."""
    seq: Sequence
    num_tokens: int
    drafts: list[int]
    input_ids: list[int]
    num_logits: int
    forks: tuple[Sequence, ...] = ()


@dataclasses.dataclass(slots=True)
class StepPlan:
    """One forward's worth of work, oldest sequence first (empty: nothing to run)."""
    scheduled: list[ScheduledSequence]

    def __bool__(self) -> bool:
        return bool(self.scheduled)

    @property
    def num_tokens(self) -> int:
        """Token rows of the forward (pending tokens and drafts): what ``max_batch_tokens`` bounds."""
        return sum(len(s.input_ids) for s in self.scheduled)


@dataclasses.dataclass(slots=True)
class Sampled:
    """What one sequence drew: its verified drafts and the model's token after them (1 to len(drafts)+1
    tokens; none for a prompt chunk short of the end), and each token's log-probability where it asked; or,
    where its choice failed (its grammar, its parameters, a bug that shows only for its row), the ``error``,
    which ends that sequence alone."""
    tokens: list[int]
    logprobs: list[TokenLogprob]
    forks: tuple[Sampled, ...] = ()  # the first token of each of the plan's forks, in their order
    error: Exception | None = None


@dataclasses.dataclass(slots=True)
class StepResults:
    """The runner's answer to ``plan``: ``sampled[i]`` is ``plan.scheduled[i]``'s."""
    plan: StepPlan
    sampled: list[Sampled]
