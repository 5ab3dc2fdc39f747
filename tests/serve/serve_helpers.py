"""References for the serving tests, computed without the server: HF's chat template and tokenizer,
and ``model.generate`` on a separate copy of the model."""

from __future__ import annotations

import pytest

CHAT_MODEL = "tiny-chat"  # the id the chat server serves its model under
API_KEY = "test-key-123"  # the demo server's key


def require_serving() -> None:
    """Skip the calling test module where the serve extra or the test clients are not installed."""
    extra = "the serve extra is not installed: pip install './llaisys-models[serve]'"
    pytest.importorskip("fastapi", reason=extra)
    pytest.importorskip("uvicorn", reason=extra)
    pytest.importorskip("openai", reason="the serving tests drive the server with the official client: pip install openai")


def chat_ids(tokenizer, messages) -> list[int]:
    text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    return list(tokenizer(text, add_special_tokens=False).input_ids)


def text_ids(tokenizer, text: str) -> list[int]:
    return list(tokenizer(text).input_ids)


def generate_text(model, tokenizer, ids, max_tokens: int, **sampling) -> str:
    """The text ``model.generate`` produces after ``ids`` (its new tokens decoded at once)."""
    out = model.generate(ids, max_tokens, **sampling)
    return tokenizer.decode(out[len(ids):], skip_special_tokens=True)


def user(text: str) -> list[dict]:
    return [{"role": "user", "content": text}]
