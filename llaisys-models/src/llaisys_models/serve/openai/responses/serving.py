"""``POST /v1/responses``: the request checked (protocol.py), its input through the chat template, one job for
the engine, and its events as a ``response`` object or its stream of semantic events; a reasoning model's thinking
is split from the text (../reasoning.py) into an output item of its own."""

from __future__ import annotations

import time
import uuid
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING

from fastapi import Request
from fastapi.responses import Response

from ....text.reasoning import ReasoningSplitter
from ... import access_log, sse, structured
from ...engine import AsyncStream, Delta, Finished, Usage
from ...request_body import field, read_json
from ...tenancy import request_scope
from ..prompts import tokenize
from ..reasoning import template_kwargs, thinking_budget, with_thinking
from ..sampling import priority, sampling_params, speculation
from ..serving import UsageSum, check_model, collect, engine_failure, response_model, submit
from .protocol import ResponseObject, check_unsupported, input_messages

if TYPE_CHECKING:
    from ...server import Server


async def create_response(server: Server, request: Request) -> Response | None:
    """Text in (a string, or message items, and ``instructions``), text out (a reasoning model's thinking first)."""
    body = await read_json(request, server.max_body_bytes)
    adapter = check_model(server, body)
    check_unsupported(body)
    stream = field(body, "stream", "boolean", default=False)
    variables, budget = template_kwargs(server, body), thinking_budget(server, body)
    constraint = await server.grammars.of(body, responses=True)  # text.format
    ids = await tokenize(server, input_messages(body), chat=True, param="input", template_kwargs=variables)
    params = sampling_params(body, len(ids), server.context, "input", max_names=("max_output_tokens",),
                             default_max_tokens=server.default_max_tokens, defaults=server.sampling)
    params = structured.constrain(body, speculation(body, params, server.engine), constraint)
    params = with_thinking(server, params, ids, budget)
    shape = ResponseObject(f"resp_{uuid.uuid4().hex}", int(time.time()), response_model(server, adapter), body, params,
                           reasoning=server.reasoning is not None)
    events = submit(server, [(ids, params)], access_log.entry(request.scope), cache_scope=request_scope(request, body),
                    keep_tokens=server.reasoning.keep if server.reasoning else frozenset(), response_id=shape.id,
                    priority=priority(body), adapter=adapter)
    split = server.reasoning.splitter(ids) if server.reasoning else None
    if stream:
        return sse.response(_response_events(server, events, shape, split))

    def finished(choices: list[tuple[str, str]], usage: Usage) -> dict:
        (text, reason), = choices
        thought, answer = split.whole(text) if split is not None else (None, text)
        return shape.finished(reason, answer, usage, thought)
    return await collect(server, request, events, UsageSum([len(ids)], 1), finished)


async def _response_events(server: Server, events: AsyncStream, shape: ResponseObject,
                           split: ReasoningSplitter | None) -> AsyncIterator[str]:
    try:
        for opening in shape.opening():
            yield opening
        async for event in events:
            if isinstance(event, Delta):
                thought, text = split.push(event.text) if split is not None else ("", event.text)
                for each in shape.delta(text, thought):
                    yield each
            elif isinstance(event, Finished):
                thought, text = split.finish() if split is not None else ("", "")
                for each in shape.delta(text, thought) + shape.closing(event.reason, event.usage):
                    yield each
            else:  # Failed
                yield shape.failed(engine_failure(server, event)[1]["error"]["message"])
    finally:
        events.cancel()
