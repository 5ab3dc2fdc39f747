"""``POST /v1/chat/completions``: the request checked (protocol.py, tools.py), its messages through the chat
template, one job for the engine with ``n`` choices, and its events as a ``chat.completion`` or its stream; with
tools, each choice's calls are parsed from its text (streamed: as they come)."""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable
from typing import TYPE_CHECKING

from fastapi import Request
from fastapi.responses import Response

from ... import access_log, sse
from ...engine import Usage
from ...errors import invalid
from ...request_body import read_json
from ...tenancy import request_scope
from ...tool_calls import ToolCall, ToolCallStream, ToolFormat, parse_tool_calls
from ..prompts import tokenize
from ..protocol import stream_flags
from ..sampling import choices_n, logprob_request, priority
from ..serving import UsageSum, check_model, collect, job_params, stream_chunks, submit
from .protocol import ChatShape, chat_messages, logprobs_count
from .tools import ToolRequest, chat_tools

if TYPE_CHECKING:
    from ...server import Server


async def create_chat_completion(server: Server, request: Request) -> Response | None:
    body = await read_json(request, server.max_body_bytes)
    check_model(server, body)
    stream, include_usage = stream_flags(body)
    tools = chat_tools(body)
    if tools is not None and server.tool_format is None:
        raise invalid(f"'tools' cannot be used with this model: {server.no_tools_why}", "tools", "tools_unsupported")
    messages = chat_messages(body)
    n = choices_n(body)
    logprobs = logprob_request(body, logprobs_count(body), "top_logprobs", n)
    scope = request_scope(request, body)
    constraint = await server.grammars.of(body, tools, server.tool_format)
    ids = await tokenize(server, messages, chat=True, param="messages", tools=tools.tools if tools is not None else None)
    params = job_params(server, body, len(ids), "messages", logprobs, constraint)

    shape = ChatShape(f"chatcmpl-{uuid.uuid4().hex}", int(time.time()), server.model_name)
    events = submit(server, [(ids, params)], access_log.entry(request.scope), cache_scope=scope, n=n,
                    keep_tokens=server.tool_markers if tools is not None else frozenset(), response_id=shape.id,
                    priority=priority(body))
    usage = UsageSum([len(ids)], n)
    parsers = ToolParsers(server.tool_format if tools is not None else None, tools, usage.choices)
    if stream:
        return sse.response(stream_chunks(server, events, shape, usage, include_usage, parsers))
    return await collect(server, request, events, usage, parsers.completer(shape),
                         shape if params.logprobs is not None else None)


class ToolParsers:
    """Each choice's tool calls, read from its text (streamed: a ``ToolCallStream`` per choice) when the request
    has tools (``fmt``: the model's call syntax); otherwise the text passes through as content."""

    def __init__(self, fmt: ToolFormat | None, tools: ToolRequest | None, choices: int):
        self.format = fmt
        self.tools = tools
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

    def completer(self, shape: ChatShape) -> Callable[[list[tuple[str, str]], Usage], dict]:
        """``shape.complete``, each choice's text parsed into content and tool calls first."""
        if self.format is None or self.tools is None:
            return shape.complete
        fmt, tools = self.format, self.tools

        def complete(choices: list[tuple[str, str]], usage: Usage) -> dict:
            parsed = []
            for text, reason in choices:
                content, calls = parse_tool_calls(text, fmt, tools.names, tools.parallel)
                parsed.append((content, "tool_calls" if calls and reason == "stop" else reason, calls))
            return shape.complete(parsed, usage)
        return complete
