"""The server's own routes: the web chat page and ``/health``, open to all (they hold no data; the page asks for a
key where one is needed), and ``/metrics`` (Prometheus text), behind the API key as the OpenAI routes are."""

from __future__ import annotations

import asyncio
import importlib.resources

from fastapi import APIRouter
from fastapi.responses import HTMLResponse, JSONResponse, PlainTextResponse

from .errors import error_body
from .server import Server


def open_router(server: Server) -> APIRouter:
    """``GET /`` (the page: one static file) and ``GET /health`` (200 while the engine runs, else 503 and why)."""
    api = APIRouter()
    page = importlib.resources.files(__package__).joinpath("static/index.html").read_text(encoding="utf-8")

    @api.get("/", include_in_schema=False)
    async def index() -> HTMLResponse:
        return HTMLResponse(page, headers={"Cache-Control": "no-cache"})

    @api.get("/health", response_model=None)
    async def health() -> dict | JSONResponse:
        if server.engine.alive:
            return {"status": "ok", "model": server.model_name}
        return server.error_response(503, error_body(503, server.engine.error or "the engine is not running"))

    return api


def metrics_router(server: Server) -> APIRouter:
    """``GET /metrics``: ``server.metrics_text()`` (rendered off the event loop)."""
    api = APIRouter()

    @api.get("/metrics")
    async def prometheus() -> PlainTextResponse:
        text = await asyncio.get_running_loop().run_in_executor(None, server.metrics_text)
        return PlainTextResponse(text, media_type="text/plain; version=0.0.4; charset=utf-8")

    return api
