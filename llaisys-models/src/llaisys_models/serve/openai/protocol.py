"""What every OpenAI endpoint's request and response share: fields checked one by one (request_body.field), the
chat roles, the usage body and the shape of a response of choices.

Requests are parsed by hand rather than by a schema library so that every rejection names its parameter in
OpenAI's words (``param`` = ``messages[2].role``) and says what was expected. Unknown parameters are ignored
(clients send vendor extras); known ones this server cannot honour (echo, suffix, ...) are refused rather than
silently dropped. Each endpoint's own fields are in its protocol.py; the sampling fields in sampling.py.
"""

from __future__ import annotations

import math
from collections.abc import Collection, Sequence
from typing import TYPE_CHECKING, Any, Protocol

from ..engine import TokenLogprobText, Usage
from ..errors import invalid
from ..request_body import field

if TYPE_CHECKING:
    from ..tool_calls import ToolCall

ROLES = {"system": "system", "developer": "system", "user": "user", "assistant": "assistant", "tool": "tool"}
MAX_MESSAGES = 2048  # OpenAI's limit; it bounds the event loop's checks and the chat template's rendering
# the log-probability of a token that cannot be chosen (a grammar masks it to -inf), as OpenAI writes it (and vLLM:
# max(logprob, -9999.0)): JSON has no -Infinity, so json.dumps would write a stream's data line that is not JSON
# and a whole response would fail to render
IMPOSSIBLE_LOGPROB = -9999.0


def unsupported(body: dict, name: str, neutral: Collection[object]) -> None:
    """Refuse a parameter this server does not implement unless it has its neutral value."""
    value = body.get(name)
    if value is not None and value not in neutral:
        raise invalid(f"'{name}' = {value!r} is not supported by this server", name, "unsupported_parameter")


def model_name(body: dict) -> str | None:
    """``model``: optional, as one model is served (None: that one)."""
    return field(body, "model", "string")


def stream_flags(body: dict) -> tuple[bool, bool]:
    """(stream, include_usage) from ``stream`` and ``stream_options``."""
    stream = field(body, "stream", "boolean", default=False)
    options = field(body, "stream_options", "object", default={})
    include_usage = field(options, "include_usage", "boolean", default=False, param="stream_options.include_usage")
    if options and not stream:
        raise invalid("'stream_options' is only allowed when 'stream' is true", "stream_options")
    return stream, include_usage


def json_logprob(logprob: float) -> float:
    """``logprob`` as a JSON number: at least IMPOSSIBLE_LOGPROB, which also stands for -inf (and NaN)."""
    return logprob if math.isfinite(logprob) and logprob > IMPOSSIBLE_LOGPROB else IMPOSSIBLE_LOGPROB


def usage_body(usage: Usage) -> dict:
    """``usage`` of a chat or completions response (the Responses API names its fields otherwise): of the
    completion tokens, ``reasoning_tokens`` are a reasoning model's thinking."""
    return {"prompt_tokens": usage.prompt_tokens, "completion_tokens": usage.completion_tokens,
            "total_tokens": usage.prompt_tokens + usage.completion_tokens,
            "prompt_tokens_details": {"cached_tokens": usage.cached_tokens},
            "completion_tokens_details": {"reasoning_tokens": usage.reasoning_tokens}}


class ChoicesShape:
    """The bodies of one chat or completions response (``chat.completion`` / ``text_completion`` and their stream
    chunks, each chunk carrying one choice, named by its ``index``): what the two share. Subclasses:
    chat/protocol.ChatShape, completions/protocol.CompletionShape."""

    whole: str  # the ``object`` of the whole response
    chunked: str  # the ``object`` of a stream chunk

    def __init__(self, response_id: str, created: int, model: str):
        self.head: dict[str, Any] = {"id": response_id, "object": None, "created": created, "model": model,
                     "system_fingerprint": None}

    @property
    def id(self) -> str:
        return self.head["id"]

    def body(self, obj: str, choices: list, usage: dict | None) -> dict:
        return {**self.head, "object": obj, "choices": choices, "usage": usage}

    def usage_chunk(self, usage: Usage) -> dict:
        """The extra last chunk of ``stream_options.include_usage``: no choices, the usage."""
        return self.body(self.chunked, [], usage_body(usage))

    def complete(self, choices: list[tuple], usage: Usage) -> dict:
        """The whole response: (text, finish reason) of each choice, in index order."""
        raise NotImplementedError

    def chunk(self, text: str | None = None, finish_reason: str | None = None, first: bool = False,
              index: int = 0) -> dict:
        """One stream chunk of choice ``index`` (``first``: its opening one; ``finish_reason``: its last)."""
        raise NotImplementedError

    def logprobs(self, entries: Sequence[TokenLogprobText], offset: int = 0) -> dict:
        """A choice's ``logprobs`` for the engine's TokenLogprobText ``entries`` (``offset``: the characters of
        the choice already sent), every log-probability through json_logprob."""
        raise NotImplementedError

    def tool_call_chunks(self, call: ToolCall, index: int = 0) -> list[dict]:
        """The stream chunks of a tool call of choice ``index`` (chat's alone: completions have none)."""
        raise NotImplementedError

    def reasoning_chunk(self, text: str, index: int = 0) -> dict:
        """A stream chunk of choice ``index``'s thinking (chat's alone: completions are raw text)."""
        raise NotImplementedError


class ChoiceText(Protocol):
    """What a choice's text becomes as it streams: the pieces to send (text, a chat tool call, a reasoning.Thought)
    and, at its end, what was held back and its finish reason (chat/serving.ToolParsers, reasoning.ReasoningChoices;
    completions' text passes as it is)."""

    def push(self, index: int, text: str) -> list: ...

    def finish(self, index: int, reason: str) -> tuple[list, str]: ...
