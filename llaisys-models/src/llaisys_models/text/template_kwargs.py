"""Extra variables for a chat template (``chat_template_kwargs``: vLLM's and llama.cpp's name), such as Qwen3's
``enable_thinking``: which of them a template may be given.

A template's render also sees what transformers passes itself (the messages, the tools, the generation prompt
flag, the special tokens) and what it defines (``raise_exception``, jinja's ``range`` and ``namespace``); a variable
of the same name would replace those, and a request that sets ``chat_template`` would choose the template the
server runs. So those names are refused (``ReservedName``), and any other name the template's text never
mentions is dropped, as vLLM drops it: a client may send ``enable_thinking`` to every model it talks to.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from llaisys import LlaisysValueError

if TYPE_CHECKING:
    from .tokenizer import Tokenizer

# apply_chat_template's own arguments, the variables it renders with, and names the template environment defines
RESERVED = frozenset({
    "conversation", "messages", "tools", "documents", "chat_template", "add_generation_prompt",
    "continue_final_message", "tokenize", "padding", "truncation", "max_length", "return_tensors", "return_dict",
    "return_assistant_tokens_mask", "tokenizer_kwargs", "processor_kwargs",
    "bos_token", "eos_token", "unk_token", "sep_token", "pad_token", "cls_token", "mask_token",
    "additional_special_tokens", "raise_exception", "strftime_now",
    "range", "dict", "lipsum", "cycler", "joiner", "namespace", "loop", "self", "true", "false", "none", "True",
    "False", "None"})


class ReservedName(LlaisysValueError):
    """A chat template variable that the renderer sets itself (``name``)."""

    def __init__(self, name: str) -> None:
        super().__init__(f"{name!r} cannot be set: llaisys sets it when it renders the chat template")
        self.name = name


def template_names(tokenizer: Tokenizer) -> frozenset[str]:
    """Every identifier the chat template's text mentions: the variables it may read, and some more (names it
    sets, attributes), which are harmless to pass."""
    template = getattr(tokenizer, "chat_template", None) or ""
    sources = template.values() if isinstance(template, dict) else [template]
    return frozenset(name for source in sources for name in re.findall(r"[A-Za-z_]\w*", str(source)))


def usable(kwargs: Mapping[str, Any], names: frozenset[str]) -> tuple[dict[str, Any], list[str]]:
    """(the variables of ``kwargs`` the template may read, the names dropped as unknown to it, ``names``); a
    ``ReservedName`` for the first name the renderer sets itself."""
    for name in kwargs:
        if name in RESERVED:
            raise ReservedName(name)
    return {k: v for k, v in kwargs.items() if k in names}, [k for k in kwargs if k not in names]


def parse_kwargs(text: str | Mapping[str, Any] | None, what: str) -> dict[str, Any]:
    """Chat template variables given as JSON text (``what``: where, for errors), or as a mapping already: a
    LlaisysValueError unless they are an object with no name the renderer sets itself."""
    if text is None:
        return {}
    if isinstance(text, str):
        try:
            value = json.loads(text)
        except ValueError as e:
            raise LlaisysValueError(f"{what} is not JSON: {e}") from None
    else:
        value = text
    if not isinstance(value, Mapping):
        raise LlaisysValueError(f"{what} must be a JSON object of chat template variables, e.g. "
                                f"'{{\"enable_thinking\": false}}'")
    for name in value:
        if name in RESERVED:
            raise LlaisysValueError(f"{what}: {ReservedName(name)}")
    return dict(value)
