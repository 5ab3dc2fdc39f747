"""Fair scheduling: which waiting sequence starts next, which running one gives up its place, how a step's prompt
tokens are shared — so that one request never holds another up for long, whatever it asks for.

A *group* is one request (``Sequence.group``): the n choices of a request (``Scheduler.fork``) belong to their
parent's group, so a request of n=128 counts as one however many of its sequences run. Lower ``priority`` values go
first (vLLM's convention): a better priority is served first in admission and in prefill; fairness holds between
the groups of equal priority.

    admission   the waiting sequence of the best priority whose group runs the fewest sequences, then the oldest
                (``next_to_admit``): a new request's first sequence starts before the 112 queued forks of another
                request, and a preempted sequence goes before newer sequences of groups running as many
    room        a sequence whose group runs nothing, finding no free slot (``max_running``) or no free blocks,
                preempts the newest sequence of the group running the most, of its priority or worse
                (``victim``), only where that group runs more than one: a request keeps its last slot, so fairness
                never thrashes (the preempted sequence's group still runs, so it never preempts in turn). A sequence
                that needs a block to decode gives the newest sequence of the group running the most (of the worst
                priority) to the pool likewise (``victim`` with no ``newcomer``): with one sequence a group, the
                newest, as before
    prefill     the token budget a step leaves after its decoding sequences (and their drafts) is shared between
                the groups reading prompts in equal parts, max-min fair (``fair_split``: a group that needs less
                than its part leaves the rest to the others; the remainder of the division goes to the oldest
                groups, a token each), and a group's part to its sequences oldest first (``prefill_shares``); a
                better priority takes its groups' parts before a worse one gets any

Equal parts rather than least-served first or round-robin: equal parts need no state kept across steps
(preemption, finishing and recomputation change nothing), use the whole budget (work-conserving), and give a
bound both ways: beside k other groups reading prompts, a prompt of P tokens is read within
ceil(P / floor(B / (k + 1))) steps of a budget B, and every group reading a prompt advances by floor(B / (k + 1))
tokens or more every step (no starvation of a long prompt). Least-served first keeps a tally a long prompt can
never win back, so a steady stream of small prompts would stop it; round-robin gives a newcomer the budget only
every k-th step. Splitting a prompt into smaller chunks changes no token under the default numerics (batch
invariance); under whole-sequence numerics prompts are never split, and the scheduler keeps its own rule there.
"""

from __future__ import annotations

import collections
from collections.abc import Iterable, Mapping

from .sequence import Sequence

__all__ = ["fair_split", "next_to_admit", "prefill_shares", "running_counts", "victim"]


def running_counts(running: Iterable[Sequence]) -> collections.Counter[int]:
    """How many sequences each group runs."""
    return collections.Counter(s.group for s in running)


def next_to_admit(waiting: Iterable[Sequence], counts: Mapping[int, int]) -> Sequence:
    """The waiting sequence to start next: the best priority, then the group running fewest, then the oldest."""
    return min(waiting, key=lambda s: (s.priority, counts.get(s.group, 0), s.id))


def victim(running: list[Sequence], newcomer: Sequence | None = None) -> Sequence | None:
    """The running sequence to preempt: the newest of the group running the most, of the worst priority.

    For a ``newcomer`` whose group runs nothing (fairness): only from groups running more than one sequence, of the
    newcomer's priority or worse (None: there is none). Without one (the pool is out of blocks): any sequence."""
    counts = running_counts(running)
    candidates: Iterable[Sequence] = running
    if newcomer is not None:
        candidates = [s for s in running if counts[s.group] > 1 and s.priority >= newcomer.priority]
    return max(candidates, key=lambda s: (s.priority, counts[s.group], s.id), default=None)


def fair_split(demands: list[int], budget: int) -> list[int]:
    """Max-min fair parts of ``budget`` for ``demands`` (listed oldest first): equal parts, a demand smaller than
    its part taking only what it needs and leaving the rest to the others, the remainder a token each to the
    first. The parts sum to min(budget, sum(demands)); none exceeds its demand."""
    parts = [0] * len(demands)
    active = [i for i, d in enumerate(demands) if d > 0]
    while budget > 0 and active:
        each = budget // len(active)
        if each == 0:  # fewer tokens than claimants: the oldest get one each
            for i in active[:budget]:
                parts[i] += 1
            break
        for i in active:
            give = min(each, demands[i] - parts[i])
            parts[i] += give
            budget -= give
        active = [i for i in active if parts[i] < demands[i]]
    return parts


def prefill_shares(readers: Iterable[Sequence], budget: int) -> dict[int, int]:
    """Tokens of each sequence reading its prompt (``pending`` > 0) to run this step within ``budget``, by
    ``Sequence.id`` (none: not there): the best priority first, equal parts between its groups (``fair_split``,
    groups in the order of their oldest reader), a group's part to its sequences oldest first."""
    groups: dict[tuple[int, int], list[Sequence]] = {}
    for s in sorted(readers, key=lambda s: (s.priority, s.id)):
        groups.setdefault((s.priority, s.group), []).append(s)
    levels: dict[int, list[list[Sequence]]] = {}
    for (priority, _), members in groups.items():
        levels.setdefault(priority, []).append(members)
    shares: dict[int, int] = {}
    for level in levels.values():  # (ascending priority: the dicts keep the sorted order)
        if budget <= 0:
            break
        parts = fair_split([sum(s.pending for s in members) for members in level], budget)
        for members, part in zip(level, parts):
            for s in members:
                n = min(s.pending, part)
                if n <= 0:
                    break
                shares[s.id] = n
                part -= n
                budget -= n
    return shares
