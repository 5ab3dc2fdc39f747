"""The route of chat completions."""

from __future__ import annotations

from typing import TYPE_CHECKING

from fastapi import APIRouter, Request
from fastapi.responses import Response

from .serving import create_chat_completion

if TYPE_CHECKING:
    from ...server import Server


def router(server: Server) -> APIRouter:
    api = APIRouter()

    @api.post("/v1/chat/completions", response_model=None)
    async def chat_completions(request: Request) -> Response | None:
        return await create_chat_completion(server, request)

    return api
