"""A reasoning model's thinking, as the engine sees it: where it ends, how long it may be, what the grammar waits for.

Reasoning models (DeepSeek-R1 and its distills, Qwen3, QwQ) write their chain of thought first, between tags such
as ``<think>`` and ``</think>``, then the answer. The engine knows nothing of tags' text: a ``ThinkingRule`` (made
per request by whoever reads the chat template, text/reasoning.py) tells it

    open_at_start   the reply starts inside the thinking (the template opened it in the prompt, or the model always
                    opens it first thing); False: no thinking (switched off, or the prompt already closed it) —
                    unless ``start_ids`` is given:
    start_ids       the opening tag's token id (one), for a model that opens the thinking itself if it wants to
                    (Qwen3): its first token decides — the tag opens the thinking, anything else starts the answer;
                    a grammar allows the tag beside what it allows at its start, so either can come
    end_ids         the token ids that close it (one token where the tag is a token of the vocabulary)
    forced_end      the tokens the engine appends, unsampled, when the thinking reaches ``budget`` tokens (e.g. the
                    ids of "\\n</think>\\n\\n"), so the answer follows
    budget          thinking tokens at most (None: unbounded)

and the engine then, per sequence (``ThinkingState``): counts the thinking tokens (``usage.reasoning_tokens``: those
before the closing tag), forces ``forced_end`` once the budget is spent (exact like every other token: forced tokens
depend on nothing but the sequence itself, so batching and speculative decoding change nothing), and holds the
request's grammar back until the thinking has closed, so structured outputs constrain the answer, never the
thinking; without thinking the grammar applies from the first token.
"""

from __future__ import annotations

import dataclasses


@dataclasses.dataclass(frozen=True)
class ThinkingRule:
    end_ids: tuple[int, ...]
    forced_end: tuple[int, ...]
    budget: int | None = None
    open_at_start: bool = True
    start_ids: tuple[int, ...] = ()

    def __post_init__(self) -> None:
        if not self.end_ids:
            raise ValueError("a thinking rule needs the token ids that end the thinking")
        if len(self.start_ids) > 1 or (self.start_ids and self.open_at_start):
            raise ValueError("start_ids is one token, for a reply that does not start inside the thinking")
        if self.budget is not None and self.budget < 0:
            raise ValueError(f"a thinking budget must be >= 0, got {self.budget}")
        if not _contains(tuple(self.forced_end), tuple(self.end_ids)):  # forcing it must close the thinking
            raise ValueError("the forced end of the thinking must contain its end tokens")


def _contains(tokens: tuple[int, ...], part: tuple[int, ...]) -> bool:
    return any(tokens[i:i + len(part)] == part for i in range(len(tokens) - len(part) + 1))


class ThinkingState:
    """One sequence's progress through its thinking: open or closed, its thinking tokens, the forced end's progress.
    ``forced`` is a question (the runner asks it); only ``advance`` (the scheduler's commit) changes the state."""

    def __init__(self, rule: ThinkingRule) -> None:
        self.rule = rule
        self.open = rule.open_at_start
        self.may_open = bool(rule.start_ids)  # the first token decides: the opening tag, or the answer
        self.tokens = 0  # thinking tokens sampled (the end's tokens and forced tokens not counted)
        self._tail: tuple[int, ...] = ()  # the last tokens, to see an end of several tokens
        self._forced_taken = 0  # tokens of the forced end appended so far

    @property
    def spent(self) -> bool:
        """The budget is spent: the sequence takes the forced end, token by token, until the thinking closes."""
        return self.open and self.rule.budget is not None and self.tokens >= self.rule.budget

    @property
    def forced(self) -> int | None:
        """The token the sequence must take next without sampling, or None: it samples."""
        if not self.spent or self._forced_taken >= len(self.rule.forced_end):
            return None
        return self.rule.forced_end[self._forced_taken]

    @property
    def left(self) -> int | None:
        """Thinking tokens it may still sample (None: no budget, or the thinking is closed)."""
        if not self.open or self.rule.budget is None:
            return None
        return max(self.rule.budget - self.tokens, 0)

    def advance(self, token: int) -> str:
        """Note a token the sequence took; what it was: "thinking" (a tag included), "end" (it closed the
        thinking: the grammar engages after it) or "answer"."""
        if self.may_open:
            self.may_open = False
            if token == self.rule.start_ids[0]:
                self.open = True
                return "thinking"
        if not self.open:
            return "answer"
        forced = self.forced is not None
        end = self.rule.end_ids
        self._tail = (self._tail + (token,))[-len(end):]
        if self._tail == end:
            self.open = False
            if not forced:  # the end's earlier tokens were counted as thinking
                self.tokens -= min(len(end) - 1, self.tokens)
            return "end"
        if forced:
            self._forced_taken += 1
        else:
            self.tokens += 1
        return "thinking"
