"""A reasoning model's requests: their switches, the engine's rule for their thinking, and their choices' text split
into thinking and answer (the server's parser: ``Server.reasoning``, text/reasoning.py; None: text as it comes).

The switches, on chat completions and /v1/responses:

    chat_template_kwargs   an object of chat template variables, e.g. ``{"enable_thinking": false}`` for Qwen3
                           (vLLM's and llama.cpp's field), over the server's --chat-template-kwargs
    thinking_token_budget  the most tokens the reply may think (vLLM's field), else --thinking-token-budget; then
                           the thinking is closed for it and the answer follows

A choice's thinking travels as ``Thought`` pieces ahead of its answer, which alone goes on to the tool-call parser,
so calls are read from the answer only; a call written inside a thinking that never closes is the answer's
(text/reasoning.ReasoningSplitter's ``hold_from``). /v1/completions is raw text: none of this applies to it.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import TYPE_CHECKING

from ...engine.sampling import SamplingParams
from ...text.reasoning import ReasoningParser, ReasoningSplitter
from ...text.template_kwargs import ReservedName, usable
from ..errors import invalid
from ..request_body import field
from .sampling import ruled

if TYPE_CHECKING:
    from ..server import Server
    from .protocol import ChoiceText


@dataclasses.dataclass(frozen=True)
class Thought:
    """A piece of a choice's thinking, among the pieces of its text (protocol.ChoiceText)."""
    text: str


def template_kwargs(server: Server, body: dict) -> dict:
    """The chat template's variables for this request: its ``chat_template_kwargs`` over the server's; a name the
    server renders with itself is a 400 naming it, one the template never reads is dropped."""
    value = field(body, "chat_template_kwargs", "object")
    if not value:
        return server.chat_template_kwargs
    try:
        kept, _ = usable(value, server.template_names)
    except ReservedName as e:
        raise invalid(f"'chat_template_kwargs.{e.name}' cannot be set: the server sets it when it renders the chat "
                      f"template", "chat_template_kwargs") from None
    return {**server.chat_template_kwargs, **kept}


def thinking_budget(server: Server, body: dict) -> int | None:
    """The request's ``thinking_token_budget`` (>= 0), else the server's; a 400 where the server parses no
    thinking (the field would do nothing)."""
    budget = ruled(body, "thinking_token_budget")
    if budget is None:
        return server.thinking_token_budget
    if server.reasoning is None:
        raise invalid("'thinking_token_budget' needs a reasoning model: this server parses no thinking (its model's "
                      "chat template has none, or it runs with --reasoning-parser none)", "thinking_token_budget")
    return int(budget)


def with_thinking(server: Server, params: SamplingParams, prompt: Sequence[int], budget: int | None) -> SamplingParams:
    """``params`` with the engine's rule for a reply to ``prompt`` (unchanged where the server parses none)."""
    if server.reasoning is None:
        return params
    return dataclasses.replace(params, thinking=server.reasoning.rule(prompt, budget))


class ReasoningChoices:
    """Each choice's text split as it streams (a protocol.ChoiceText): its thinking as ``Thought`` pieces, its
    answer through ``inner`` (the tool-call parsers, or plain text). ``hold_from``: the tool calls' openers."""

    def __init__(self, parser: ReasoningParser, prompt: Sequence[int], inner: ChoiceText, choices: int,
                 hold_from: Sequence[str] = ()) -> None:
        self.inner = inner
        self.splitters: list[ReasoningSplitter] = [parser.splitter(prompt, hold_from) for _ in range(choices)]

    def push(self, index: int, text: str) -> list:
        return self._pieces(index, *self.splitters[index].push(text))

    def finish(self, index: int, reason: str) -> tuple[list, str]:
        pieces = self._pieces(index, *self.splitters[index].finish())
        held, reason = self.inner.finish(index, reason)
        return pieces + held, reason

    def _pieces(self, index: int, thought: str, answer: str) -> list:
        return ([Thought(thought)] if thought else []) + (self.inner.push(index, answer) if answer else [])
