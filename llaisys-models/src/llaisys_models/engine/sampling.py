"""How a sequence chooses its tokens: ``SamplingParams``, the per-step seed, and the choice itself.

Greedy decoding (top_k=1 or temperature=0) takes ``argmax``; anything else goes through the ``sample`` op
with a seed derived from (seed, step), so a seeded sequence draws the same tokens on every device and
whatever else shares its forward passes.
"""

from __future__ import annotations

import dataclasses
import math
from typing import NamedTuple

import numpy as np

import llaisys

from .penalties import PenaltyBuffers, TokenCounts

MASK64 = (1 << 64) - 1


@dataclasses.dataclass(frozen=True)
class SamplingParams:
    """A sequence's sampling and stopping rules (checked by the caller: ``check_sampling``, serve's schemas)."""
    max_tokens: int  # new tokens at most
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0  # 0: every token; 1: greedy
    seed: int | None = None  # None: a random seed per sequence; taken modulo 2**64
    stop: tuple[str, ...] = ()  # stop strings (applied to the text by whoever detokenizes: serve)
    eos_token_ids: frozenset[int] | None = None  # None: the model's EOS tokens
    speculation: object = None  # a speculative.Speculation (drafter, K), or None: one token per step
    grammar: object = None  # a grammar.Grammar the output must match (structured outputs), or None
    # repetition control and bias (penalties.py), applied to the logits before the choice
    repetition_penalty: float = 1.0  # HF's, over prompt + generated tokens; 1: off
    frequency_penalty: float = 0.0  # OpenAI's, over the generated tokens; 0: off
    presence_penalty: float = 0.0
    logit_bias: tuple[tuple[int, float], ...] = ()  # sorted (token id, bias) pairs
    logprobs: int | None = None  # each chosen token's log-probability and this many top alternatives
    # (0 .. 20); None: off (nothing computed or copied)

    @property
    def greedy(self) -> bool:
        return self.top_k == 1 or self.temperature == 0


class TokenLogprob(NamedTuple):
    """A chosen token's log-probability and the most probable tokens' (id, log-probability), descending, from
    the row it was chosen from (after penalties and logit_bias, under temperature as OpenAI defines it)."""
    logprob: float
    top: tuple[tuple[int, float], ...]


def step_seed(seed: int, step: int) -> int:
    """A 64-bit seed for one step: splitmix64 of (seed, step), so steps draw independently."""
    z = (seed + (step + 1) * 0x9E3779B97F4A7C15) & MASK64
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & MASK64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & MASK64
    return z ^ (z >> 31)


class Sampler:
    """Chooses tokens from rows of logits on one device (its two result buffers are reused)."""

    def __init__(self, device: llaisys.Device, dtype: llaisys.DType):
        self._chosen = llaisys.empty((1,), llaisys.int64, device)
        self._value = llaisys.empty((1,), dtype, device)
        self._penalties = PenaltyBuffers(device)
        self._device = device
        self._logprob_buffers: dict[int, tuple[llaisys.Tensor, llaisys.Tensor]] = {}  # k -> (top ids, values)

    def select(self, logits: llaisys.Tensor, params: SamplingParams, seed: int,
               counts: TokenCounts | None = None, matcher=None) -> int:
        """The next token from 1-D logits: argmax when greedy, else the sample op (a top_k beyond the
        vocabulary means all of it, as in HF, and never reaches the op as an integer it cannot hold).
        ``counts``: the sequence's tokens so far, for its penalties and logit_bias (applied to ``logits`` in
        place first); None where its parameters have none. A ``matcher`` (grammar.Matcher) then masks the
        logits (in place: what the grammar forbids stays forbidden whatever its bias) and advances past the token."""
        if counts is not None:
            self._penalties.apply(logits, counts)
        if matcher is not None:
            return self._select_constrained(logits, params, seed, matcher)
        if params.greedy:
            llaisys.ops.argmax(self._chosen, self._value, logits)
        else:
            llaisys.ops.sample(self._chosen, logits, params.temperature, min(params.top_k, logits.shape[0]),
                               params.top_p, seed)
        return int(self._chosen.numpy()[0])

    def _select_constrained(self, logits: llaisys.Tensor, params: SamplingParams, seed: int, matcher) -> int:
        matcher.mask(logits)  # the grammar's forbidden tokens to -inf, on the logits' device
        token = self.select(logits, params, seed)
        matcher.accept(token)
        return token

    def logprobs(self, logits: llaisys.Tensor, token: int, params: SamplingParams) -> TokenLogprob:
        """``token``'s log-probability and the top ``params.logprobs`` alternatives from the 1-D ``logits`` it was
        chosen from by ``select`` (which applied the penalties in place): k + 1 floats and k ids come back."""
        k = min(int(params.logprobs or 0), logits.shape[0])
        if k not in self._logprob_buffers:
            self._logprob_buffers[k] = (llaisys.empty((k,), llaisys.int64, self._device),
                                        llaisys.empty((k + 1,), llaisys.float32, self._device))
        ids, values = self._logprob_buffers[k]
        llaisys.ops.logprobs(ids, values, logits, token, 0.0 if params.greedy else params.temperature)
        vals = values.numpy().tolist()
        return TokenLogprob(vals[0], tuple(zip(ids.numpy().tolist(), vals[1:])) if k else ())


# -- argument checks (before any value reaches a C type) --------------------------------------------------------

def _check_number(name, value, low, high=None, integer=False, low_open=False):
    kinds = (int, np.integer) if integer else (int, float, np.integer, np.floating)
    if isinstance(value, bool) or not isinstance(value, kinds) or not (integer or math.isfinite(value)):
        what = "an integer" if integer else "a finite number"
        raise llaisys.LlaisysValueError(f"{name} must be {what}, got {value!r}")
    if value < low or (low_open and value == low) or (high is not None and value > high):
        bounds = f"{'>' if low_open else '>='} {low}" + (f" and <= {high}" if high is not None else "")
        raise llaisys.LlaisysValueError(f"{name} must be {bounds}, got {value!r}")


def check_max_new_tokens(max_new_tokens) -> None:
    _check_number("max_new_tokens", max_new_tokens, 0, integer=True)


def check_sampling(top_k, top_p, temperature, seed) -> None:
    """``generate``'s sampling arguments (seed None = random): a huge top_k must not wrap to greedy, an
    infinite temperature fails here."""
    _check_number("top_k", top_k, 0, integer=True)
    _check_number("top_p", top_p, 0, 1, low_open=True)
    _check_number("temperature", temperature, 0)
    if seed is not None:
        _check_number("seed", seed, 0, MASK64, integer=True)
