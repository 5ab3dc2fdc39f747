"""``POST /v1/responses``: the request checked (protocol.py), its input through the chat template, one job for
the engine, and its events as a ``response`` object or its stream of semantic events."""

from __future__ import annotations

import time
import uuid
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING

from fastapi import Request
from fastapi.responses import Response

from ... import access_log, sse, structured
from ...engine import AsyncStream, Delta, Finished
from ...request_body import field, read_json
from ...tenancy import request_scope
from ..prompts import tokenize
from ..sampling import priority, sampling_params, speculation
from ..serving import UsageSum, check_model, collect, engine_failure, submit
from .protocol import ResponseObject, check_unsupported, input_messages

if TYPE_CHECKING:
    from ...server import Server


async def create_response(server: Server, request: Request) -> Response | None:
    """Text in (a string, or message items, and ``instructions``), text out."""
    body = await read_json(request, server.max_body_bytes)
    check_model(server, body)
    check_unsupported(body)
    stream = field(body, "stream", "boolean", default=False)
    constraint = await server.grammars.of(body, responses=True)  # text.format
    ids = await tokenize(server, input_messages(body), chat=True, param="input")
    params = sampling_params(body, len(ids), server.context, "input", max_names=("max_output_tokens",),
                             default_max_tokens=server.default_max_tokens, defaults=server.sampling)
    params = structured.constrain(body, speculation(body, params, server.engine), constraint)
    shape = ResponseObject(f"resp_{uuid.uuid4().hex}", int(time.time()), server.model_name, body, params)
    events = submit(server, [(ids, params)], access_log.entry(request.scope), cache_scope=request_scope(request, body),
                    response_id=shape.id, priority=priority(body))
    if stream:
        return sse.response(_response_events(server, events, shape))
    return await collect(server, request, events, UsageSum([len(ids)], 1),
                         lambda choices, usage: shape.finished(choices[0][1], choices[0][0], usage))


async def _response_events(server: Server, events: AsyncStream, shape: ResponseObject) -> AsyncIterator[str]:
    try:
        for opening in shape.opening():
            yield opening
        texts: list[str] = []
        async for event in events:
            if isinstance(event, Delta):
                texts.append(event.text)
                yield shape.delta(event.text)
            elif isinstance(event, Finished):
                for closing in shape.closing(event.reason, "".join(texts), event.usage):
                    yield closing
            else:  # Failed
                yield shape.failed(engine_failure(server, event)[1]["error"]["message"])
    finally:
        events.cancel()
