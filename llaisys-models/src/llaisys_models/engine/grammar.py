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
"""

from __future__ import annotations

import copy
import json
import threading
import weakref
from concurrent.futures import Future, ThreadPoolExecutor
from types import ModuleType
from typing import TYPE_CHECKING

import numpy as np

import llaisys

if TYPE_CHECKING:
    from llguidance import LLTokenizer
    from transformers import PreTrainedTokenizerFast

# compact JSON (no whitespace between tokens: a model cannot pad its answer with endless spaces)
JSON_OPTIONS = {"whitespace_flexible": False}

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
    """A grammar (schema, regex, Lark) that does not compile."""


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
            try:
                found = ll.LLTokenizer(_tokenizer_json(tokenizer), n_vocab=len(tokenizer), eos_token=eos)
            except Exception as e:
                raise GrammarError(f"structured outputs need a fast (tokenizers) tokenizer: {e}") from None
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
    """A compiled constraint for one tokenizer: llguidance grammar text and the tokenizer it masks. Immutable;
    any number of sequences share it (each gets its own ``Matcher``)."""

    def __init__(self, tokenizer: PreTrainedTokenizerFast, grammar: str, what: str) -> None:
        self.what = what  # e.g. "json_schema", for messages
        self.text = grammar
        self.ll_tokenizer = grammar_tokenizer(tokenizer)
        error = _llguidance().LLMatcher.validate_grammar(grammar, self.ll_tokenizer)
        if error:
            raise GrammarError(f"{what}: {error}")

    @classmethod
    def json_schema(cls, tokenizer: PreTrainedTokenizerFast, schema: dict | str) -> Grammar:
        """Output that is one JSON value matching ``schema`` (a dict or its JSON text)."""
        ll = _llguidance()
        if isinstance(schema, str):
            try:
                schema = json.loads(schema)
            except ValueError as e:
                raise GrammarError(f"json_schema: not JSON: {e}") from None
        if not isinstance(schema, dict):
            raise GrammarError(f"json_schema: a schema is a JSON object, got {type(schema).__name__}")
        try:
            text = ll.LLMatcher.grammar_from_json_schema(schema, defaults=JSON_OPTIONS)
        except Exception as e:  # llguidance raises ValueError for most, others for odd input
            raise GrammarError(f"json_schema: {e}") from None
        return cls(tokenizer, text, "json_schema")

    @classmethod
    def json_object(cls, tokenizer: PreTrainedTokenizerFast) -> Grammar:
        """Output that is one JSON object (OpenAI's ``response_format: {"type": "json_object"}``)."""
        return cls.json_schema(tokenizer, {"type": "object"})

    @classmethod
    def regex(cls, tokenizer: PreTrainedTokenizerFast, pattern: str) -> Grammar:
        return cls(tokenizer, _llguidance().LLMatcher.grammar_from_regex(pattern), "regex")

    @classmethod
    def lark(cls, tokenizer: PreTrainedTokenizerFast, source: str, what: str = "lark") -> Grammar:
        """Output of a Lark grammar (llguidance's dialect: ``%json {schema}`` embeds a JSON schema, ``<[id]>`` is
        a token); ``what`` names it in errors."""
        return cls(tokenizer, _llguidance().LLMatcher.grammar_from_lark(source), what)

    def matcher(self, vocab_size: int) -> Matcher:
        return Matcher(self, vocab_size)


class Matcher:
    """One sequence's position in its grammar, and the bitmask of its next token over the model's vocabulary
    (``vocab_size`` may exceed the tokenizer's: the model's padding tokens are never allowed)."""

    def __init__(self, grammar: Grammar, vocab_size: int) -> None:
        ll = _llguidance()
        self._ll = ll
        self._matcher = ll.LLMatcher(grammar.ll_tokenizer, grammar.text)
        if self._matcher.is_error():
            raise GrammarError(f"{grammar.what}: {self._matcher.get_error()}")
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

    def prepare(self) -> None:
        """Start computing the next token's bitmask on the mask thread (llguidance releases the GIL, so the forward
        that makes the logits runs meanwhile); ``mask`` waits for it. The matcher must not move until then."""
        if self._prepared is None:
            self._prepared = _mask_thread().submit(self._fill)

    def _fill(self) -> None:
        self._ll.numpy.fill_next_token_bitmask(self._matcher, self._filled, 0)

    def mask(self, logits: llaisys.Tensor) -> None:
        """Set the logits (1-D, the model's vocabulary) of the tokens the grammar forbids next to -inf."""
        if self._prepared is not None:
            prepared, self._prepared = self._prepared, None
            prepared.result()
        else:
            self._fill()
        self._host[:self._shared] = self._filled[0, :self._shared]
        if not self._host.any():  # a grammar that allows nothing the model can emit (a tokenizer / model mismatch)
            raise GrammarError(f"the grammar allows no token of the model's vocabulary here "
                               f"({self._matcher.get_error() or 'tokenizer and model disagree?'})")
        if self._device is None or self._device.device is not logits.device:
            self._device = llaisys.empty((self._host.size,), llaisys.int32, logits.device)
        self._device.load(self._host)
        llaisys.ops.mask_logits(logits, self._device)

    def accept(self, token: int) -> None:
        """Advance past the chosen token (one the mask allowed)."""
        if self._prepared is not None:  # a mask computed for the old position (a token chosen without ``mask``)
            self._prepared.result()
            self._prepared = None
        if not self._matcher.consume_token(token):
            raise GrammarError(f"token {token} was chosen against the grammar: {self._matcher.get_error()}")
