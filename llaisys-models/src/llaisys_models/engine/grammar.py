"""Structured outputs: a grammar (a JSON schema, any JSON object, a regex or Lark) that constrains a sequence.

The grammar library is llguidance (MIT, no dependencies of its own). Per sequence and per step, on the host,
its matcher fills a bitmask of the tokens the grammar allows next (int32 [ceil(vocab / 32)], bit t % 32 of word
t // 32); the ``mask_logits`` op applies it to the sequence's logits row on the device, before argmax / sample,
so it works on every backend; the chosen token then advances the matcher. A sequence whose grammar is complete
(nothing may follow) finishes with "stop"; EOS is allowed only where the grammar may end.

    grammar = Grammar.json_schema(tokenizer, {"type": "object", ...})   # compiled once, shared by sequences
    model.generate(ids, 64, grammar=grammar)                              # each sequence: its own matcher

Speculative decoding is refused with a grammar: a drafted token would advance the matcher before it is
verified (llguidance can roll back, but the verifier has no hook for it yet).

One request never harms another through its grammar:

- Compiled once, where the ``Grammar`` is made (the server makes it in an executor, serve/structured.py): its
  one llguidance matcher (the lexer and parser tables, seconds for a large schema) is the prototype, and each
  sequence gets a ``deep_copy`` of it (tens of microseconds), so n choices share one compile and no compile
  ever runs on the engine thread. No cache keeps a grammar: it goes with the last request that holds it.
- Bounded: a JSON schema is measured and checked for finite values first (schema_check.py), and llguidance
  runs under explicit ``LLParserLimits`` (``PARSER_LIMITS``): fuel bounds the time of the lexer, an item cap
  the time of each step, a state cap the lexer's memory.
- Checked before admission: the prototype's first token mask must allow a token of the vocabulary (not only
  EOS), so a grammar that can never write anything is a 400, not a stalled or empty reply.
- Quiet: every llguidance failure, a Rust panic included (pyo3's ``PanicException`` is a ``BaseException``),
  becomes a one-line ``GrammarError`` (``verbose_errors=False``: no parser state, no grammar text, no
  backtrace or build paths), at compile time and in ``Matcher.mask``/``accept`` alike.
"""

from __future__ import annotations

import contextlib
import copy
import json
import threading
import weakref
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from types import ModuleType
from typing import TYPE_CHECKING, Protocol

import numpy as np

import llaisys

from . import schema_check
from .schema_check import SchemaError

if TYPE_CHECKING:
    from llguidance import LLMatcher, LLParserLimits, LLTokenizer
    from transformers import PreTrainedTokenizerFast

# compact JSON (no whitespace between tokens: a model cannot pad its answer with endless spaces)
JSON_OPTIONS = {"whitespace_flexible": False}

# llguidance's resource limits for every grammar (LLParserLimits; its defaults, and its speed estimates, in its
# _lib.pyi). Measured on 2 cores with SmolLM2's 49k-token vocabulary.
PARSER_LIMITS = dict(
    # lexer construction: ~50k fuel/ms, so ~20 ms at most. The largest schema schema_check admits (5000 property
    # names, 120k characters) needed 132k. (default)
    initial_lexer_fuel=1_000_000,
    # lexer work of one token mask: ~14k/ms, ~14 ms at most; common schemas need ~1.3k, 500 optional
    # properties ~13k. (default)
    step_lexer_fuel=200_000,
    # Earley items of one token mask: ~20k/ms, ~2.5 ms at most; this, with the fuel above, bounds each step of a
    # sequence on the (shared) mask thread. (default)
    step_max_items=50_000,
    # items in one row: llguidance's default (2000) refuses, mid-generation, what schema_check admits (an anyOf
    # of 2001 branches, an object of 501 optional properties: ~4 items each). The per-step cap above is what
    # bounds time; this only has to stay above what the schema limits allow (5000 properties x 4, and margin).
    max_items_in_row=25_000,
    # lexer states, the lexer's memory (llguidance: ~1-2 kB each; measured ~0.1 kB with a 49k vocabulary), so
    # at most ~100-200 MB per grammar, shared by its sequences. A string with a length bound costs ~3.5 states
    # per character written (each count is a state): this admits ~28k characters of such strings per request
    # (default 250k).
    max_lexer_states=100_000,
    # symbols of the grammar's productions (llguidance panics, caught below, past ~65k symbols of another
    # count, whichever comes first). (default)
    max_grammar_size=500_000,
    # no parser state or grammar text in error messages: they reach clients and logs
    verbose_errors=False,
)

# HF tokenizer -> llguidance tokenizer
_tokenizers: weakref.WeakKeyDictionary[PreTrainedTokenizerFast, LLTokenizer] = weakref.WeakKeyDictionary()
_lock = threading.Lock()
_mask_threads: list[ThreadPoolExecutor] = []  # the one thread that computes prepared masks (made when first needed)


def _mask_thread() -> ThreadPoolExecutor:
    with _lock:
        if not _mask_threads:
            _mask_threads.append(ThreadPoolExecutor(1, thread_name_prefix="llaisys-grammar-mask"))
        return _mask_threads[0]


class GrammarError(llaisys.LlaisysValueError):
    """A grammar (schema, regex, Lark) that does not compile, or a sequence that its grammar stopped."""


MAX_REASON_CHARS = 200  # of llguidance's own words in a GrammarError


def _reason(message: str) -> str:
    """llguidance's error ``message`` as one short line (its lines joined, without the "<non-verbose/>" marker,
    cut at MAX_REASON_CHARS); an internal failure (a Rust panic: its text names the library's source files and
    carries a backtrace) as a sentence of ours."""
    if _is_internal(message):
        return "the grammar library failed on it (an internal limit: make the grammar smaller or simpler)"
    line = " ".join(message.replace("<non-verbose/>", "").split()) or "unknown error"
    return line if len(line) <= MAX_REASON_CHARS else line[:MAX_REASON_CHARS] + "…"


def _is_internal(message: str) -> bool:
    lowered = message.lower()
    return any(word in lowered for word in ("panic", "backtrace", ".rs:", "/src/", "/home/", "/root/"))


def _is_library_failure(error: BaseException) -> bool:
    """An exception llguidance raised about the grammar: an ``Exception``, or a Rust panic (pyo3's
    PanicException derives from BaseException, as KeyboardInterrupt and SystemExit do, which pass)."""
    return isinstance(error, Exception) or type(error).__name__ == "PanicException"


@contextlib.contextmanager
def _library_call(what: str) -> Iterator[None]:
    """Turn any failure of the grammar library inside into a one-line GrammarError about ``what``."""
    try:
        yield
    except GrammarError:
        raise
    except BaseException as e:
        if not _is_library_failure(e):
            raise
        raise GrammarError(f"{what}: {_reason(str(e))}") from None


def parser_limits() -> LLParserLimits:
    """``PARSER_LIMITS`` as llguidance's object."""
    return _llguidance().LLParserLimits(**PARSER_LIMITS)


def _llguidance() -> ModuleType:
    try:
        import llguidance
        import llguidance.numpy
    except ImportError as e:
        raise GrammarError(f"structured outputs need llguidance ({e}); pip install 'llaisys-models[serve]' "
                           "or pip install llguidance") from None
    return llguidance


def grammar_tokenizer(tokenizer: PreTrainedTokenizerFast) -> LLTokenizer:
    """llguidance's view of a HF fast tokenizer (built once per tokenizer: about a second at 150k tokens on an idle
    core, holding the GIL a fraction of it)."""
    ll = _llguidance()
    with _lock:
        found = _tokenizers.get(tokenizer)
        if found is None:
            eos = tokenizer.eos_token_id
            if eos is None:  # a model without EOS: the grammar's end is the only end
                eos = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
            if getattr(tokenizer, "backend_tokenizer", None) is None:
                raise GrammarError(f"structured outputs need a fast (tokenizers) tokenizer; this one is "
                                   f"{type(tokenizer).__name__}")
            with _library_call("llguidance cannot read this tokenizer"):
                found = ll.LLTokenizer(_tokenizer_json(tokenizer), n_vocab=len(tokenizer), eos_token=eos)
            _tokenizers[tokenizer] = found
    return found


def _tokenizer_json(tokenizer: PreTrainedTokenizerFast) -> str:
    """A HF fast tokenizer's JSON, as llguidance.hf.from_tokenizer reads it, but without copying the Rust tokenizer
    where it pads and truncates nothing: that copy holds the GIL for seconds at 150k tokens (every other thread of
    a server that warms up its grammars would stall), ``to_str`` releases it."""
    backend = tokenizer.backend_tokenizer
    if backend.padding is not None or backend.truncation is not None:
        backend = copy.copy(backend)
        backend.no_padding()
        backend.no_truncation()
    return backend.to_str()


class Grammar:
    """A compiled constraint for one tokenizer: llguidance's matcher at the grammar's start (compiled here, once)
    and the tokenizer it masks. Immutable; any number of sequences share it (each gets its own ``Matcher``, a
    copy of the compiled one)."""

    def __init__(self, tokenizer: PreTrainedTokenizerFast, grammar: str, what: str) -> None:
        self.what = what  # e.g. "json_schema", for messages
        self.text = grammar
        self.ll_tokenizer = grammar_tokenizer(tokenizer)
        self._start = _compile(self.ll_tokenizer, grammar, what)
        self._check_first_token()

    @classmethod
    def json_schema(cls, tokenizer: PreTrainedTokenizerFast, schema: dict | str, what: str = "json_schema") -> Grammar:
        """Output that is one JSON value matching ``schema`` (a dict or its JSON text), which must stay within
        schema_check's size limits and have finite values."""
        if isinstance(schema, str):
            try:
                schema = json.loads(schema)
            except (ValueError, RecursionError) as e:
                raise GrammarError(f"{what}: not JSON: {e}") from None
        if not isinstance(schema, dict):
            raise GrammarError(f"{what}: a schema is a JSON object, got {type(schema).__name__}")
        check_schemas([(schema, what)])
        with _library_call(what):
            text = _llguidance().LLMatcher.grammar_from_json_schema(schema, defaults=JSON_OPTIONS)
        return cls(tokenizer, text, what)

    @classmethod
    def json_object(cls, tokenizer: PreTrainedTokenizerFast) -> Grammar:
        """Output that is one JSON object (OpenAI's ``response_format: {"type": "json_object"}``)."""
        return cls.json_schema(tokenizer, {"type": "object"})

    @classmethod
    def regex(cls, tokenizer: PreTrainedTokenizerFast, pattern: str) -> Grammar:
        with _library_call("regex"):
            text = _llguidance().LLMatcher.grammar_from_regex(pattern)
        return cls(tokenizer, text, "regex")

    @classmethod
    def lark(cls, tokenizer: PreTrainedTokenizerFast, source: str, what: str = "lark") -> Grammar:
        """Output of a Lark grammar (llguidance's dialect: ``%json {schema}`` embeds a JSON schema, ``<[id]>`` is
        a token); ``what`` names it in errors. The JSON schemas it embeds are not checked here: check them with
        ``check_schemas`` first (serve/structured.py does, for forced tool calls)."""
        with _library_call(what):
            text = _llguidance().LLMatcher.grammar_from_lark(source)
        return cls(tokenizer, text, what)

    def matcher(self, vocab_size: int) -> Matcher:
        """A new sequence's position in the grammar: its start, a copy of the compiled one (no compile)."""
        return Matcher(self, vocab_size)

    def _new_position(self) -> LLMatcher:
        with _library_call(self.what):
            return self._start.deep_copy()

    def _check_first_token(self) -> None:
        """Refuse a grammar whose start allows no token of the vocabulary but EOS (a schema llguidance finds
        empty, a vocabulary that cannot write its first character). Computing this mask here, where the grammar
        is compiled, also builds the lexer states that every sequence's first step needs."""
        ll = _llguidance()
        mask = ll.numpy.allocate_token_bitmask(1, self.ll_tokenizer.vocab_size)
        with _library_call(self.what):
            ll.numpy.fill_next_token_bitmask(self._start, mask, 0)
        words = mask[0].view(np.uint32)
        eos = self.ll_tokenizer.eos_token
        words[eos // 32] &= ~np.uint32(1 << (eos % 32))
        if self._start.is_error() or not words.any():  # (llguidance's error here: "NoExtensionBias", say)
            why = f" ({_reason(self._start.get_error())})" if self._start.is_error() else ""
            raise GrammarError(f"{self.what}: the grammar allows no token of this model's vocabulary at its "
                               f"start{why}")


def check_schemas(schemas: list[tuple[dict, str]]) -> None:
    """Check the JSON schemas that one grammar embeds, each (schema, where it is, for messages): their sizes
    together, and each one's finite values (schema_check.py). GrammarError names the first failure."""
    try:
        schema_check.check_schemas(schemas)
    except SchemaError as e:
        raise GrammarError(str(e)) from None


def _compile(ll_tokenizer: LLTokenizer, text: str, what: str) -> LLMatcher:
    """llguidance's matcher of grammar ``text`` at its start, under ``PARSER_LIMITS`` (GrammarError if it does
    not compile). llguidance drops the GIL while it compiles."""
    ll = _llguidance()
    with _library_call(what):
        matcher = ll.LLMatcher(ll_tokenizer, text, limits=parser_limits(), log_level=0)
    if matcher.is_error():
        raise GrammarError(f"{what}: {_reason(matcher.get_error())}")
    return matcher


class Matcher:
    """One sequence's position in its grammar, and the bitmask of its next token over the model's vocabulary
    (``vocab_size`` may exceed the tokenizer's: the model's padding tokens are never allowed). Its failures are
    GrammarErrors of one line, about this sequence's grammar only."""

    def __init__(self, grammar: Grammar, vocab_size: int) -> None:
        ll = _llguidance()
        self._ll = ll
        self.what = grammar.what
        self._matcher = grammar._new_position()
        words = (vocab_size + 31) // 32
        self._filled = ll.numpy.allocate_token_bitmask(1, grammar.ll_tokenizer.vocab_size)  # int32 [1, words']
        self._host = np.zeros(words, dtype=np.int32)  # over the model's vocabulary
        self._shared = min(words, self._filled.shape[1])
        self._device: llaisys.Tensor | None = None
        self._prepared: Future[None] | None = None  # the next token's bitmask, being computed on another thread

    @property
    def done(self) -> bool:
        """The grammar is complete and nothing may follow (the sequence stops here)."""
        return self._matcher.is_stopped()

    @property
    def accepting(self) -> bool:
        """The output so far is complete for the grammar (it may end here; more may follow)."""
        return self._matcher.is_accepting()

    def prepare(self) -> None:
        """Start computing the next token's bitmask on the mask thread (llguidance releases the GIL, so the forward
        that makes the logits runs meanwhile); ``mask`` waits for it. The matcher must not move until then."""
        if self._prepared is None:
            self._prepared = _mask_thread().submit(self._fill)

    def _fill(self) -> None:
        with _library_call(self.what):
            self._ll.numpy.fill_next_token_bitmask(self._matcher, self._filled, 0)

    def _wait_prepared(self) -> bool:
        """Wait for a prepared mask (its failure raised here, on the caller's thread); False if none was."""
        if self._prepared is None:
            return False
        prepared, self._prepared = self._prepared, None
        prepared.result()
        return True

    def mask(self, logits: llaisys.Tensor, also: tuple[int, ...] = ()) -> None:
        """Set the logits (1-D, the model's vocabulary) of the tokens the grammar forbids next to -inf, but those of
        ``also`` (a reasoning model's opening tag, where its first token may open its thinking instead)."""
        if not self._wait_prepared():
            self._fill()
        self._host[:self._shared] = self._filled[0, :self._shared]
        bits = self._host.view(np.uint32)
        for token in also:
            bits[token // 32] |= np.uint32(1 << (token % 32))
        if not self._host.any():  # a grammar that allows nothing the model can emit (a tokenizer / model mismatch)
            reason = _reason(self._matcher.get_error()) if self._matcher.is_error() else "tokenizer and model disagree?"
            raise GrammarError(f"{self.what}: the grammar allows no token of the model's vocabulary here ({reason})")
        if self._device is None or self._device.device is not logits.device:
            self._device = llaisys.empty((self._host.size,), llaisys.int32, logits.device)
        self._device.load(self._host)
        llaisys.ops.mask_logits(logits, self._device)

    def also_allowing(self, tokens: tuple[int, ...]) -> TokenMask:
        """This matcher's mask with ``tokens`` allowed too (it does not advance: see ``accept``)."""
        return _AlsoAllowing(self, tokens)

    def accept(self, token: int) -> None:
        """Advance past the chosen token (one the mask allowed)."""
        self._wait_prepared()  # (a mask computed for the old position: a token chosen without ``mask``)
        with _library_call(self.what):
            accepted = self._matcher.consume_token(token)
        if not accepted:
            raise GrammarError(f"{self.what}: token {token} was chosen against the grammar "
                               f"({_reason(self._matcher.get_error())})")


class TokenMask(Protocol):
    """What the sampler masks a sequence's logits with (a ``Matcher``, or one that allows a few tokens more)."""

    def prepare(self) -> None: ...

    def mask(self, logits: llaisys.Tensor) -> None: ...


class _AlsoAllowing:
    """A matcher's mask that also allows ``tokens``."""

    def __init__(self, matcher: Matcher, tokens: tuple[int, ...]) -> None:
        self.matcher = matcher
        self.tokens = tokens

    def prepare(self) -> None:
        self.matcher.prepare()

    def mask(self, logits: llaisys.Tensor) -> None:
        self.matcher.mask(logits, self.tokens)
