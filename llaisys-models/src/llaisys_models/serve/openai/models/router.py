"""The routes of the model list (one model: the served one) and its card."""

from __future__ import annotations

from typing import TYPE_CHECKING

from fastapi import APIRouter

from ...errors import APIError
from .protocol import model_card, model_list

if TYPE_CHECKING:
    from ...server import Server


def router(server: Server) -> APIRouter:
    api = APIRouter()

    @api.get("/v1/models", response_model=None)
    async def list_models() -> dict:
        return model_list(server)

    @api.get("/v1/models/{name:path}", response_model=None)
    async def get_model(name: str) -> dict:
        if name != server.model_name:
            raise APIError(404, f"the model '{name}' does not exist", "model", "model_not_found")
        return model_card(server)

    return api
