"""``POST /v1/completions``: the request checked (protocol.py), each of its prompts (texts or token ids) one job
for the engine with ``n`` choices, and their events as one ``text_completion`` or its stream."""

from __future__ import annotations

import time
import uuid
from typing import TYPE_CHECKING

from fastapi import Request
from fastapi.responses import Response

from ... import access_log, sse
from ...request_body import read_json
from ...tenancy import request_scope
from ..prompts import tokenize
from ..protocol import stream_flags
from ..sampling import choices_n, logprob_request, priority
from ..serving import Job, PlainText, UsageSum, check_model, collect, job_params, response_model, stream_chunks, submit
from .protocol import CompletionShape, check_list_tokens, check_unsupported, completion_prompts, logprobs_count

if TYPE_CHECKING:
    from ...server import Server


async def create_completion(server: Server, request: Request) -> Response | None:
    body = await read_json(request, server.max_body_bytes)
    adapter = check_model(server, body)
    check_unsupported(body)
    stream, include_usage = stream_flags(body)
    prompts = completion_prompts(body, server.vocab_size, server.context, server.longest_token)
    params_of = ["prompt"] if len(prompts) == 1 else [f"prompt[{i}]" for i in range(len(prompts))]
    n = choices_n(body, len(prompts))
    logprobs = logprob_request(body, logprobs_count(body), "logprobs", n, len(prompts))
    scope = request_scope(request, body)
    constraint = await server.grammars.of(body, None, server.tool_format)
    jobs: list[Job] = []
    for prompt, param in zip(prompts, params_of):
        ids = await tokenize(server, prompt, chat=False, param=param)
        jobs.append((ids, job_params(server, body, len(ids), param, logprobs, constraint)))
        if len(prompts) > 1:
            check_list_tokens(sum(len(ids) for ids, _ in jobs), len(prompts), server.context,
                              "" if len(jobs) == len(prompts) else " at least")

    shape = CompletionShape(f"cmpl-{uuid.uuid4().hex}", int(time.time()), response_model(server, adapter))
    events = submit(server, jobs, access_log.entry(request.scope), cache_scope=scope, n=n, response_id=shape.id,
                    priority=priority(body), adapter=adapter)
    usage = UsageSum([len(ids) for ids, _ in jobs], n)
    if stream:
        return sse.response(stream_chunks(server, events, shape, usage, include_usage, PlainText()))
    return await collect(server, request, events, usage, shape.complete,
                         shape if jobs[0][1].logprobs is not None else None)
