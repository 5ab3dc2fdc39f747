"""The route of (text) completions."""

from __future__ import annotations

from typing import TYPE_CHECKING

from fastapi import APIRouter, Request
from fastapi.responses import Response

from .serving import create_completion

if TYPE_CHECKING:
    from ...server import Server


def router(server: Server) -> APIRouter:
    api = APIRouter()

    @api.post("/v1/completions", response_model=None)
    async def completions(request: Request) -> Response | None:
        return await create_completion(server, request)

    return api
