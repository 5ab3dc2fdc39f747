"""An HTTP request carried from the ingress to a replica's app, and its response carried back, over Ray.

The ingress (``Relay``, an ASGI app) reads a request's body, works out its route (``routing.py``) and sends
the whole request to a replica through the deployment handle, whose router (``router.py``) picks the replica
by that route. The replica runs it through the same FastAPI app a single server runs (``respond``) and
streams back the app's ASGI messages (the status and headers, then the body, chunk by chunk: server-sent
events leave as the engine makes them), which the ingress sends on to the client unchanged.

Failures: a replica that dies (or cannot be reached) before the ingress has sent the client anything has its
request sent again, to another replica; one that dies mid-response ends it with an error (an SSE error event
where the response is a stream). A client that hangs up cancels the request on the replica (the app sees the
disconnect, and its engine drops the request). The ingress answers by itself only when no replica could take
the request (503, OpenAI's error body).
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import logging
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING, Any

from starlette.datastructures import Headers

from ..errors import error_body
from ..tenancy import Tenants
from .routing import Route, route_of

if TYPE_CHECKING:
    from ray.serve.handle import DeploymentHandle
    from starlette.types import ASGIApp, Message, Receive, Scope, Send

log = logging.getLogger("llaisys.serve")

# the ASGI scope's fields a replica's app reads (the rest, like the server's own objects, stays behind)
SCOPE_FIELDS = ("type", "asgi", "http_version", "method", "scheme", "path", "raw_path", "query_string", "root_path",
                "headers", "client", "server")
REPLICA_HEADER = b"x-llaisys-replica"  # names the replica that answered (for logs, and tests)
ROUTE_IN_THREAD_BYTES = 1 << 16  # a larger body is parsed for its route on a worker thread
ATTEMPTS = 3  # replicas a request is sent to at most, while none has answered it


@dataclasses.dataclass(frozen=True)
class ForwardedRequest:
    """One HTTP request, whole, as a replica's app needs it (the body read in full, or cut one byte past the
    server's limit: the app then refuses it, 413, as it refuses any body that long)."""
    scope: dict[str, Any]
    body: bytes
    route: Route | None  # what the router routes it by


async def respond(app: ASGIApp, request: ForwardedRequest, replica: str) -> AsyncIterator[list[Message]]:
    """The replica's side: ``request`` through the ASGI ``app``; yields lists of the app's messages (what it sent
    since the last list; the first is the response start, with ``x-llaisys-replica: replica`` added). Closing
    the generator early (the client is gone) shows the app a disconnect and cancels it."""
    messages: asyncio.Queue[Message | None] = asyncio.Queue()
    body_read = False
    disconnected = asyncio.Event()

    async def receive() -> Message:
        nonlocal body_read
        if not body_read:
            body_read = True
            return {"type": "http.request", "body": request.body, "more_body": False}
        await disconnected.wait()  # the app waits here for a disconnect (while it streams, or collects)
        return {"type": "http.disconnect"}

    async def send(message: Message) -> None:
        if message["type"] == "http.response.start":
            message = {**message, "headers": [*message.get("headers", ()), (REPLICA_HEADER, replica.encode())]}
        messages.put_nowait(message)

    async def run_app() -> None:
        await app(dict(request.scope), receive, send)

    task = asyncio.create_task(run_app())
    task.add_done_callback(lambda _: messages.put_nowait(None))  # None: the app returned
    try:
        ended = False
        while not ended:
            batch = [await messages.get()]
            while not messages.empty():  # what else is ready leaves with it: one Ray message, not several
                batch.append(messages.get_nowait())
            ended = None in batch or any(_last(m) for m in batch if m is not None)
            ready = [m for m in batch if m is not None]
            if ready:
                yield ready
        await task  # (an error the app let through is a bug: it reaches the ingress, which answers 500)
    finally:
        disconnected.set()
        if not task.done():
            task.cancel()
            try:
                await task
            except asyncio.CancelledError:
                pass


def _last(message: Message) -> bool:
    return message["type"] == "http.response.body" and not message.get("more_body", False)


class Relay:
    """The ingress's ASGI app: every HTTP request to a replica (``handle``: the replica deployment's handle, its
    ``respond`` method, streaming), its response back to the client."""

    def __init__(self, handle: DeploymentHandle, tenants: Tenants, max_body_bytes: int) -> None:
        self.handle = handle
        self.tenants = tenants
        self.max_body_bytes = max_body_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            await _lifespan(receive, send)
            return
        if scope["type"] != "http":
            return  # (a websocket: nothing here speaks it)
        body = await self._read_body(receive)
        if body is None:
            return  # the client hung up mid-upload: nobody is left to answer
        route = await self._route(scope, body)
        request = ForwardedRequest({k: scope[k] for k in SCOPE_FIELDS if k in scope}, body, route)
        await self._forward(request, send)

    async def _read_body(self, receive: Receive) -> bytes | None:
        chunks: list[bytes] = []
        size = 0
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                return None
            chunks.append(message.get("body", b""))
            size += len(chunks[-1])
            if size > self.max_body_bytes or not message.get("more_body", False):
                return b"".join(chunks)[:self.max_body_bytes + 1]

    async def _route(self, scope: Scope, body: bytes) -> Route | None:
        authorization = Headers(scope=scope).get("authorization", "")
        args = (scope["method"], scope["path"], authorization, body, self.tenants)
        if len(body) > ROUTE_IN_THREAD_BYTES:
            return await asyncio.to_thread(route_of, *args)
        return route_of(*args)

    async def _forward(self, request: ForwardedRequest, send: Send) -> None:
        from ray.exceptions import RayActorError

        method, path = request.scope.get("method"), request.scope.get("path")
        started = streaming = False  # once the client got something, the request cannot go to another replica
        for attempt in range(1, ATTEMPTS + 1):
            response = self.handle.remote(request)
            try:
                async for batch in response:
                    for message in batch:
                        if message["type"] == "http.response.start":
                            streaming = _is_event_stream(message)
                        await send(message)
                        started = True
                return
            except RayActorError as e:  # the replica died (or cannot be reached)
                if started:
                    log.warning("a replica died while answering %s %s: %s", method, path, e)
                    await _cut_short(send, streaming)
                    return
                log.warning("a replica died before answering %s %s (attempt %d of %d): %s", method, path, attempt,
                            ATTEMPTS, e)
            except asyncio.CancelledError:  # the client is gone: the replica drops the request
                response.cancel()
                raise
            except Exception:  # an error the replica's app let through: a bug
                response.cancel()
                log.exception("a replica failed on %s %s", method, path)
                if started:
                    await _cut_short(send, streaming)
                else:
                    await _error(send, 500, "internal error on the replica that took the request", "internal_error")
                return
        await _error(send, 503, f"no replica of the model could answer (tried {ATTEMPTS}); try again later",
                     "replica_unavailable")


def _is_event_stream(start: Message) -> bool:
    content_type = Headers(raw=start.get("headers", [])).get("content-type", "")
    return content_type.startswith("text/event-stream")


async def _cut_short(send: Send, streaming: bool) -> None:
    """End a response whose replica died mid-way: with an error event if it is a stream of server-sent events
    (the OpenAI client raises it), else by ending the body (its JSON is incomplete, which a client notices)."""
    if streaming:
        event = error_body(502, "the replica serving this request stopped; the response is incomplete", None,
                           "replica_died")
        await send({"type": "http.response.body", "body": f"data: {json.dumps(event)}\n\n".encode(),
                    "more_body": True})
    await send({"type": "http.response.body", "body": b"", "more_body": False})


async def _error(send: Send, status: int, message: str, code: str) -> None:
    body = json.dumps(error_body(status, message, None, code)).encode()
    await send({"type": "http.response.start", "status": status,
                "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]})
    await send({"type": "http.response.body", "body": body, "more_body": False})


async def _lifespan(receive: Receive, send: Send) -> None:
    """The ASGI lifespan protocol, which Ray Serve runs on an ingress's app: nothing to start or stop here."""
    while True:
        message = await receive()
        if message["type"] == "lifespan.startup":
            await send({"type": "lifespan.startup.complete"})
        elif message["type"] == "lifespan.shutdown":
            await send({"type": "lifespan.shutdown.complete"})
            return
