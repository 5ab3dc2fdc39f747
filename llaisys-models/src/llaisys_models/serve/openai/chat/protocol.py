"""``POST /v1/chat/completions``: its request's messages and log-probability fields, and its response bodies
(``chat.completion`` and its ``chat.completion.chunk`` stream). Its tools: tools.py; the fields every endpoint
shares: ../protocol.py and ../sampling.py."""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from ....engine.sampling_rules import RULES
from ...engine import TokenLogprobText, Usage
from ...errors import invalid
from ...request_body import field, json_type
from ...tool_calls import ToolCall
from ..protocol import MAX_MESSAGES, ROLES, ChoicesShape, json_logprob, usage_body
from ..sampling import in_range, typed


def chat_messages(body: dict) -> list[dict]:
    """The ``messages`` as [{"role", "content"}] for the chat template (``developer`` -> ``system``); an assistant
    message's ``tool_calls`` and a tool message's ``tool_call_id`` (and ``name``) go along, each call's
    ``arguments`` parsed into an object, as chat templates expect it. An assistant message's thinking
    (``reasoning_content``, ``reasoning``: what this server sent back) is dropped, as the reasoning models'
    templates drop earlier turns' thinking themselves."""
    messages = field(body, "messages", "array", required=True)
    if not messages:
        raise invalid("'messages' must contain at least one message", "messages", "empty_array")
    if len(messages) > MAX_MESSAGES:
        raise invalid(f"'messages' holds {len(messages)} messages; at most {MAX_MESSAGES} are allowed", "messages",
                      "array_too_long")
    out: list[dict[str, Any]] = []
    for i, message in enumerate(messages):
        param = f"messages[{i}]"
        if not isinstance(message, dict):
            raise invalid(f"'{param}' must be an object, got {json_type(message)}", param, "invalid_type")
        role = field(message, "role", "string", required=True, param=f"{param}.role")
        if role not in ROLES:
            raise invalid(f"'{param}.role' = {role!r} is not a supported role; use one of "
                          f"{', '.join(ROLES)}", f"{param}.role", "invalid_role")
        content = message.get("content")
        if content is None and role != "assistant":
            raise invalid(f"missing required parameter '{param}.content'", f"{param}.content",
                          "missing_required_parameter")
        out.append({"role": ROLES[role], "content": "" if content is None else _content_text(content,
                                                                                              f"{param}.content")})
        if role == "assistant" and message.get("tool_calls"):
            out[-1]["tool_calls"] = _message_tool_calls(message, param)
        if role == "tool":
            out[-1]["tool_call_id"] = field(message, "tool_call_id", "string", required=True,
                                            param=f"{param}.tool_call_id")
            if message.get("name") is not None:
                out[-1]["name"] = field(message, "name", "string", param=f"{param}.name")
    return out


def _content_text(content: Any, param: str) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):  # content parts: text only
        texts = []
        for i, part in enumerate(content):
            p = f"{param}[{i}]"
            if not isinstance(part, dict):
                raise invalid(f"'{p}' must be an object, got {json_type(part)}", p, "invalid_type")
            if part.get("type") != "text":
                raise invalid(f"'{p}.type' = {part.get('type')!r} is not supported; only text parts are",
                              f"{p}.type", "unsupported_content")
            texts.append(field(part, "text", "string", required=True, param=f"{p}.text"))
        return "".join(texts)
    raise invalid(f"'{param}' must be a string or an array of text parts, got {json_type(content)}", param,
                  "invalid_type")


def _message_tool_calls(message: dict, param: str) -> list[dict]:
    """An assistant message's ``tool_calls``, each ``{"id", "type": "function", "function": {"name", "arguments"}}``
    with ``arguments`` as an object (OpenAI sends its JSON text; templates render the object)."""
    calls = field(message, "tool_calls", "array", param=f"{param}.tool_calls")
    out = []
    for j, call in enumerate(calls):
        p = f"{param}.tool_calls[{j}]"
        if not isinstance(call, dict):
            raise invalid(f"'{p}' must be an object, got {json_type(call)}", p, "invalid_type")
        if field(call, "type", "string", default="function", param=f"{p}.type") != "function":
            raise invalid(f"'{p}.type' = {call['type']!r} is not supported; only 'function' is", f"{p}.type")
        function = field(call, "function", "object", required=True, param=f"{p}.function")
        name = field(function, "name", "string", required=True, param=f"{p}.function.name")
        text = field(function, "arguments", "string", required=True, param=f"{p}.function.arguments")
        try:
            arguments = json.loads(text)
        except ValueError as e:
            raise invalid(f"'{p}.function.arguments' is not valid JSON: {e}", f"{p}.function.arguments") from None
        if not isinstance(arguments, dict):
            raise invalid(f"'{p}.function.arguments' must be a JSON object, got {json_type(arguments)}",
                          f"{p}.function.arguments")
        out.append({"id": field(call, "id", "string", default=f"call_{j}", param=f"{p}.id"), "type": "function",
                    "function": {"name": name, "arguments": arguments}})
    return out


def logprobs_count(body: dict) -> int | None:
    """How many top alternatives each token's log-probability comes with (``logprobs: true`` with
    ``top_logprobs``), or None (not asked)."""
    wanted = field(body, "logprobs", "boolean", default=False)
    top = body.get("top_logprobs")
    if top is not None:
        typed(RULES["top_logprobs"], top, "top_logprobs")
        if not wanted:
            raise invalid("'top_logprobs' needs 'logprobs': true", "top_logprobs")
        in_range(RULES["top_logprobs"], top, "top_logprobs")
    return (top or 0) if wanted else None


# -- the response -------------------------------------------------------------------------------------------

class ChatShape(ChoicesShape):
    """A ``chat.completion`` and its chunks. ``reasoning``: the server parses a reasoning model's thinking, so each
    message says it (``reasoning_content``, DeepSeek's and llama.cpp's name, and ``reasoning``, vLLM's; null where
    there was none), and a stream's thinking comes in chunks of its own."""

    whole, chunked = "chat.completion", "chat.completion.chunk"

    def __init__(self, response_id: str, created: int, model: str, reasoning: bool = False):
        super().__init__(response_id, created, model)
        self.reasoning = reasoning

    def complete(self, choices: list[tuple], usage: Usage) -> dict:
        """The whole response: (content or None, finish reason, [ToolCall], thinking or None) of each choice, in
        index order (the last two may be left out: no calls, no thinking)."""
        body = [{"index": i, "message": self._message(*choice), "logprobs": None, "finish_reason": choice[1]}
                for i, choice in enumerate(choices)]
        return self.body(self.whole, body, usage_body(usage))

    def _message(self, content: str | None, reason: str, calls: tuple | list = (), thought: str | None = None) -> dict:
        message: dict[str, Any] = {"role": "assistant", "content": content, "refusal": None}
        if self.reasoning:
            message.update(reasoning_content=thought, reasoning=thought)
        if calls:
            message["tool_calls"] = [call.body() for call in calls]
        return message

    def reasoning_chunk(self, text: str, index: int = 0) -> dict:
        """A chunk of choice ``index``'s thinking."""
        choice = {"index": index, "delta": {"reasoning_content": text, "reasoning": text}, "logprobs": None,
                  "finish_reason": None}
        return self.body(self.chunked, [choice], None)

    def chunk(self, text: str | None = None, finish_reason: str | None = None, first: bool = False,
              index: int = 0) -> dict:
        """The first chunk carries the role; the last, the finish reason."""
        delta = {"role": "assistant", "content": text or ""} if first else (
            {"content": text} if text is not None else {})
        choice = {"index": index, "delta": delta, "logprobs": None, "finish_reason": finish_reason}
        return self.body(self.chunked, [choice], None)

    def tool_call_chunks(self, call: ToolCall, index: int = 0) -> list[dict]:
        """A tool call of choice ``index`` as OpenAI streams it: its id, type and name (arguments ''), then its
        arguments (a client joins the ``arguments`` fragments of each call ``index``)."""
        head = {"index": call.index, "id": call.id, "type": "function",
                "function": {"name": call.name, "arguments": ""}}
        tail = {"index": call.index, "function": {"arguments": call.arguments}}
        return [self.body(self.chunked, [{"index": index, "delta": {"tool_calls": [delta]}, "logprobs": None,
                                          "finish_reason": None}], None)
                for delta in (head, tail)]

    def logprobs(self, entries: Sequence[TokenLogprobText], offset: int = 0) -> dict:
        """Chat's ``logprobs``: a ``content`` entry per token, with its UTF-8 bytes and top alternatives."""
        def item(token: str, logprob: float) -> dict:
            return {"token": token, "logprob": json_logprob(logprob), "bytes": list(token.encode("utf-8", "surrogatepass"))}
        return {"content": [{**item(e.token, e.logprob), "top_logprobs": [item(t, lp) for t, lp in e.top]}
                            for e in entries], "refusal": None}
