"""The prompt of each chat turn, built from as much of the conversation as the model's context holds.

Each turn keeps room for the reply: the oldest exchanges (user message + reply) are dropped
until prompt + ``max_new_tokens`` fit, then the reply budget shrinks to the room left. A
message that leaves no room even on its own is refused (``TurnTooLong``) and the
conversation stays as it was, so the chat goes on. How much history a prompt shows is the
chat template's business: a model trained on single exchanges (the demo) has a template
that renders only the last user message, so its prompts never grow.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from llaisys import LlaisysValueError

from .tokenizer import Tokenizer, encode


class TurnTooLong(LlaisysValueError):
    """One message that does not fit in the model's context with room for a reply."""


@dataclasses.dataclass(frozen=True)
class Turn:
    ids: list[int]  # the prompt: history kept + the new message, through the chat template
    max_new_tokens: int  # the reply budget, >= 1
    dropped: int  # exchanges dropped from the start of the history to make room


class ChatHistory:
    def __init__(self, tokenizer: Tokenizer, context_length: int, max_new_tokens: int,
                 template_kwargs: Mapping[str, Any] | None = None) -> None:
        if max_new_tokens < 1:
            raise LlaisysValueError(f"a chat needs max_new_tokens >= 1 to answer, got {max_new_tokens}")
        self.tokenizer = tokenizer
        self.template_kwargs = dict(template_kwargs or {})  # more variables for the chat template
        self.context_length = context_length
        self.max_new_tokens = max_new_tokens
        self.exchanges: list[tuple[str, str]] = []  # (user message, reply), oldest first

    def turn(self, message: str) -> Turn:
        """The prompt for ``message`` (raises TurnTooLong, or the tokenizer's error for a message
        with no tokens, without changing the history)."""
        for dropped in range(len(self.exchanges) + 1):
            ids = encode(self.tokenizer, self._messages(self.exchanges[dropped:], message),
                         template_kwargs=self.template_kwargs)
            room = self.context_length - len(ids)
            if room >= self.max_new_tokens:
                break
        if room < 1:
            raise TurnTooLong(f"this message is too long: on its own it makes a {len(ids)}-token prompt, which "
                              f"leaves no room for a reply in the model's context of {self.context_length} "
                              f"positions; shorten it")
        return Turn(ids, min(self.max_new_tokens, room), dropped)

    def add(self, turn: Turn, message: str, reply: str) -> None:
        """Record an answered turn (and forget what it dropped); ``reply``: its answer (a reasoning model's
        thinking is not shown to the model again)."""
        self.exchanges = self.exchanges[turn.dropped:] + [(message, reply)]

    @staticmethod
    def _messages(exchanges: list[tuple[str, str]], message: str) -> list[dict]:
        messages: list[dict] = []
        for user, reply in exchanges:
            messages += [{"role": "user", "content": user}, {"role": "assistant", "content": reply}]
        return messages + [{"role": "user", "content": message}]
