"""The route of the Responses API."""

from __future__ import annotations

from typing import TYPE_CHECKING

from fastapi import APIRouter, Request
from fastapi.responses import Response

from .serving import create_response

if TYPE_CHECKING:
    from ...server import Server


def router(server: Server) -> APIRouter:
    api = APIRouter()

    @api.post("/v1/responses", response_model=None)
    async def responses(request: Request) -> Response | None:
        return await create_response(server, request)

    return api
