"""What a sequence is decoded with: ``Speculation`` (a drafter and K), and ``resolve`` for the user's words."""

from __future__ import annotations

import dataclasses

import llaisys

from .drafters import Drafter

DEFAULT_NUM_TOKENS = 4
MAX_NUM_TOKENS = 32
MAX_PAUSE = 8  # decode steps at most without drafting, after verify steps that kept nothing


@dataclasses.dataclass(frozen=True)
class Speculation:
    """Draft up to ``num_tokens`` tokens per step with ``drafter`` and verify them in one forward."""
    drafter: Drafter
    num_tokens: int = DEFAULT_NUM_TOKENS

    def __post_init__(self):
        check_num_tokens(self.num_tokens)
        if not isinstance(self.drafter, Drafter):
            raise llaisys.LlaisysValueError(f"a drafter must be a llaisys_models.engine.speculative.Drafter, got "
                                            f"{type(self.drafter).__name__}")


def pause_after(misses: int) -> int:
    """Steps a sequence decodes without drafting after ``misses`` verify steps in a row kept no draft: 0, 1,
    3, 7, 8, ... A failed verify step costs more than a decode step (its extra rows), so where drafts fail
    (free text) a sequence soon drafts rarely, and it drafts every step again once one is kept."""
    return min((1 << misses) - 1, MAX_PAUSE) if misses else 0


def next_draft_length(length: int, drafted: int, kept: int, most: int) -> int:
    """How many tokens a sequence drafts next (at most ``most``, its ``num_speculative_tokens``), after a
    verify step that kept ``kept`` of the ``drafted`` it drafted with ``length``: twice as many when all were
    kept (a copied span goes on: 1, 2, 4, ... up to ``most``), else one more than were kept (a draft that
    failed at its first token costs one extra row next time, not K). Each row a verify step runs costs
    compute (benchmarks/speculative.py --step-costs), so rows that would be rejected are worth not running.
    HF transformers' assisted generation adapts its draft length too (num_assistant_tokens_schedule
    "heuristic": +2 when all were kept, else -1)."""
    if kept >= drafted:
        return min(most, 2 * length)
    return min(most, kept + 1)


def check_num_tokens(k) -> None:
    if isinstance(k, bool) or not isinstance(k, int) or not 1 <= k <= MAX_NUM_TOKENS:
        raise llaisys.LlaisysValueError(f"num_speculative_tokens must be an integer in [1, {MAX_NUM_TOKENS}], "
                                        f"got {k!r}")


def check_numerics(model) -> None:
    """Speculation needs verify rows equal to decode rows bit for bit: ``numerics="exact"``."""
    if model.numerics != "exact":
        raise llaisys.LlaisysValueError(
            f"speculative decoding needs numerics='exact' (this model runs numerics={model.numerics!r}, which "
            f"rounds attention by the pieces a sequence is computed in, so a verify forward of several rows "
            f"would not give the tokens of plain decoding); load the model with numerics='exact'")
