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

A reasoning model's reply (DeepSeek-R1 and its distills, Qwen3, QwQ: text/reasoning.py) comes apart: ``chat``
returns the answer, a ``ChatReply`` (a str) whose ``.reasoning`` holds the thinking (None where there was none),
and its stream yields ``ReplyPiece``s (str) whose ``.reasoning`` says which part each belongs to:

    reply = model.chat("How many r's in strawberry?", thinking_budget=256)
    reply, reply.reasoning                                   # the answer, the thinking
    for piece in model.stream_chat(messages):
        print(piece, end="")                                 # piece.reasoning: True while it thinks
    model.chat(messages, chat_template_kwargs={"enable_thinking": False})   # Qwen3: no thinking
"""

from __future__ import annotations

from collections.abc import Generator, Iterator, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from llaisys import LlaisysValueError

if TYPE_CHECKING:
    from .generation_defaults import GenerationDefaults
    from .reasoning import ReasoningParser, ReasoningSplitter
    from .stream import TextStream
    from .tokenizer import Tokenizer

Messages = str | Sequence[dict[str, Any]]  # chat()'s messages: one user message, or {"role", "content"} dicts

# an assistant message's thinking, as clients send it back (OpenAI-style APIs): never templated (the reasoning
# models' templates drop earlier turns' thinking themselves, and some would render the field)
REASONING_FIELDS = ("reasoning_content", "reasoning")


class ChatReply(str):
    """``chat``'s reply: the answer, as a str, with the thinking as ``reasoning`` (None where the reply did not
    think: the model does not reason, or its thinking was switched off or empty)."""

    reasoning: str | None

    def __new__(cls, answer: str, reasoning: str | None = None) -> ChatReply:
        reply = super().__new__(cls, answer)
        reply.reasoning = reasoning
        return reply

    def __getnewargs__(self) -> tuple[str, str | None]:  # type: ignore[override]  # (copy, pickle)
        return str(self), self.reasoning

    def __repr__(self) -> str:
        return f"ChatReply({str(self)!r}, reasoning={self.reasoning!r})"


class ReplyPiece(str):
    """A piece of a streamed reply: its text, as a str, and whether it is thinking (``reasoning`` True) or answer.
    A reasoning model's pieces of thinking all come before its answer's."""

    reasoning: bool

    def __new__(cls, text: str, reasoning: bool = False) -> ReplyPiece:
        piece = super().__new__(cls, text)
        piece.reasoning = reasoning
        return piece

    def __getnewargs__(self) -> tuple[str, bool]:  # type: ignore[override]  # (copy, pickle)
        return str(self), self.reasoning

    def __repr__(self) -> str:
        return f"ReplyPiece({str(self)!r}, reasoning={self.reasoning})"

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
             seed: int | None = None, stop: str | Sequence[str] = (), reasoning_parser: str = "auto",
             thinking_budget: int | None = None, chat_template_kwargs: Mapping[str, Any] | None = None,
             **generate_args: Any) -> ChatReply | Iterator[ReplyPiece]:
        """The reply to ``messages`` (a list of {"role", "content"} dicts, or one user message as a str),
        through the model's chat template: a ``ChatReply`` (a str); with ``stream=True``, an iterator of its
        pieces (``ReplyPiece``, str) instead.

        Each sampling setting left None (``temperature``, ``top_p``, ``top_k``, ``repetition_penalty``) is the
        model's own where it ships one (``model.generation_defaults``: its generation_config.json or GGUF
        sampling keys); then greedy unless ``temperature`` (> 0) or ``top_p`` (< 1) asks for sampling (then
        ``top_k`` defaults to 0, every token); ``seed`` makes sampling reproducible. ``max_new_tokens`` None: up to 128, as
        the context allows. The reply ends at an EOS token (left out of the text) or before the first of
        the ``stop`` strings. Other keyword arguments go to ``stream_generate`` (``speculative``, ...).

        A reasoning model's thinking is told apart from its answer (text/reasoning.py): the reply is the answer,
        its ``reasoning`` the thinking (None: none); streamed, each piece's ``reasoning`` says which it is (the
        thinking's pieces come first). ``reasoning_parser``: "auto" (the chat template says whether and how the
        model thinks), "deepseek_r1", "qwen3", or "none" (the text as it comes, thinking included, as for a model
        that does not reason: every ``reasoning`` None / False). ``thinking_budget``: thinking tokens at most
        (None: unbounded), after which the thinking is closed for the model and the answer follows; the
        budget's tokens count in ``max_new_tokens``. ``chat_template_kwargs``: more variables for the chat
        template, e.g. ``{"enable_thinking": False}`` (Qwen3: no thinking); one the template never reads is
        dropped. An assistant message's ``reasoning_content`` / ``reasoning`` (an earlier reply's thinking) is
        left out of the prompt."""
        ids, parser = self._chat_request(messages, reasoning_parser, thinking_budget, chat_template_kwargs)
        if parser is not None:
            generate_args["thinking"] = parser.rule(ids, thinking_budget)
        text = self._reply(ids, max_new_tokens, temperature, top_p, top_k, seed, stop, generate_args,
                           keep=parser.keep if parser is not None else frozenset())
        pieces = _pieces(text, parser.splitter(ids) if parser is not None else None)
        if stream:
            return pieces
        thought: list[str] = []
        answer: list[str] = []
        for piece in pieces:
            (thought if piece.reasoning else answer).append(piece)
        return ChatReply("".join(answer), "".join(thought) or None)

    def stream_chat(self, messages: Messages, **kwargs: Any) -> Iterator[ReplyPiece]:
        """``chat(messages, stream=True, **kwargs)``: the reply's text pieces (``ReplyPiece``) as they are
        generated."""
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

    def _chat_request(self, messages: Messages, reasoning_parser: str = "auto", thinking_budget: int | None = None,
                      chat_template_kwargs: Mapping[str, Any] | None = None
                      ) -> tuple[list[int], ReasoningParser | None]:
        """A chat's prompt (``_chat_prompt``) and the reasoning parser of its reply (None: the text as it comes),
        every argument checked first."""
        from .reasoning import CHOICES, load_parser
        from .template_kwargs import parse_kwargs, template_names, usable

        if not isinstance(reasoning_parser, str):
            raise LlaisysValueError(f"reasoning_parser must be a str, got {type(reasoning_parser).__name__}")
        if thinking_budget is not None and (isinstance(thinking_budget, bool) or not isinstance(thinking_budget, int)
                                            or thinking_budget < 0):
            raise LlaisysValueError(f"thinking_budget must be a whole number >= 0 (or None: unbounded), got "
                                    f"{thinking_budget!r}")
        variables = parse_kwargs(chat_template_kwargs, "chat_template_kwargs")
        tokenizer = self.tokenizer
        self._check_template(tokenizer)
        if reasoning_parser not in CHOICES:
            raise LlaisysValueError(f"reasoning_parser {reasoning_parser!r} is not a reasoning parser: use one of "
                                    f"{', '.join(CHOICES)}")
        try:
            parser = load_parser(tokenizer, reasoning_parser)
        except LlaisysValueError as e:  # (its messages name the CLI's and the server's flag)
            raise LlaisysValueError(str(e).replace("--reasoning-parser", "reasoning_parser", 1)) from None
        if parser is None and thinking_budget is not None:
            raise LlaisysValueError(f"thinking_budget needs a reasoning model: the chat template of {self.path.name} "
                                    f"has no thinking" + (" (reasoning_parser='none')" if reasoning_parser == "none"
                                                          else ""))
        kept, _ = usable(variables, template_names(tokenizer))  # (a name the template never reads does nothing)
        return self._chat_prompt(messages, kept), parser

    def _check_template(self, tokenizer: Tokenizer) -> None:
        if not getattr(tokenizer, "chat_template", None):
            raise LlaisysValueError(f"the tokenizer of {self.path.name} has no chat template, so chat() cannot "
                                    f"build a prompt; use complete(text) to continue a plain text, or set "
                                    f"model.tokenizer.chat_template")

    def _chat_prompt(self, messages: Messages, template_kwargs: Mapping[str, Any] | None = None) -> list[int]:
        """Token ids of ``messages`` in the chat template (with ``template_kwargs``, checked), with the assistant's
        turn begun."""
        from .tokenizer import encode

        tokenizer = self.tokenizer
        self._check_template(tokenizer)
        if isinstance(messages, str):
            messages = [{"role": "user", "content": messages}]
        if (not isinstance(messages, (list, tuple)) or not messages
                or not all(isinstance(m, dict) and isinstance(m.get("content"), str) and isinstance(m.get("role"), str)
                           for m in messages)):
            raise LlaisysValueError('messages must be a non-empty list of {"role": str, "content": str} dicts '
                                    '(or one user message as a str)')
        messages = [without_reasoning(m) for m in messages]
        try:
            return encode(tokenizer, messages, template_kwargs=template_kwargs)
        except LlaisysValueError:
            raise
        except Exception as e:  # a template that rejects these messages (their roles, their order)
            raise LlaisysValueError(f"the chat template cannot render these messages: {type(e).__name__}: {e}") from None

    def _reply(self, ids: list[int], max_new_tokens: int | None, temperature: float | None, top_p: float | None,
               top_k: int | None, seed: int | None, stop: str | Sequence[str] | None,
               generate_args: dict[str, Any], keep: frozenset[int] = frozenset()) -> Iterator[str]:
        """Check everything, then return the generator of the reply's text (nothing runs until it is read);
        ``keep``: special tokens whose text stays in it (a reasoning model's tags, for its splitter)."""
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
        return _text(tokens, TextStream(self.tokenizer, stops, keep), eos)


def without_reasoning(message: dict[str, Any]) -> dict[str, Any]:
    """``message`` without an assistant's thinking (``REASONING_FIELDS``), which no prompt shows."""
    if message.get("role") != "assistant" or not any(k in message for k in REASONING_FIELDS):
        return message
    return {k: v for k, v in message.items() if k not in REASONING_FIELDS}


def _pieces(text: Iterator[str], splitter: ReasoningSplitter | None) -> Generator[ReplyPiece, None, None]:
    """The reply's text as ``ReplyPiece``s: split into thinking and answer by ``splitter`` (None: all answer,
    piece for piece)."""
    try:
        if splitter is None:
            for piece in text:
                yield ReplyPiece(piece)
            return
        for piece in text:
            yield from _parts(*splitter.push(piece))
        yield from _parts(*splitter.finish())
    finally:
        close = getattr(text, "close", None)
        if close is not None:
            close()  # (a reply the caller stopped: its tokens' stream frees the model)


def _parts(thought: str, answer: str) -> Iterator[ReplyPiece]:
    if thought:
        yield ReplyPiece(thought, reasoning=True)
    if answer:
        yield ReplyPiece(answer)


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
