"""``GET /v1/models``: the served model's card, OpenAI's ``model`` object with what a client needs to know of
this server's limits and defaults (``max_model_len``, ``default_max_tokens``, ``sampling_defaults``)."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from ...server import Server


def model_card(server: Server) -> dict:
    return {"id": server.model_name, "object": "model", "created": server.created, "owned_by": "llaisys",
            "max_model_len": server.context, "default_max_tokens": server.default_max_tokens,
            "sampling_defaults": server.sampling.settings()}


def model_list(server: Server) -> dict:
    return {"object": "list", "data": [model_card(server)]}
