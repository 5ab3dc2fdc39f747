"""What every OpenAI endpoint's serving does alike: check the model named (the base model or a LoRA adapter),
queue the request's jobs with the engine, and turn the engine's events (``Delta``, ``Finished``, ``Failed``) into
a whole response or a stream of chunks. A client that goes away cancels its request, whichever way it is answered.
"""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import AsyncIterator, Callable
from typing import TYPE_CHECKING

from fastapi import Request
from fastapi.responses import JSONResponse, Response

from ...engine.sampling import SamplingParams
from .. import access_log, sse, structured
from ..engine import AdapterRetired, AsyncStream, Delta, EngineBusy, EngineUnavailable, Failed, Finished, Usage
from ..errors import APIError, error_body
from ..lora import not_found
from .protocol import ChoicesShape, ChoiceText, model_name
from .reasoning import Thought
from .sampling import LogprobRequest, penalties, sampling_params, speculation

if TYPE_CHECKING:
    from ...lora.adapter import LoRAAdapter
    from ..server import Server

Job = tuple[list[int], SamplingParams]  # a prompt's token ids and how to sample its choices


def check_model(server: Server, body: dict) -> LoRAAdapter | None:
    """The LoRA adapter the request's ``model`` names (serve/lora.py); None for the served model (or no ``model``);
    a 404 for any other name."""
    name = model_name(body)
    if server.adapters is not None:
        return server.adapters.resolve(name)
    if name is not None and name != server.model_name:
        raise not_found(name, server.model_name)
    return None


def response_model(server: Server, adapter: LoRAAdapter | None) -> str:
    """The ``model`` a response names: the adapter's name, or the served model's."""
    return server.model_name if adapter is None else adapter.name


def submit(server: Server, jobs: list[Job], access: access_log.Entry, cache_scope: str = "", n: int = 1,
           keep_tokens: frozenset[int] = frozenset(), response_id: str | None = None, priority: int = 0,
           adapter: LoRAAdapter | None = None) -> AsyncStream:
    """Queue a request per (prompt ids, sampling parameters), each with ``n`` choices; they share cached prompt
    prefixes only with requests of the same ``cache_scope``; ``keep_tokens``: special tokens whose text the
    output keeps; ``access``: the HTTP request's access-log entry, which counts their events; ``response_id``:
    the name of their trace files under --trace-dir; ``priority``: the request's (lower first); ``adapter``: the
    LoRA adapter they run under (``check_model``'s; None: the base model). All are queued, or none; the engine
    gives them one fair share together."""
    if adapter is not None:
        jobs = [(ids, dataclasses.replace(params, lora=adapter)) for ids, params in jobs]
        access.adapter = adapter.name
    stream = AsyncStream(jobs, cache_scope=cache_scope, n=n, keep_tokens=keep_tokens, observe=access.observe,
                         trace_name=response_id, priority=priority)
    try:
        for request in stream.requests:
            server.engine.submit(request)
    except EngineBusy as e:
        stream.cancel()
        raise APIError(429, str(e), None, "queue_full") from None
    except EngineUnavailable as e:
        stream.cancel()
        raise APIError(503, str(e), None, "server_shutdown" if e.shutdown else "engine_unavailable") from None
    except AdapterRetired as e:  # unloaded since check_model found it
        stream.cancel()
        raise not_found(e.name, server.model_name,
                        server.adapters.names if server.adapters is not None else ()) from None
    access.generating([len(ids) for ids, _ in jobs], n)
    return stream


def job_params(server: Server, body: dict, prompt_tokens: int, param: str, logprobs: LogprobRequest | None,
               constraint: structured.Constraint | None) -> SamplingParams:
    """The sampling parameters of a chat or completions request's prompt of ``prompt_tokens`` tokens (``param``:
    the field that holds it): its sampling fields, penalties, log-probabilities (``logprobs``: as the endpoint read
    them; a reply cap the request does not set is at most what they allow), speculation and grammar, checked in
    that order."""
    default_max_tokens = server.default_max_tokens
    if logprobs is not None:
        default_max_tokens = min(default_max_tokens or logprobs.max_tokens, logprobs.max_tokens)
    params = sampling_params(body, prompt_tokens, server.context, param, default_max_tokens=default_max_tokens,
                             defaults=server.sampling)
    params = penalties(body, params, server.vocab_size, server.sampling)
    params = dataclasses.replace(params, logprobs=None if logprobs is None else logprobs.alternatives)
    return structured.constrain(body, speculation(body, params, server.engine), constraint)


def engine_failure(server: Server, event: Failed) -> tuple[int, dict]:
    """The status and error body of a request the engine failed: 503 ``server_shutdown`` when the server is shutting
    down (the engine was stopped: Ctrl+C, SIGTERM), else 500 ``engine_error``."""
    if event.shutdown:
        return 503, error_body(503, event.message, None, "server_shutdown")
    return 500, server.public_error(500, event.message, "engine_error")


class UsageSum:
    """A request's usage from its choices' ``Finished`` events: each prompt counted once (with the cached tokens
    its first choice found), the completion tokens of every choice."""

    def __init__(self, prompt_tokens: list[int], n: int):
        self.prompt_tokens, self.n = prompt_tokens, n
        self.completion_tokens = self.cached_tokens = self.reasoning_tokens = self.finished = 0

    def add(self, event: Finished) -> None:
        self.finished += 1
        self.completion_tokens += event.usage.completion_tokens
        self.reasoning_tokens += event.usage.reasoning_tokens
        if event.index % self.n == 0:
            self.cached_tokens += event.usage.cached_tokens

    @property
    def total(self) -> Usage:
        return Usage(sum(self.prompt_tokens), self.completion_tokens, self.cached_tokens, self.reasoning_tokens)

    @property
    def choices(self) -> int:
        return len(self.prompt_tokens) * self.n

    @property
    def done(self) -> bool:
        return self.finished == self.choices


async def collect(server: Server, request: Request, events: AsyncStream, usage: UsageSum,
                  shape: Callable[[list[tuple[str, str]], Usage], dict],
                  logprobs: ChoicesShape | None = None) -> Response | None:
    """The whole response, ``shape(choices, usage)`` once every choice has finished (choices: (text, finish reason)
    in index order), or the error response. ``logprobs`` (where log-probabilities were asked for): the shape that
    writes each choice's ``logprobs``."""
    async def cancel_on_disconnect() -> None:
        while (await request.receive())["type"] != "http.disconnect":
            pass
        events.cancel()

    watcher = asyncio.create_task(cancel_on_disconnect())
    texts: list[list[str]] = [[] for _ in range(usage.choices)]
    reasons: list[str] = [""] * usage.choices
    entries: list[list] = [[] for _ in range(usage.choices)]
    try:
        async for event in events:
            if isinstance(event, Delta):
                texts[event.index].append(event.text)
                entries[event.index].extend(event.logprobs)
            elif isinstance(event, Finished):
                usage.add(event)
                reasons[event.index] = event.reason
                if usage.done:
                    body = shape([("".join(t), r) for t, r in zip(texts, reasons)], usage.total)
                    if logprobs is not None:
                        for choice, choice_entries in zip(body["choices"], entries):
                            choice["logprobs"] = logprobs.logprobs(choice_entries)
                    return JSONResponse(body)
            elif isinstance(event, Failed):
                status, body = engine_failure(server, event)
                return JSONResponse(body, status_code=status)
    finally:
        watcher.cancel()
        events.cancel()
    return None  # (not reached: the events end with every choice finished, or with Failed)


class PlainText:
    """Every choice's text as it comes."""

    def push(self, index: int, text: str) -> list:
        return [text]

    def finish(self, index: int, reason: str) -> tuple[list, str]:
        return [], reason


def output_chunks(shape: ChoicesShape, pieces: list, index: int) -> list[dict]:
    """The chunks of choice ``index`` for ``pieces`` (text, thinking: ``shape.reasoning_chunk``, or a tool call:
    ``shape.tool_call_chunks``)."""
    chunks = []
    for piece in pieces:
        if isinstance(piece, Thought):
            chunks.append(shape.reasoning_chunk(piece.text, index))
        elif not isinstance(piece, str):
            chunks += shape.tool_call_chunks(piece, index)
        elif piece:
            chunks.append(shape.chunk(piece, index=index))
    return chunks


async def stream_chunks(server: Server, events: AsyncStream, shape: ChoicesShape, usage: UsageSum,
                        include_usage: bool, text: ChoiceText) -> AsyncIterator[str]:
    """The server-sent events of a chat or completions stream: each choice's first chunk, then chunks as its
    tokens come (choices interleave, each chunk naming its index: OpenAI's way), its last chunk with its finish
    reason, the usage chunk where asked for, ``[DONE]``."""
    # Starlette cancels this generator when the client disconnects: ``finally`` cancels the request.
    sent = [0] * usage.choices  # characters of each choice's tokens sent with log-probabilities (text_offset)
    try:
        for index in range(usage.choices):
            yield sse.data(shape.chunk(first=True, index=index))
        async for event in events:
            if isinstance(event, Delta):
                chunks = output_chunks(shape, text.push(event.index, event.text), event.index)
                if event.logprobs:  # on the delta's first chunk (an empty one where the text is held back)
                    chunks = chunks or [shape.chunk(index=event.index)]
                    chunks[0]["choices"][0]["logprobs"] = shape.logprobs(event.logprobs, sent[event.index])
                    sent[event.index] += sum(len(e.token) for e in event.logprobs)
                for chunk in chunks:
                    yield sse.data(chunk)
            elif isinstance(event, Finished):
                usage.add(event)
                held, reason = text.finish(event.index, event.reason)
                for chunk in output_chunks(shape, held, event.index):
                    yield sse.data(chunk)
                yield sse.data(shape.chunk(finish_reason=reason, index=event.index))
                if include_usage and usage.done:
                    yield sse.data(shape.usage_chunk(usage.total))
            else:  # Failed: the stream has started, so the error travels as an event (as OpenAI's do mid-stream)
                yield sse.data(engine_failure(server, event)[1])
        yield sse.DONE
    finally:
        events.cancel()
