"""The HTTP side: OpenAI's routes over an ``Engine``, the web page, health and metrics.

Handlers parse and check the request, tokenize the prompt (copies of a tokenizer of their own, on
worker threads), queue it with the engine and relay its events: a JSON body, or server-sent events
(``data: {chunk}`` ... ``data: [DONE]``). A client that goes away cancels its request.

Bound to a loopback address, the server answers only requests addressed to a loopback name (a web
page on another site, its name rebound to 127.0.0.1 by DNS, gets 421), and every POST must be
``application/json`` (415), which a page on another origin cannot send without CORS, which stays
closed but to the origins ``--cors-origin`` names (Starlette's CORSMiddleware: their preflights are answered,
other origins get no Access-Control headers). With API keys, each key is a tenant: its requests share
cached prompt prefixes only with each other (``cache_scope``).
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import dataclasses
import hashlib
import hmac
import importlib.resources
import ipaddress
import json
import logging
import queue
import re
import threading
import time
import uuid
from concurrent.futures import ThreadPoolExecutor

from fastapi import APIRouter, Depends, FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.middleware.cors import CORSMiddleware
from fastapi.responses import HTMLResponse, JSONResponse, PlainTextResponse, Response, StreamingResponse
from starlette.datastructures import Headers
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.requests import ClientDisconnect

from llaisys import LlaisysValueError

from ..text.generation_defaults import GenerationDefaults
from ..text.tokenizer import EmptyPromptError, PromptTooLongError, encode, longest_token
from . import access_log, metrics, responses, schemas, structured
from .defaults import DEFAULT_MAX_TOKENS
from .engine import AsyncStream, Delta, Engine, EngineBusy, EngineUnavailable, Failed, Finished, Usage
from .errors import APIError, PathScrubber, error_body, invalid
from .tool_calls import ToolCall, ToolCallStream, parse_tool_calls, special_openers, tool_support

log = logging.getLogger("llaisys.serve")

MAX_BODY_BYTES = 4 << 20  # a request body larger than this is refused (413)
LONG_PROMPT_CHARS = 1 << 13  # prompts longer than this are tokenized on threads of their own


class Server:
    """What the routes share: the engine, the prompt tokenizers and the served model's limits.

    ``api_keys``: each key its own tenant (none: no key needed, one tenant). ``host`` and ``port``: the
    address the server listens on, set by whoever binds it (``llaisys serve``, ``BackgroundServer``);
    on a loopback address, requests must name a loopback host and that port. ``cors_origins``: origins
    (``https://app.example``) whose pages may call the API from a browser. ``default_max_tokens``: the reply cap
    of requests that set none (at most the room their prompt leaves in the context). ``sampling``: what requests
    that set no temperature, top_p, top_k or repetition_penalty get (default: the model's own,
    ``model.generation_defaults``, as vLLM applies them; OpenAI's defaults for what the model does not set).
    """

    def __init__(self, engine: Engine, tokenizer, model_name: str, api_keys=(), max_body_bytes: int = MAX_BODY_BYTES,
                 host: str | None = None, port: int | None = None, cors_origins=(), tenants: Tenants | None = None,
                 default_max_tokens: int = DEFAULT_MAX_TOKENS, sampling: GenerationDefaults | None = None):
        self.tenants = Tenants.of_keys(api_keys) if tenants is None else tenants  # (given: the keys' digests only)
        self.engine = engine
        self.tokenizer = tokenizer  # the HTTP side's own instance; the engine thread decodes with another
        self.tokenizers = PromptTokenizers(tokenizer)
        # response_format, text.format, a forcing tool_choice: compiled with a tokenizer of its own
        self.grammars = structured.Grammars(tokenizer)
        self.model_name = model_name
        # what clients are told names no file of the server's (the log keeps the paths)
        self.scrub_paths = PathScrubber([getattr(engine.model, "path", None), getattr(tokenizer, "name_or_path", None)],
                                        model_name)
        self.max_body_bytes = max_body_bytes
        self.host, self.port = host, port
        self.cors_origins = tuple(cors_origins)  # web origins whose pages may call the API (none: same origin only)
        self.created = int(time.time())
        config = engine.model.config
        self.vocab_size = config.vocab_size
        self.context = engine.max_length  # the longest prompt + reply: the model's context, or what the KV cache holds
        self.default_max_tokens = default_max_tokens
        self.sampling = engine.model.generation_defaults if sampling is None else sampling
        # a prompt of more characters has more tokens than the context holds (see longest_token)
        self.longest_token = longest_token(tokenizer)
        self.max_prompt_chars = self.context * self.longest_token
        # the format of the model's tool calls, from its chat template (None: requests with tools are refused, why)
        self.tool_format, self.no_tools_why = tool_support(tokenizer)
        # its call opener where that is a special token (Llama 3, Mistral): kept in the text of requests with tools
        self.tool_markers = frozenset(special_openers(tokenizer, self.tool_format).values() if self.tool_format else ())

    def tenant(self, authorization: str) -> str:
        """The tenant of an ``Authorization`` header (``Tenants.of``); a missing or unknown key is a 401."""
        name = self.tenants.of(authorization)
        if name is None:
            raise APIError(401, "missing or incorrect API key: send 'Authorization: Bearer <key>'", None,
                           "invalid_api_key")
        return name

    def metrics_text(self) -> str:
        """What ``GET /metrics`` answers: this engine's metrics (a replica on Ray answers every replica's instead:
        serve/replicas/deployments.py)."""
        return metrics.render(self.engine, self.model_name)

    def host_allowed(self, host: str | None) -> bool:
        """Whether a request's ``Host`` header may reach this server: any, unless it listens on a loopback
        address, where only a loopback name (localhost, 127.x.x.x, [::1]) with the port it listens on."""
        if self.host is None or self.port is None or not is_loopback(self.host):
            return True
        match = _HOST.fullmatch(host or "")
        if match is None or int(match["port"] or 80) != self.port:
            return False
        name = (match["ipv6"] or match["name"]).lower()
        return name in ("localhost", self.host.lower()) or is_loopback(name)

    # -- request parsing ----------------------------------------------------------------

    async def read_json(self, request: Request) -> dict:
        media_type = request.headers.get("content-type", "").partition(";")[0].strip().lower()
        if media_type != "application/json":
            raise APIError(415, f"the request body must be JSON sent as 'Content-Type: application/json', got "
                                f"{media_type or 'no Content-Type'}", None, "unsupported_media_type")
        declared = request.headers.get("content-length")
        if declared is not None and (not declared.isdigit() or int(declared) > self.max_body_bytes):
            raise self._too_large() if declared.isdigit() else invalid("bad Content-Length header", None)
        chunks, size = [], 0
        async for chunk in request.stream():  # ClientDisconnect if the client hangs up (see create_app)
            size += len(chunk)
            if size > self.max_body_bytes:
                raise self._too_large()
            chunks.append(chunk)
        try:
            body = json.loads(b"".join(chunks), parse_constant=_reject_constant)
        except (ValueError, UnicodeDecodeError) as e:
            raise invalid(f"the request body is not valid JSON: {e}", None, "invalid_json") from None
        except RecursionError:
            raise invalid("the request body nests arrays or objects too deeply", None, "invalid_json") from None
        if not isinstance(body, dict):
            raise invalid(f"the request body must be a JSON object, got {schemas.json_type(body)}", None,
                          "invalid_type")
        return body

    def _too_large(self) -> APIError:
        return APIError(413, f"the request body exceeds {self.max_body_bytes} bytes", None, "request_too_large")

    def check_model(self, body: dict) -> None:
        name = schemas.model_name(body)
        if name is not None and name != self.model_name:
            raise APIError(404, f"the model '{name}' does not exist; this server serves '{self.model_name}'",
                           "model", "model_not_found")

    def check_tools(self, tools: schemas.ToolRequest | None) -> None:
        if tools is not None and self.tool_format is None:
            raise invalid(f"'tools' cannot be used with this model: {self.no_tools_why}", "tools", "tools_unsupported")

    async def tokenize(self, prompt, chat: bool, param: str | None = None,
                       tools: schemas.ToolRequest | None = None) -> list[int]:
        """Token ids of chat messages (through the chat template, with ``tools``) or of a plain text (``param``: the
        request field that holds it, for errors). A text longer than the context could hold is refused before any
        tokenizer reads it; an empty one is refused."""
        param = param or ("messages" if chat else "prompt")
        if isinstance(prompt, list) and not chat:
            return prompt  # already token ids
        if chat and not getattr(self.tokenizer, "chat_template", None):
            raise invalid("this model's tokenizer has no chat template; use /v1/completions", param,
                          "no_chat_template")

        chars = len(prompt) if isinstance(prompt, str) else sum(len(m["content"]) for m in prompt)
        tool_list = tools.tools if tools is not None else None
        if chars > self.max_prompt_chars:
            raise self._too_many_chars(param, chars)

        def run(tokenizer) -> list[int]:
            try:
                return encode(tokenizer, prompt, chat=chat, max_chars=self.max_prompt_chars, tools=tool_list)
            except EmptyPromptError as e:  # says which text and which tokenizer
                raise invalid(str(e), param, "empty_prompt") from None
            except PromptTooLongError as e:  # the messages in their chat template
                raise self._too_many_chars(param, e.chars, " once in the chat template") from None
            except LlaisysValueError as e:  # text that is not valid Unicode (a lone surrogate)
                raise invalid(str(e), param, "invalid_text") from None
            except Exception as e:  # a template that rejects these messages (e.g. their order)
                if not chat:
                    raise
                raise invalid(f"the chat template cannot render these messages: {e}", "messages",
                              "template_error") from None
        ids = await self.tokenizers.run(run, long=chars > LONG_PROMPT_CHARS)
        if not ids:
            raise invalid(f"the '{param}' is empty once tokenized", param, "empty_prompt")
        return ids

    def _too_many_chars(self, param: str, chars: int, where: str = "") -> APIError:
        return invalid(f"'{param}': {chars} characters{where}, more than this model's maximum context length of "
                       f"{self.context} tokens can hold ({self.max_prompt_chars} characters: a token of its tokenizer "
                       f"stands for {self.longest_token} at most)", param, "context_length_exceeded")

    # -- responding ----------------------------------------------------------------------

    def submit(self, jobs: list[tuple[list[int], object]], access: access_log.Entry, cache_scope: str = "",
               n: int = 1, keep_tokens: frozenset[int] = frozenset(), response_id: str | None = None) -> AsyncStream:
        """Queue a request per (prompt ids, sampling parameters), each with ``n`` choices; they share cached prompt
        prefixes only with requests of the same ``cache_scope``; ``keep_tokens``: special tokens whose text the
        output keeps; ``access``: the HTTP request's access-log entry, which counts their events; ``response_id``:
        the name of their trace files under --trace-dir. All are queued, or none."""
        stream = AsyncStream(jobs, cache_scope=cache_scope, n=n, keep_tokens=keep_tokens, observe=access.observe,
                             trace_name=response_id)
        try:
            for request in stream.requests:
                self.engine.submit(request)
        except EngineBusy as e:
            stream.cancel()
            raise APIError(429, str(e), None, "queue_full") from None
        except EngineUnavailable as e:
            stream.cancel()
            raise APIError(503, str(e), None, "server_shutdown" if e.shutdown else "engine_unavailable") from None
        access.generating([len(ids) for ids, _ in jobs], n)
        return stream


class Tenants:
    """The API keys' tenants, known by the SHA-256 digest of each key: whoever holds this (a server, or a Ray
    cluster's deployments) keeps no key, and a tenant's name (the digest in hex) is no secret."""

    def __init__(self, digests=()):
        self._names = {bytes(digest): bytes(digest).hex() for digest in digests}

    @classmethod
    def of_keys(cls, api_keys) -> Tenants:
        """The tenants of these keys (each checked: ``check_api_key``)."""
        api_keys = tuple(api_keys)
        for key in api_keys:
            check_api_key(key)
        return cls(hashlib.sha256(key.encode()).digest() for key in api_keys)

    @property
    def digests(self) -> tuple[bytes, ...]:
        return tuple(self._names)

    def of(self, authorization: str) -> str | None:
        """The tenant of an ``Authorization`` header: the SHA-256 (hex) of its key; '' when no key is needed;
        None when the key is missing or unknown."""
        if not self._names:
            return ""
        scheme, _, key = authorization.partition(" ")
        # the header came as latin-1: its bytes are the key's UTF-8
        digest = hashlib.sha256(key.strip().encode("latin-1", "replace")).digest()
        found = None
        for known, name in self._names.items():  # every key compared, in constant time
            if hmac.compare_digest(digest, known):
                found = name
        return found if scheme.lower() == "bearer" else None


class PromptTokenizers:
    """Copies of the prompt tokenizer, each owned by one worker thread.

    A HF fast tokenizer raises "Already borrowed" when two threads use one instance, and one instance
    behind a lock let a single long prompt hold every other request up for its whole tokenization
    (seconds). Prompts longer than LONG_PROMPT_CHARS have threads of their own, so however many of them
    are being tokenized, a short prompt waits at most for other short ones.
    """

    def __init__(self, tokenizer, short_threads: int = 1, long_threads: int = 2):
        copies = queue.SimpleQueue()
        copies.put(tokenizer)
        for _ in range(short_threads + long_threads - 1):
            copies.put(copy.deepcopy(tokenizer))
        local = threading.local()

        def take_copy():  # each worker thread, once, when it starts
            local.tokenizer = copies.get_nowait()

        self._local = local
        self._short = ThreadPoolExecutor(short_threads, "llaisys-tokenize", take_copy)
        self._long = ThreadPoolExecutor(long_threads, "llaisys-tokenize-long", take_copy)

    async def run(self, fn, long: bool):
        """``fn(tokenizer)`` on a worker thread, with that thread's copy."""
        executor = self._long if long else self._short
        return await asyncio.get_running_loop().run_in_executor(executor, lambda: fn(self._local.tokenizer))

    def shutdown(self) -> None:
        for executor in (self._short, self._long):
            executor.shutdown(wait=False, cancel_futures=True)


# a Host header: a name or [IPv6 address], then maybe a port
_HOST = re.compile(r"(?:\[(?P<ipv6>[0-9A-Fa-f:.]+)\]|(?P<name>[A-Za-z0-9.-]+))(?::(?P<port>[0-9]{1,5}))?")


def is_loopback(host: str) -> bool:
    """Whether ``host`` (a name or an address) is this machine only: localhost, 127.x.x.x, ::1."""
    if host.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def check_api_key(key: str, source: str = "an API key") -> None:
    """A LlaisysValueError unless ``key`` can be sent as 'Authorization: Bearer <key>' (``source`` names
    where it came from). An empty key above all: it would turn authentication off."""
    if not isinstance(key, str) or not key:
        raise LlaisysValueError(f"{source} is empty (an unset variable?): it would let anyone in; give a key, or "
                                f"no key option at all to serve without one")
    if key != key.strip() or not key.isprintable():
        raise LlaisysValueError(f"{source} begins or ends with spaces or holds control characters: a client "
                                f"cannot send it")


def cache_scope(tenant: str, salt: str | None) -> str:
    """The prefix cache's scope of a request: its tenant (a hex digest, or '' with no key), then ':' and
    its ``cache_salt`` if it has one (a hex digest holds no ':', so no two pairs give one scope)."""
    return tenant if salt is None else f"{tenant}:{salt}"


def _reject_constant(name: str):
    raise ValueError(f"{name} is not a JSON number")


def _sse(obj) -> str:
    return "data: " + json.dumps(obj, ensure_ascii=False, separators=(",", ":")) + "\n\n"


async def _complete(server: Server, request: Request, chat: bool) -> Response:
    body = await server.read_json(request)
    server.check_model(body)
    schemas.check_unsupported(body, chat)
    stream, include_usage = schemas.stream_flags(body)
    tools = schemas.chat_tools(body) if chat else None
    server.check_tools(tools)
    if chat:
        prompts, params_of = [schemas.chat_messages(body)], ["messages"]
    else:
        prompts = schemas.completion_prompts(body, server.vocab_size, server.context)
        params_of = ["prompt"] if len(prompts) == 1 else [f"prompt[{i}]" for i in range(len(prompts))]
    n = schemas.choices_n(body, len(prompts))
    scope = cache_scope(request.state.tenant, schemas.cache_salt(body))
    constraint = await server.grammars.of(body, tools, server.tool_format)
    jobs = []
    for prompt, param in zip(prompts, params_of):
        ids = await server.tokenize(prompt, chat, param, tools)
        params = schemas.sampling_params(body, len(ids), server.context, param,
                                         default_max_tokens=server.default_max_tokens, defaults=server.sampling)
        params = schemas.penalties(body, params, server.vocab_size, server.sampling)
        params = dataclasses.replace(params, logprobs=schemas.logprobs_count(body, chat))
        jobs.append((ids, structured.constrain(body, schemas.speculation(body, params, server.engine), constraint)))

    shape = schemas.ResponseShape(chat, f"{'chatcmpl' if chat else 'cmpl'}-{uuid.uuid4().hex}", int(time.time()),
                                  server.model_name)
    events = server.submit(jobs, access_log.entry(request.scope), cache_scope=scope, n=n,
                           keep_tokens=server.tool_markers if tools else frozenset(), response_id=shape.head["id"])
    usage = UsageSum([len(ids) for ids, _ in jobs], n)
    parsers = ToolParsers(server, tools, usage.choices)
    if stream:
        return StreamingResponse(_stream_events(server, events, shape, usage, include_usage, parsers),
                                 media_type="text/event-stream", headers=SSE_HEADERS)
    return await _collect_events(server, request, events, usage, parsers.completer(shape),
                                 chat if jobs[0][1].logprobs is not None else None)


SSE_HEADERS = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}


class ToolParsers:
    """Each choice's tool calls, read from its text (streamed: a ``ToolCallStream`` per choice) when the request
    has tools; otherwise the text passes through as content."""

    def __init__(self, server: Server, tools: schemas.ToolRequest | None, choices: int):
        self.format = server.tool_format if tools is not None else None
        self.tools = tools
        self.streams = ([ToolCallStream(self.format, tools.names, tools.parallel) for _ in range(choices)]
                        if self.format is not None and tools is not None else None)

    def push(self, index: int, text: str) -> list[str | ToolCall]:
        return [text] if self.streams is None else self.streams[index].push(text)

    def finish(self, index: int, reason: str) -> tuple[list[str | ToolCall], str]:
        """What the choice's parser still held, and its finish reason ("tool_calls" when it ended calling)."""
        if self.streams is None:
            return [], reason
        stream = self.streams[index]
        return stream.finish(), "tool_calls" if stream.calls and reason == "stop" else reason

    def completer(self, shape: schemas.ResponseShape):
        """``shape.complete``, each choice's text parsed into content and tool calls first."""
        if self.format is None or self.tools is None:
            return shape.complete
        fmt, tools = self.format, self.tools

        def complete(choices, usage):
            parsed = []
            for text, reason in choices:
                content, calls = parse_tool_calls(text, fmt, tools.names, tools.parallel)
                parsed.append((content, "tool_calls" if calls and reason == "stop" else reason, calls))
            return shape.complete(parsed, usage)
        return complete


class UsageSum:
    """A request's usage from its choices' ``Finished`` events: each prompt counted once (with the cached tokens
    its first choice found), the completion tokens of every choice."""

    def __init__(self, prompt_tokens: list[int], n: int):
        self.prompt_tokens, self.n = prompt_tokens, n
        self.completion_tokens = self.cached_tokens = self.finished = 0

    def add(self, event: Finished) -> None:
        self.finished += 1
        self.completion_tokens += event.usage.completion_tokens
        if event.index % self.n == 0:
            self.cached_tokens += event.usage.cached_tokens

    @property
    def total(self) -> Usage:
        return Usage(sum(self.prompt_tokens), self.completion_tokens, self.cached_tokens)

    @property
    def choices(self) -> int:
        return len(self.prompt_tokens) * self.n

    @property
    def done(self) -> bool:
        return self.finished == self.choices


async def _respond(server: Server, request: Request) -> Response:
    """``POST /v1/responses``: text in (a string, or message items, and ``instructions``), text out."""
    body = await server.read_json(request)
    server.check_model(body)
    responses.check_unsupported(body)
    stream = schemas.field(body, "stream", "boolean", default=False)
    constraint = await server.grammars.of(body, responses=True)  # text.format
    ids = await server.tokenize(responses.input_messages(body), chat=True, param="input")
    params = schemas.sampling_params(body, len(ids), server.context, "input", max_names=("max_output_tokens",),
                                     default_max_tokens=server.default_max_tokens, defaults=server.sampling)
    params = structured.constrain(body, schemas.speculation(body, params, server.engine), constraint)
    shape = responses.ResponseObject(f"resp_{uuid.uuid4().hex}", int(time.time()), server.model_name, body, params)
    events = server.submit([(ids, params)], access_log.entry(request.scope),
                           cache_scope=cache_scope(request.state.tenant, schemas.cache_salt(body)), response_id=shape.id)
    if stream:
        return StreamingResponse(_response_events(server, events, shape), media_type="text/event-stream",
                                 headers=SSE_HEADERS)
    return await _collect_events(server, request, events, UsageSum([len(ids)], 1),
                                 lambda choices, usage: shape.finished(choices[0][1], choices[0][0], usage))


async def _response_events(server: Server, events: AsyncStream, shape: responses.ResponseObject):
    try:
        for event in shape.opening():
            yield event
        texts = []
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


def engine_failure(server: Server, event: Failed) -> tuple[int, dict]:
    """The status and error body of a request the engine failed: 503 ``server_shutdown`` when the server is shutting
    down (the engine was stopped: Ctrl+C, SIGTERM), else 500 ``engine_error``."""
    if event.shutdown:
        return 503, error_body(503, event.message, None, "server_shutdown")
    return 500, public_error(server, 500, event.message, "engine_error")


def public_error(server: Server, status: int, message: str, code: str | None = None, param: str | None = None) -> dict:
    """An error body for a client, the server's paths taken out of its message (and logged with them)."""
    public = server.scrub_paths(message)
    if public != message:
        log.warning("error %d sent to the client without the server's paths: %s", status, message)
    return error_body(status, public, param, code)


def _output_chunks(shape: schemas.ResponseShape, pieces: list[str | ToolCall], index: int) -> list[dict]:
    chunks = []
    for piece in pieces:
        if isinstance(piece, ToolCall):
            chunks += shape.tool_call_chunks(piece, index)
        elif piece:
            chunks.append(shape.chunk(piece, index=index))
    return chunks


async def _stream_events(server: Server, events: AsyncStream, shape: schemas.ResponseShape, usage: UsageSum,
                         include_usage: bool, parsers: ToolParsers):
    # Starlette cancels this generator when the client disconnects: ``finally`` cancels the request.
    # Choices' chunks interleave as their tokens come, each naming its index (OpenAI's way).
    sent = [0] * usage.choices  # characters of each choice's tokens sent with log-probabilities (text_offset)
    try:
        for index in range(usage.choices):
            yield _sse(shape.chunk(first=True, index=index))
        async for event in events:
            if isinstance(event, Delta):
                chunks = _output_chunks(shape, parsers.push(event.index, event.text), event.index)
                if event.logprobs:  # on the delta's first chunk (an empty one where the text is held back)
                    chunks = chunks or [shape.chunk(index=event.index)]
                    chunks[0]["choices"][0]["logprobs"] = schemas.logprobs_body(shape.chat, event.logprobs,
                                                                                 sent[event.index])
                    sent[event.index] += sum(len(e.token) for e in event.logprobs)
                for chunk in chunks:
                    yield _sse(chunk)
            elif isinstance(event, Finished):
                usage.add(event)
                held, reason = parsers.finish(event.index, event.reason)
                for chunk in _output_chunks(shape, held, event.index):
                    yield _sse(chunk)
                yield _sse(shape.chunk(finish_reason=reason, index=event.index))
                if include_usage and usage.done:
                    yield _sse(shape.usage_chunk(usage.total))
            else:  # Failed: the stream has started, so the error travels as an event (as OpenAI's do mid-stream)
                yield _sse(engine_failure(server, event)[1])
        yield "data: [DONE]\n\n"
    finally:
        events.cancel()


async def _collect_events(server: Server, request: Request, events: AsyncStream, usage: UsageSum,
                          shape, logprobs_chat: bool | None = None) -> Response:
    """The whole response, ``shape(choices, usage)`` once every choice has finished (choices: (text, finish reason)
    in index order), or the error response. ``logprobs_chat`` (where log-probabilities were asked for): each
    choice's ``logprobs`` in chat's (True) or completions' (False) form."""
    async def cancel_on_disconnect():
        while (await request.receive())["type"] != "http.disconnect":
            pass
        events.cancel()

    watcher = asyncio.create_task(cancel_on_disconnect())
    texts: list[list[str]] = [[] for _ in range(usage.choices)]
    reasons: list[str] = [""] * usage.choices
    logprobs: list[list] = [[] for _ in range(usage.choices)]
    try:
        async for event in events:
            if isinstance(event, Delta):
                texts[event.index].append(event.text)
                logprobs[event.index].extend(event.logprobs)
            elif isinstance(event, Finished):
                usage.add(event)
                reasons[event.index] = event.reason
                if usage.done:
                    body = shape([("".join(t), r) for t, r in zip(texts, reasons)], usage.total)
                    if logprobs_chat is not None:
                        for choice, entries in zip(body["choices"], logprobs):
                            choice["logprobs"] = schemas.logprobs_body(logprobs_chat, entries)
                    return JSONResponse(body)
            elif isinstance(event, Failed):
                status, body = engine_failure(server, event)
                return JSONResponse(body, status_code=status)
    finally:
        watcher.cancel()
        events.cancel()


def create_app(server: Server) -> FastAPI:
    """The FastAPI application. Its lifespan starts the engine thread and stops it at shutdown."""

    @contextlib.asynccontextmanager
    async def lifespan(app):
        if not server.engine.alive:
            server.engine.start()
        server.grammars.warm_up()  # llguidance's view of the vocabulary, before the first constrained request
        try:
            yield
        finally:
            server.engine.stop()
            server.tokenizers.shutdown()

    # no redirect from /v1/models/ to /v1/models: its Location would be built from the Host header
    app = FastAPI(title="llaisys", lifespan=lifespan, docs_url=None, redoc_url=None, openapi_url=None,
                  redirect_slashes=False)
    page = importlib.resources.files(__package__).joinpath("static/index.html").read_text(encoding="utf-8")

    def require_key(request: Request) -> None:
        tenant = server.tenant(request.headers.get("authorization", ""))
        request.state.tenant = access_log.entry(request.scope).tenant = tenant

    def error_response(status: int, body: dict) -> JSONResponse:
        server.engine.metrics.http_errors[status] += 1
        error = body["error"]
        body = public_error(server, status, error["message"], error["code"], error["param"])
        headers = {"WWW-Authenticate": "Bearer"} if status == 401 else None
        return JSONResponse(body, status_code=status, headers=headers)

    @app.exception_handler(APIError)
    async def api_error(request, e: APIError):
        return error_response(e.status, e.body())

    @app.exception_handler(StarletteHTTPException)
    async def http_error(request, e: StarletteHTTPException):
        message = {404: f"no route {request.method} {request.url.path}",
                   405: f"method {request.method} is not allowed on {request.url.path}"}.get(e.status_code, e.detail)
        return error_response(e.status_code, error_body(e.status_code, message))

    @app.exception_handler(RequestValidationError)
    async def validation_error(request, e: RequestValidationError):
        return error_response(400, error_body(400, str(e)))

    @app.exception_handler(ClientDisconnect)
    async def client_disconnect(request, e: ClientDisconnect):  # not an error of the server: no traceback
        server.engine.metrics.client_disconnects += 1
        client = f"{request.client.host}:{request.client.port}" if request.client else "a client"
        log.warning("%s hung up before its request %s %s was read", client, request.method, request.url.path)
        return Response(status_code=499)  # nginx's "client closed request"; nobody is left to read it

    @app.exception_handler(Exception)
    async def server_error(request, e: Exception):  # a bug: log it, answer in OpenAI's shape
        log.exception("unhandled error in %s %s", request.method, request.url.path)
        return error_response(500, error_body(500, f"internal error: {type(e).__name__}: {e}"))

    @app.get("/", include_in_schema=False)
    async def index():  # a static page holding no data: open without a key (it asks for one if needed)
        return HTMLResponse(page, headers={"Cache-Control": "no-cache"})

    @app.get("/health")
    async def health():
        if server.engine.alive:
            return {"status": "ok", "model": server.model_name}
        return error_response(503, error_body(503, server.engine.error or "the engine is not running"))

    api = APIRouter(dependencies=[Depends(require_key)])

    @api.get("/metrics")
    async def prometheus():
        text = await asyncio.get_running_loop().run_in_executor(None, server.metrics_text)
        return PlainTextResponse(text, media_type="text/plain; version=0.0.4; charset=utf-8")

    def model_card() -> dict:
        return {"id": server.model_name, "object": "model", "created": server.created, "owned_by": "llaisys",
                "max_model_len": server.context, "default_max_tokens": server.default_max_tokens,
                "sampling_defaults": server.sampling.settings()}

    @api.get("/v1/models")
    async def list_models():
        return {"object": "list", "data": [model_card()]}

    @api.get("/v1/models/{name:path}")
    async def get_model(name: str):
        if name != server.model_name:
            raise APIError(404, f"the model '{name}' does not exist", "model", "model_not_found")
        return model_card()

    @api.post("/v1/chat/completions")
    async def chat_completions(request: Request):
        return await _complete(server, request, chat=True)

    @api.post("/v1/completions")
    async def completions(request: Request):
        return await _complete(server, request, chat=False)

    @api.post("/v1/responses")
    async def create_response(request: Request):
        return await _respond(server, request)

    app.include_router(api)

    class LocalHostsOnly:  # plain ASGI (a BaseHTTPMiddleware would stand between streams and disconnects)
        def __init__(self, app):
            self.app = app

        async def __call__(self, scope, receive, send):
            host = Headers(scope=scope).get("host") if scope["type"] == "http" else None
            if scope["type"] == "http" and not server.host_allowed(host):
                port = server.port
                response = error_response(421, error_body(
                    421, f"this server answers requests for localhost:{port}, 127.0.0.1:{port} or [::1]:{port} "
                         f"only, not for Host: {host or '(none)'}", None, "invalid_host"))
                await response(scope, receive, send)
                return
            await self.app(scope, receive, send)

    if server.cors_origins:  # inside LocalHostsOnly: a preflight for a foreign Host is still refused
        app.add_middleware(CORSMiddleware, allow_origins=list(server.cors_origins), allow_methods=["GET", "POST"],
                           allow_headers=["Authorization", "Content-Type"], max_age=600)
    app.add_middleware(LocalHostsOnly)
    app.add_middleware(access_log.AccessLog)  # the outermost: refused requests get their line too
    return app
