"""Text in, text out: ``model.chat(messages)`` and ``model.complete(text)``, over ``stream_generate``.

    model = llaisys_models.load("Qwen/Qwen2.5-0.5B-Instruct")
    model.chat([{"role": "user", "content": "What is the capital of France?"}])   # -> the reply, a str
    for piece in model.chat("Write a haiku", stream=True, temperature=0.7, seed=1):
        print(piece, end="", flush=True)
    model.complete("The capital of France is")                                     # no chat template

The prompt is built as the CLI's and the server's are (tokenizer.encode: the model's chat template
with the generation prompt), the reply decoded as the server decodes it (text/stream.TextStream:
incremental detokenization that never splits a character, stop strings left out of the text). The
model's tokenizer loads on first use (``model.tokenizer``, which may also be assigned).
"""

from __future__ import annotations

from collections.abc import Generator, Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from llaisys import LlaisysValueError

if TYPE_CHECKING:
    from .generation_defaults import GenerationDefaults
    from .stream import TextStream
    from .tokenizer import Tokenizer

Messages = str | Sequence[dict[str, Any]]  # chat()'s messages: one user message, or {"role", "content"} dicts

DEFAULT_NEW_TOKENS = 128  # a reply's budget when none is given, shrunk to what the model's context leaves


def sampling_args(top_k: int | None = None, top_p: float | None = None, temperature: float | None = None,
                  seed: int | None = None) -> dict[str, Any]:
    """``generate``'s sampling arguments from those given: greedy unless ``temperature`` or ``top_p`` asks for
    sampling, when ``top_k`` defaults to 0 (every token) instead of 1."""
    sampling = temperature not in (None, 0.0) or top_p not in (None, 1.0)
    return dict(top_k=top_k if top_k is not None else (0 if sampling else 1), top_p=1.0 if top_p is None else top_p,
                temperature=1.0 if temperature is None else temperature, seed=seed)


def reply_budget(requested: int | None, prompt_tokens: int, context: int, name: str = "max_new_tokens") -> int:
    """New tokens for a reply: ``requested``, which must fit beside the prompt in the model's context, or
    (None) DEFAULT_NEW_TOKENS shrunk to fit. ``name``: the argument's name in messages."""
    room = context - prompt_tokens
    if room < 1 and requested != 0:
        raise LlaisysValueError(f"the prompt is {prompt_tokens} tokens, which leaves no room for new tokens in the "
                                f"model's context of {context} positions; shorten it")
    if requested is None:
        return min(DEFAULT_NEW_TOKENS, room)
    if requested > room:
        raise LlaisysValueError(f"the prompt ({prompt_tokens} tokens) and {name} {requested} need "
                                f"{prompt_tokens + requested} positions, more than the model's context of "
                                f"{context}; at most {room} new tokens fit")
    return requested


class TextMixin:
    """``chat`` / ``stream_chat`` / ``complete`` / ``stream_complete`` for a model (causal_lm.CausalLM)."""

    if TYPE_CHECKING:  # what the model (causal_lm.CausalLM, generation.GenerationMixin) provides
        path: Path
        checkpoint: object
        eos_token_ids: tuple[int, ...]

        @property
        def context_length(self) -> int: ...

        def stream_generate(self, *args: Any, **kwargs: Any) -> Generator[int, None, None]: ...

    _tokenizer: Tokenizer = None

    @property
    def tokenizer(self) -> Tokenizer:
        """The model's tokenizer (transformers), loaded from its directory or GGUF file on first use."""
        if self._tokenizer is None:
            from .tokenizer import load_tokenizer

            self._tokenizer = load_tokenizer(self.path)
        return self._tokenizer

    @tokenizer.setter
    def tokenizer(self, tokenizer: Tokenizer) -> None:
        self._tokenizer = tokenizer

    _generation_defaults: GenerationDefaults | None = None

    @property
    def generation_defaults(self) -> GenerationDefaults:
        """The sampling settings the model ships (generation_defaults.py), read on first use: ``chat``,
        ``complete``, the CLI and the server take each one the caller leaves unset. Assign
        ``generation_defaults.NONE`` for llaisys' own (greedy)."""
        if self._generation_defaults is None:
            from . import generation_defaults

            metadata = None
            if self.path.is_file():  # a GGUF file: its metadata, from the open file where the model holds it
                metadata = getattr(self.checkpoint, "metadata", None)
                if metadata is None:
                    from ..loading.gguf.reader import GGUFFile

                    metadata = GGUFFile(self.path).metadata
            self._generation_defaults = generation_defaults.read(self.path, metadata)
        return self._generation_defaults

    @generation_defaults.setter
    def generation_defaults(self, defaults: GenerationDefaults) -> None:
        self._generation_defaults = defaults

    def chat(self, messages: Messages, *, stream: bool = False, max_new_tokens: int | None = None,
             temperature: float | None = None, top_p: float | None = None, top_k: int | None = None,
             seed: int | None = None, stop: str | Sequence[str] = (), **generate_args: Any) -> str | Iterator[str]:
        """The reply to ``messages`` (a list of {"role", "content"} dicts, or one user message as a str),
        through the model's chat template; with ``stream=True``, an iterator of its pieces instead.

        Each sampling setting left None (``temperature``, ``top_p``, ``top_k``, ``repetition_penalty``) is the
        model's own where it ships one (``model.generation_defaults``: its generation_config.json or GGUF
        sampling keys); then greedy unless ``temperature`` (> 0) or ``top_p`` (< 1) asks for sampling (then
        ``top_k`` defaults to 0, every token); ``seed`` makes sampling reproducible. ``max_new_tokens`` None: up to 128, as
        the context allows. The reply ends at an EOS token (left out of the text) or before the first of
        the ``stop`` strings. Other keyword arguments go to ``stream_generate`` (``speculative``, ...)."""
        tokens = self._reply(self._chat_prompt(messages), max_new_tokens, temperature, top_p, top_k, seed,
                             stop, generate_args)
        return tokens if stream else "".join(tokens)

    def stream_chat(self, messages: Messages, **kwargs: Any) -> Iterator[str]:
        """``chat(messages, stream=True, **kwargs)``: the reply's text pieces as they are generated."""
        pieces = self.chat(messages, stream=True, **kwargs)
        assert not isinstance(pieces, str)  # (stream=True)
        return pieces

    def complete(self, prompt: str, *, stream: bool = False, max_new_tokens: int | None = None,
                 temperature: float | None = None, top_p: float | None = None, top_k: int | None = None,
                 seed: int | None = None, stop: str | Sequence[str] = (), **generate_args: Any) -> str | Iterator[str]:
        """The text that follows ``prompt`` (no chat template), as ``chat`` generates and ends it."""
        from .tokenizer import encode

        if not isinstance(prompt, str):
            raise LlaisysValueError(f"complete() takes the prompt as text, got {type(prompt).__name__} (token ids: "
                                    f"use generate)")
        tokens = self._reply(encode(self.tokenizer, prompt, chat=False), max_new_tokens, temperature, top_p, top_k,
                             seed, stop, generate_args)
        return tokens if stream else "".join(tokens)

    def stream_complete(self, prompt: str, **kwargs: Any) -> Iterator[str]:
        """``complete(prompt, stream=True, **kwargs)``."""
        pieces = self.complete(prompt, stream=True, **kwargs)
        assert not isinstance(pieces, str)  # (stream=True)
        return pieces

    def _chat_prompt(self, messages: Messages) -> list[int]:
        """Token ids of ``messages`` in the chat template, with the assistant's turn begun."""
        from .tokenizer import encode

        tokenizer = self.tokenizer
        if not getattr(tokenizer, "chat_template", None):
            raise LlaisysValueError(f"the tokenizer of {self.path.name} has no chat template, so chat() cannot "
                                    f"build a prompt; use complete(text) to continue a plain text, or set "
                                    f"model.tokenizer.chat_template")
        if isinstance(messages, str):
            messages = [{"role": "user", "content": messages}]
        if (not isinstance(messages, (list, tuple)) or not messages
                or not all(isinstance(m, dict) and isinstance(m.get("content"), str) and isinstance(m.get("role"), str)
                           for m in messages)):
            raise LlaisysValueError('messages must be a non-empty list of {"role": str, "content": str} dicts '
                                    '(or one user message as a str)')
        try:
            return encode(tokenizer, list(messages))
        except LlaisysValueError:
            raise
        except Exception as e:  # a template that rejects these messages (their roles, their order)
            raise LlaisysValueError(f"the chat template cannot render these messages: {type(e).__name__}: {e}") from None

    def _reply(self, ids: list[int], max_new_tokens: int | None, temperature: float | None, top_p: float | None,
               top_k: int | None, seed: int | None, stop: str | Sequence[str] | None,
               generate_args: dict[str, Any]) -> Iterator[str]:
        """Check everything, then return the generator of the reply's text (nothing runs until it is read)."""
        from .stream import TextStream

        stops = (stop,) if isinstance(stop, str) else tuple(stop or ())
        if not all(isinstance(s, str) for s in stops):
            raise LlaisysValueError(f"stop must be a string or a list of strings, got {stop!r}")
        budget = reply_budget(max_new_tokens, len(ids), self.context_length)
        eos = generate_args.get("eos_token_ids")
        eos = frozenset(self.eos_token_ids if eos is None else eos)
        chosen = self.generation_defaults.fill(top_k=top_k, top_p=top_p, temperature=temperature,
                                               repetition_penalty=generate_args.pop("repetition_penalty", None))
        if chosen["repetition_penalty"] is not None:
            generate_args["repetition_penalty"] = chosen["repetition_penalty"]
        sampling = sampling_args(chosen["top_k"], chosen["top_p"], chosen["temperature"], seed)
        tokens = self.stream_generate(ids, budget, **sampling, **generate_args)
        return _text(tokens, TextStream(self.tokenizer, stops), eos)


def _text(tokens: Generator[int, None, None], text: TextStream, eos: frozenset[int]) -> Iterator[str]:
    """The non-empty text pieces of ``tokens``, up to an EOS token or a stop string."""
    try:
        for token in tokens:
            if token in eos:  # the last token: no text of its own
                break
            piece, stopped = text.push(token)
            if piece:
                yield piece
            if stopped:
                return
        piece, _ = text.finish()
        if piece:
            yield piece
    finally:
        tokens.close()  # a reply stopped early (a stop string, the caller) frees its KV blocks
