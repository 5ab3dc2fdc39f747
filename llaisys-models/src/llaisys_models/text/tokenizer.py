"""Text <-> token ids through the model directory's HuggingFace tokenizer (transformers, imported lazily)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, TypeAlias

from llaisys import LlaisysValueError

from ..errors import ModelLoadError
from ..loading import gguf
from ..loading.files import TOKENIZER_FILES, VOCABULARY_FILES, PathArg, check_regular, is_gguf
from ..loading.hub import resolve

# A transformers tokenizer (PreTrainedTokenizerBase: AutoTokenizer's, or gguf.load_tokenizer's), or a stand-in with
# the methods used here. Its methods' declared returns are unions over their call forms (decode: str | list[str],
# apply_chat_template: str | list[int] | ... | BatchEncoding), which the form called here does not narrow: typed Any.
Tokenizer: TypeAlias = Any


def load_tokenizer(path: PathArg) -> Tokenizer:
    """``transformers.AutoTokenizer`` from the model directory (or the metadata of a GGUF file; a Hub id
    names its copy in the Hub cache, see hub.py)."""
    path = resolve(path)
    if is_gguf(path):  # its tokenizer and chat template come from the file's metadata
        return gguf.load_tokenizer(path)
    present = [name for name in TOKENIZER_FILES if (path / name).exists()]
    for name in present:
        check_regular(path / name)
    if not any(name in present for name in VOCABULARY_FILES):
        raise ModelLoadError(f"{path} has no tokenizer files: expected tokenizer.json (or tokenizer.model, or "
                             f"vocab.json + merges.txt); copy them from the model's original directory")
    try:
        from transformers import AutoTokenizer
    except ImportError as e:  # a dependency of llaisys-models, but say so if it is gone
        raise ModelLoadError(f"the tokenizer needs transformers ({e}); pip install transformers") from None
    try:
        return AutoTokenizer.from_pretrained(str(path))
    except Exception as e:
        raise ModelLoadError(f"cannot load a tokenizer from {path}: {type(e).__name__}: {e}") from None


def check_text(text: str, what: str = "the prompt") -> None:
    """A LlaisysValueError unless ``text`` is valid Unicode (text read with errors="surrogateescape",
    as Python reads command-line arguments, carries each undecodable byte as a lone surrogate)."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as e:
        char = ord(text[e.start])
        byte = f"byte 0x{char - 0xDC00:02x}" if 0xDC80 <= char <= 0xDCFF else f"U+{char:04X}"
        raise LlaisysValueError(f"{what} is not valid UTF-8 text: {byte} at character {e.start}") from None


def encode(tokenizer: Tokenizer, messages_or_text: str | list[dict], chat: bool = True, max_chars: int | None = None,
           tools: list[dict] | None = None, template_kwargs: Mapping[str, Any] | None = None) -> list[int]:
    """Token ids of a prompt: a list of chat messages, or a text wrapped as one user message when
    ``chat`` and the tokenizer has a chat template (else the bare text). A prompt that is not valid
    text, or that the tokenizer turns into no tokens at all, is a LlaisysValueError naming it; one of
    more than ``max_chars`` characters (once its chat template is applied) is a PromptTooLongError,
    raised before the tokenizer reads it. ``tools``: OpenAI function tools, for the chat template to render;
    ``template_kwargs``: more variables for it (checked by whoever takes them: text/template_kwargs.py)."""
    if isinstance(messages_or_text, str):
        text = messages_or_text
        check_text(text)
        if not (chat and getattr(tokenizer, "chat_template", None)):
            _check_length(text, max_chars)
            return _nonempty(list(tokenizer(text).input_ids), text, tokenizer)
        messages = [{"role": "user", "content": text}]
    else:
        messages = messages_or_text
        for m in messages:
            check_text(str(m.get("content", "")), f"the {m.get('role', 'chat')} message")
        text = str(messages[-1].get("content", "")) if messages else ""
    extra = {**(template_kwargs or {}), **({"tools": tools} if tools else {})}
    rendered = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True, **extra)
    _check_length(rendered, max_chars)
    return _nonempty(list(tokenizer(rendered, add_special_tokens=False).input_ids), text, tokenizer)


def longest_token(tokenizer: Tokenizer) -> int:
    """The most characters of text one token of ``tokenizer`` can stand for: its longest vocabulary
    entry. A byte-level token's entry has one character per byte, and text has at least one byte per
    character, so a text of more than ``n * longest_token(tokenizer)`` characters has more than ``n``
    tokens (for tokenizers that drop or merge characters before encoding, e.g. collapsing spaces, the
    bound can refuse a text that would have fit)."""
    return max(map(len, tokenizer.get_vocab()), default=1)


class PromptTooLongError(LlaisysValueError):
    """A prompt of more characters than the caller's bound (``chars`` of at most ``max_chars``)."""

    def __init__(self, chars: int, max_chars: int) -> None:
        super().__init__(f"the prompt has {chars} characters, more than the {max_chars} allowed")
        self.chars = chars
        self.max_chars = max_chars


def _check_length(text: str, max_chars: int | None) -> None:
    if max_chars is not None and len(text) > max_chars:
        raise PromptTooLongError(len(text), max_chars)


class EmptyPromptError(LlaisysValueError):
    """A prompt that gives no tokens: an empty text, or one whose every character the tokenizer drops."""


def _nonempty(ids: list[int], text: str, tokenizer: Tokenizer) -> list[int]:
    if not ids and not text:
        raise EmptyPromptError("the prompt is empty: it needs at least one token")
    if not ids:
        shown = text if len(text) <= 60 else text[:57] + "..."
        raise EmptyPromptError(f"the prompt {shown!r} has no tokens in the vocabulary of the tokenizer from "
                                f"{tokenizer.name_or_path} ({len(tokenizer)} tokens): it drops every character "
                                f"of it")
    return ids


class IncrementalDecoder:
    """Text for a growing list of tokens, one piece per token, never splitting a UTF-8 character.

    Decodes a short window (the tokens since the last printed piece, after a little context)
    rather than the whole list, so each token costs the same however long the output grows.
    Special tokens have no text, but those in ``keep`` (a tool-call marker the reader parses): their own.
    """

    def __init__(self, tokenizer: Tokenizer, keep: frozenset[int] = frozenset()) -> None:
        self.tokenizer = tokenizer
        self.keep = keep
        self.tokens: list[int] = []
        self._prefix = 0  # window start: context whose text was already printed
        self._read = 0  # tokens before this index are printed

    def _decode(self, tokens: list[int]) -> str:
        return self.tokenizer.decode(tokens, skip_special_tokens=True)

    def push(self, token: int) -> str:
        """Add a token and return the text it completes (maybe '' while a character is partial)."""
        if token in self.keep:  # what came before it, then its text; the next window starts after it
            text = self._piece(final=True)
            self.tokens.append(token)
            self._prefix = self._read = len(self.tokens)
            return text + self.tokenizer.decode([token], skip_special_tokens=False)
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
