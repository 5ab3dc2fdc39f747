"""``GET /v1/models``: the served model's card, OpenAI's ``model`` object with what a client needs to know of
this server's limits and defaults (``max_model_len``, ``default_max_tokens``, ``sampling_defaults``), then a card
per LoRA adapter (serve/lora.py), as vLLM lists them: ``parent`` the base model's id, ``root`` the adapter's path."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from ...server import Server


def model_card(server: Server) -> dict:
    return {"id": server.model_name, "object": "model", "created": server.created, "owned_by": "llaisys",
            "max_model_len": server.context, "default_max_tokens": server.default_max_tokens,
            "sampling_defaults": server.sampling.settings()}


def adapter_card(server: Server, name: str) -> dict:
    """The card of the LoRA adapter ``name`` (loaded): the base model's limits, its parent and root."""
    assert server.adapters is not None  # (it has adapters)
    return {**model_card(server), "id": name, "parent": server.model_name, "root": server.adapters.path_of(name)}


def model_list(server: Server) -> dict:
    adapters = server.adapters.names if server.adapters is not None else []
    return {"object": "list", "data": [model_card(server)] + [adapter_card(server, name) for name in adapters]}


def card_of(server: Server, name: str) -> dict | None:
    """The card of the model or adapter ``name`` (None: neither)."""
    if name == server.model_name:
        return model_card(server)
    if server.adapters is not None and name in server.adapters.names:
        return adapter_card(server, name)
    return None
