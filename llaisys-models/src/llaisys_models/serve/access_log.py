"""The access log: one line per HTTP request, on the logger ``llaisys.serve.access`` (level INFO).

    2025-06-01T12:00:00.123+00:00 POST /v1/chat/completions 200 prompt_tokens=25 cached_tokens=16
    generated_tokens=5 ttft=0.041s duration=0.120s finish=length tenant=3f2a9c1e client=127.0.0.1:53422

(one line). ``AccessLog`` is a plain ASGI middleware, the outermost of the app's, so every request gets its line,
refused ones too; it writes it when the app is done with the request: a stream's line once the stream has ended,
by its last event, by a client that hung up (its open choices' finish reason is then ``cancelled``) or by the
server's shutdown (``shutdown``). The token fields are those of requests that reached the engine (``-`` for the
others: /health, /metrics, /v1/models, every 4xx): the prompts' tokens, of which ``cached_tokens`` came from the
prefix cache (as the response reports them: whole blocks; ``-`` when the response was cut before saying), and the
tokens generated, every choice's (a cancelled choice's up to its last delta). ``ttft``: from the request's arrival
to its first generated token's reaching the HTTP side (``-`` where none came); ``duration``: to its end. ``finish``:
the choices' finish reasons, each once. ``adapter`` (only in the lines of requests under a LoRA adapter,
serve/lora.py, after ``finish``): the adapter's name. ``tenant``: the first 8 hex digits of the SHA-256 of the
request's API key (``-`` where the server needs none, or the key was wrong). No line holds a key, a prompt or any
text generated.

``configure`` sends the server's log (these lines and its warnings) to stderr as ``llaisys serve --log-level`` and
``--log-format`` (``text``, or ``json``: one object a line, the same fields) say.
"""

from __future__ import annotations

import datetime
import json
import logging
import sys
import time
from typing import TYPE_CHECKING, Any
from urllib.parse import quote

from .engine import Delta, Event, Failed, Finished

if TYPE_CHECKING:
    from starlette.types import ASGIApp, Message, Receive, Scope, Send

log = logging.getLogger("llaisys.serve.access")

SCOPE_KEY = "llaisys.access"  # the request's ``Entry`` in its ASGI scope
TENANT_DIGITS = 8  # of the tenant's digest: enough to tell a server's tenants apart, and no secret


class Entry:
    """What one request's line says, filled in as the request goes: ``AccessLog`` sets where it came from and its
    status, the handlers its tenant (``tenant``) and, where it generates, its prompts (``generating``) and the
    engine's events (``observe``)."""

    def __init__(self, scope: Scope) -> None:
        self.start = time.perf_counter()
        self.method, self.path = scope.get("method", "-"), scope.get("path", "-")
        client = scope.get("client")
        self.client = f"{client[0]}:{client[1]}" if client else None
        self.status: int | None = None
        self.tenant = ""  # the hex digest of the request's key ('' where none is needed or known)
        self.prompt_tokens: list[int] | None = None  # None: the request generated nothing
        self.n = 1
        self.tokens: list[int] = []  # each choice's tokens so far
        self.reasons: list[str | None] = []  # each choice's finish reason (None: still open)
        self.cached: int | None = None
        self.first_token: float | None = None
        self.adapter: str | None = None  # the LoRA adapter the request runs under (None: the base model)

    def generating(self, prompt_tokens: list[int], n: int) -> None:
        """The request goes to the engine: its prompts' token counts, each with ``n`` choices."""
        self.prompt_tokens, self.n = prompt_tokens, n
        self.tokens = [0] * (len(prompt_tokens) * n)
        self.reasons = [None] * len(self.tokens)

    def observe(self, event: Event) -> None:
        """An engine event of the request (``engine.AsyncStream``'s ``observe``), as its handler gets it."""
        if isinstance(event, Failed):  # every choice still open ends with it
            reason = "shutdown" if event.shutdown else "error"
            self.reasons = [r or reason for r in self.reasons]
            return
        generated = event.tokens if isinstance(event, Delta) else event.usage.completion_tokens
        if generated and self.first_token is None:
            self.first_token = time.perf_counter()
        self.tokens[event.index] = generated
        if isinstance(event, Finished):
            self.reasons[event.index] = event.reason
            if event.index % self.n == 0:  # a prompt's cached tokens, counted once (with its first choice)
                self.cached = (self.cached or 0) + event.usage.cached_tokens

    def fields(self) -> dict[str, Any]:
        """The line's fields (None where it has no value), in the order the text line gives them."""
        prompt_tokens = self.prompt_tokens
        generating = prompt_tokens is not None
        reasons = [reason or "cancelled" for reason in self.reasons]  # open at the end: its client went away
        adapter = {} if self.adapter is None else {"adapter": self.adapter}
        return {
            "method": self.method, "path": self.path, "status": self.status,
            "prompt_tokens": sum(prompt_tokens) if prompt_tokens is not None else None,
            "cached_tokens": self.cached if generating else None,
            "generated_tokens": sum(self.tokens) if generating else None,
            "ttft": None if self.first_token is None else round(self.first_token - self.start, 3),
            "duration": round(time.perf_counter() - self.start, 3),
            "finish": ",".join(dict.fromkeys(reasons)) or None,
            **adapter,
            "tenant": self.tenant[:TENANT_DIGITS] or None,
            "client": self.client,
        }


def entry(scope: Scope) -> Entry:
    """The access-log entry of the request of ``scope`` (a detached one where no ``AccessLog`` runs)."""
    if SCOPE_KEY not in scope:
        scope[SCOPE_KEY] = Entry(scope)
    return scope[SCOPE_KEY]


class AccessLog:
    """ASGI middleware that writes each HTTP request's line once the app is done with it. Plain ASGI: a
    BaseHTTPMiddleware would stand between streams and disconnects."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        record = scope[SCOPE_KEY] = Entry(scope)

        async def send_noting_status(message: Message) -> None:
            if message["type"] == "http.response.start":
                record.status = message["status"]
            await send(message)

        try:
            await self.app(scope, receive, send_noting_status)
        except BaseException:
            if record.status is None:  # (Starlette's ServerErrorMiddleware, outside this one, answers 500)
                record.status = 500
            raise
        finally:
            fields = record.fields()
            log.info(text_line(fields), extra={"access": fields})


def text_line(fields: dict[str, Any]) -> str:
    """The text form of a line's fields: method, path and status, then ``name=value`` (``-``: no value)."""
    def value(name: str) -> str:
        v = fields[name]
        if name == "adapter":  # (a name of the client's: %-escaped as the path is, so the line stays one field each)
            return quote(v, safe="/:@!$&()*+,;=")
        return "-" if v is None else f"{v:.3f}s" if name in ("ttft", "duration") else str(v)

    # the method and path as %-escapes where they are not plain URL characters: no client writes a line of its own
    head = f"{quote(fields['method'], safe='')} {quote(fields['path'], safe='/:@!$&()*+,;=')} {value('status')}"
    return " ".join([head] + [f"{name}={value(name)}" for name in list(fields)[3:]])


class _Formatter(logging.Formatter):
    """Text: the time, then the access line, or the level and message of any other record. JSON: an object with
    ``time``, ``level``, ``logger`` and the access line's fields, or ``message`` (and ``exception``)."""

    def __init__(self, as_json: bool) -> None:
        super().__init__()
        self.as_json = as_json

    def format(self, record: logging.LogRecord) -> str:
        when = datetime.datetime.fromtimestamp(record.created).astimezone().isoformat(timespec="milliseconds")
        access = getattr(record, "access", None)
        exception = self.formatException(record.exc_info) if record.exc_info else None
        if not self.as_json:
            text = record.getMessage() if access is not None else f"{record.levelname.lower()}: {record.getMessage()}"
            return f"{when} {text}" + (f"\n{exception}" if exception else "")
        head = {"time": when, "level": record.levelname.lower(), "logger": record.name}
        body = access if access is not None else {"message": record.getMessage()}
        return json.dumps({**head, **body, **({"exception": exception} if exception else {})})


def configure(level: str = "info", fmt: str = "text") -> None:
    """Send the server's log (``llaisys.serve``: the access lines at INFO, warnings, errors) to stderr, from
    ``level`` up, as ``fmt`` (``text`` or ``json``) says. Once per process; a second call replaces the first."""
    logger = logging.getLogger("llaisys.serve")
    for handler in [h for h in logger.handlers if isinstance(h.formatter, _Formatter)]:
        logger.removeHandler(handler)
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(_Formatter(as_json=fmt == "json"))
    logger.addHandler(handler)
    logger.setLevel(level.upper())
    logger.propagate = False  # (a root handler, Ray's in a replica, would print each line twice)
