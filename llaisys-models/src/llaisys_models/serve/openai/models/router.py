"""The routes of the model list (the served model, then its LoRA adapters) and their cards."""

from __future__ import annotations

from typing import TYPE_CHECKING

from fastapi import APIRouter

from ...errors import APIError
from .protocol import card_of, model_list

if TYPE_CHECKING:
    from ...server import Server


def router(server: Server) -> APIRouter:
    api = APIRouter()

    @api.get("/v1/models", response_model=None)
    async def list_models() -> dict:
        return model_list(server)

    @api.get("/v1/models/{name:path}", response_model=None)
    async def get_model(name: str) -> dict:
        card = card_of(server, name)
        if card is None:
            raise APIError(404, f"the model '{name}' does not exist", "model", "model_not_found")
        return card

    return api
