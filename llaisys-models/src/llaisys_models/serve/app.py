"""The FastAPI application of a ``Server``: its routes, their error responses and its middleware, assembled.

    routes.py                                   /  and  /health (open), /metrics
    openai/{chat,completions,responses,models}  /v1/...: each endpoint's protocol, serving and router
    lora.py                                     /v1/load_lora_adapter, /v1/unload_lora_adapter (--allow-runtime-lora)
    tenancy.py                                  the API key every route but / and /health needs (401)
    hosts.py                                    a loopback server answers loopback names only (421)
    CORSMiddleware                              the --cors-origin origins' pages may call the API
    access_log.AccessLog                        a line per request, refused ones too

Every POST must be ``application/json`` (415, request_body.py), which a page on another origin cannot send
without CORS, which stays closed but to the origins ``--cors-origin`` names (Starlette's CORSMiddleware: their
preflights are answered, other origins get no Access-Control headers). Every error a client gets is OpenAI's error
body (``Server.error_response``: counted, the server's paths scrubbed from it).
"""

from __future__ import annotations

import contextlib
import gc
import logging
from collections.abc import AsyncIterator

from fastapi import Depends, FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.middleware.cors import CORSMiddleware
from fastapi.responses import Response
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.requests import ClientDisconnect

from . import access_log, lora, routes
from .errors import APIError, error_body
from .hosts import LocalHostsOnly
from .openai.chat import router as chat
from .openai.completions import router as completions
from .openai.models import router as models
from .openai.responses import router as responses
from .server import Server
from .tenancy import key_required

log = logging.getLogger("llaisys.serve")


def create_app(server: Server) -> FastAPI:
    """The FastAPI application. Its lifespan starts the engine thread and stops it at shutdown."""

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        # what start-up made (the model, the tokenizer, transformers' modules: millions of objects) leaves the
        # collector's view: a full collection then takes milliseconds, not the ~80 ms with the GIL held that stall
        # every stream whenever one request's allocations trigger it
        gc.collect()
        gc.freeze()
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
    _handle_errors(app, server)
    app.include_router(routes.open_router(server))
    keyed = [Depends(key_required(server.tenants))]
    for router in (routes.metrics_router, models.router, chat.router, completions.router, responses.router):
        app.include_router(router(server), dependencies=keyed)
    if server.adapters is not None and server.adapters.runtime:  # (else absent: 404, as vLLM without the flag)
        app.include_router(lora.router(server), dependencies=keyed)

    if server.cors_origins:  # inside LocalHostsOnly: a preflight for a foreign Host is still refused
        app.add_middleware(CORSMiddleware, allow_origins=list(server.cors_origins), allow_methods=["GET", "POST"],
                           allow_headers=["Authorization", "Content-Type"], max_age=600)
    app.add_middleware(LocalHostsOnly, server=server, refuse=server.error_response)
    app.add_middleware(access_log.AccessLog)  # the outermost: refused requests get their line too
    return app


def _handle_errors(app: FastAPI, server: Server) -> None:
    """Every error as OpenAI's error body: a refused request (APIError), an unknown route or method, a client that
    hung up before its request was read (499, no one to read it), and a bug (500, logged)."""

    @app.exception_handler(APIError)
    async def api_error(request: Request, e: APIError) -> Response:
        return server.error_response(e.status, e.body())

    @app.exception_handler(StarletteHTTPException)
    async def http_error(request: Request, e: StarletteHTTPException) -> Response:
        message = {404: f"no route {request.method} {request.url.path}",
                   405: f"method {request.method} is not allowed on {request.url.path}"}.get(e.status_code, e.detail)
        return server.error_response(e.status_code, error_body(e.status_code, message))

    @app.exception_handler(RequestValidationError)
    async def validation_error(request: Request, e: RequestValidationError) -> Response:
        return server.error_response(400, error_body(400, str(e)))

    @app.exception_handler(ClientDisconnect)
    async def client_disconnect(request: Request, e: ClientDisconnect) -> Response:  # not the server's error
        server.engine.metrics.client_disconnects += 1
        client = f"{request.client.host}:{request.client.port}" if request.client else "a client"
        log.warning("%s hung up before its request %s %s was read", client, request.method, request.url.path)
        return Response(status_code=499)  # nginx's "client closed request"; nobody is left to read it

    @app.exception_handler(Exception)
    async def server_error(request: Request, e: Exception) -> Response:  # a bug: log it, answer in OpenAI's shape
        log.exception("unhandled error in %s %s", request.method, request.url.path)
        return server.error_response(500, error_body(500, f"internal error: {type(e).__name__}: {e}"))
