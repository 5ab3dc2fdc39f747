"""Text <-> token ids through the model directory's HuggingFace tokenizer (transformers, imported lazily)."""

from __future__ import annotations

import os
from pathlib import Path

from .errors import ModelLoadError


def load_tokenizer(path):
    """``transformers.AutoTokenizer`` from the model directory (or the metadata of a GGUF file)."""
    from . import gguf

    if gguf.is_gguf(path):  # hook: GGUF files (issue 15)
        return gguf.load_tokenizer(path)
    # only tokenizers are used: keep transformers' "PyTorch was not found" advisory off the console
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
    try:
        from transformers import AutoTokenizer
    except ImportError as e:  # a dependency of llaisys-models, but say so if it is gone
        raise ModelLoadError(f"the tokenizer needs transformers ({e}); pip install transformers") from None
    try:
        return AutoTokenizer.from_pretrained(str(Path(path)))
    except Exception as e:
        raise ModelLoadError(f"cannot load a tokenizer from {path}: {type(e).__name__}: {e}") from None


def encode(tokenizer, messages_or_text, chat: bool = True) -> list[int]:
    """Token ids of a prompt: a list of chat messages, or a text wrapped as one user message when
    ``chat`` and the tokenizer has a chat template (else the bare text)."""
    if isinstance(messages_or_text, str):
        if not (chat and getattr(tokenizer, "chat_template", None)):
            return list(tokenizer(messages_or_text).input_ids)
        messages = [{"role": "user", "content": messages_or_text}]
    else:
        messages = messages_or_text
    text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    return list(tokenizer(text, add_special_tokens=False).input_ids)


class IncrementalDecoder:
    """Text for a growing list of tokens, one piece per token, never splitting a UTF-8 character.

    Decodes a short window (the tokens since the last printed piece, after a little context)
    rather than the whole list, so each token costs the same however long the output grows.
    """

    def __init__(self, tokenizer):
        self.tokenizer = tokenizer
        self.tokens: list[int] = []
        self._prefix = 0  # window start: context whose text was already printed
        self._read = 0  # tokens before this index are printed

    def _decode(self, tokens) -> str:
        return self.tokenizer.decode(tokens, skip_special_tokens=True)

    def push(self, token: int) -> str:
        """Add a token and return the text it completes (maybe '' while a character is partial)."""
        self.tokens.append(token)
        return self._piece(final=False)

    def finish(self) -> str:
        """The text still held back (a character the last tokens left incomplete)."""
        return self._piece(final=True)

    def _piece(self, final: bool) -> str:
        printed = self._decode(self.tokens[self._prefix:self._read])
        text = self._decode(self.tokens[self._prefix:])
        if len(text) <= len(printed) or (text.endswith("\ufffd") and not final):
            return ""
        self._prefix, self._read = self._read, len(self.tokens)
        return text[len(printed):]
