"""``POST /v1/chat/completions``: the request checked (protocol.py, tools.py), its messages through the chat
template, one job for the engine with ``n`` choices, and its events as a ``chat.completion`` or its stream; a
reasoning model's thinking is split from each choice's text (../reasoning.py), and with tools the calls are parsed
from the rest (streamed: as they come)."""

from __future__ import annotations

import time
import uuid
from typing import TYPE_CHECKING

from fastapi import Request
from fastapi.responses import Response

from ... import access_log, sse
from ...engine import Usage
from ...errors import invalid
from ...request_body import read_json
from ...tenancy import request_scope
from ...tool_calls import ToolCall, ToolCallStream, ToolFormat
from ..prompts import tokenize
from ..protocol import ChoiceText, stream_flags
from ..reasoning import ReasoningChoices, Thought, template_kwargs, thinking_budget, with_thinking
from ..sampling import choices_n, logprob_request, priority
from ..serving import UsageSum, check_model, collect, job_params, response_model, stream_chunks, submit
from .protocol import ChatShape, chat_messages, logprobs_count
from .tools import ToolRequest, chat_tools

if TYPE_CHECKING:
    from ...server import Server


async def create_chat_completion(server: Server, request: Request) -> Response | None:
    body = await read_json(request, server.max_body_bytes)
    adapter = check_model(server, body)
    stream, include_usage = stream_flags(body)
    tools = chat_tools(body)
    if tools is not None and server.tool_format is None:
        raise invalid(f"'tools' cannot be used with this model: {server.no_tools_why}", "tools", "tools_unsupported")
    messages = chat_messages(body)
    n = choices_n(body)
    logprobs = logprob_request(body, logprobs_count(body), "top_logprobs", n)
    variables, budget = template_kwargs(server, body), thinking_budget(server, body)
    scope = request_scope(request, body)
    constraint = await server.grammars.of(body, tools, server.tool_format)
    ids = await tokenize(server, messages, chat=True, param="messages", tools=tools.tools if tools is not None else None,
                         template_kwargs=variables)
    params = with_thinking(server, job_params(server, body, len(ids), "messages", logprobs, constraint), ids, budget)

    shape = ChatShape(f"chatcmpl-{uuid.uuid4().hex}", int(time.time()), response_model(server, adapter),
                      reasoning=server.reasoning is not None)
    keep = (server.tool_markers if tools is not None else frozenset()) | (server.reasoning.keep if server.reasoning
                                                                          else frozenset())
    events = submit(server, [(ids, params)], access_log.entry(request.scope), cache_scope=scope, n=n,
                    keep_tokens=keep, response_id=shape.id, priority=priority(body), adapter=adapter)
    usage = UsageSum([len(ids)], n)
    fmt = server.tool_format if tools is not None else None
    parsers = ToolParsers(fmt, tools, usage.choices)
    text: ChoiceText = parsers
    if server.reasoning is not None:  # its thinking first; tool calls are read from the answer
        text = ReasoningChoices(server.reasoning, ids, parsers, usage.choices, fmt.openers if fmt else ())
    if stream:
        return sse.response(stream_chunks(server, events, shape, usage, include_usage, text))
    return await collect(server, request, events, usage, ChatCompleter(shape, text).complete,
                         shape if params.logprobs is not None else None)


class ToolParsers:
    """Each choice's tool calls, read from its text (streamed: a ``ToolCallStream`` per choice) when the request
    has tools (``fmt``: the model's call syntax); otherwise the text passes through as content."""

    def __init__(self, fmt: ToolFormat | None, tools: ToolRequest | None, choices: int):
        self.streams = ([ToolCallStream(fmt, tools.names, tools.parallel) for _ in range(choices)]
                        if fmt is not None and tools is not None else None)

    def push(self, index: int, text: str) -> list[str | ToolCall]:
        return [text] if self.streams is None else self.streams[index].push(text)

    def finish(self, index: int, reason: str) -> tuple[list[str | ToolCall], str]:
        """What the choice's parser still held, and its finish reason ("tool_calls" when it ended calling)."""
        if self.streams is None:
            return [], reason
        stream = self.streams[index]
        return stream.finish(), "tool_calls" if stream.calls and reason == "stop" else reason


class ChatCompleter:
    """A whole ``chat.completion`` from each choice's text: the text through the same ``ChoiceText`` as a stream
    (its thinking, its tool calls), gathered into a message (``shape.complete``)."""

    def __init__(self, shape: ChatShape, text: ChoiceText):
        self.shape, self.text = shape, text

    def complete(self, choices: list[tuple[str, str]], usage: Usage) -> dict:
        parsed = []
        for index, (whole, reason) in enumerate(choices):
            pieces = self.text.push(index, whole)
            held, reason = self.text.finish(index, reason)
            pieces += held
            thought = "".join(p.text for p in pieces if isinstance(p, Thought))
            content = "".join(p for p in pieces if isinstance(p, str))
            calls = [p for p in pieces if isinstance(p, ToolCall)]
            parsed.append((None if calls and not content.strip() else content, reason, calls, thought or None))
        return self.shape.complete(parsed, usage)
