"""Repetition control and logit bias: what a sequence's tokens so far do to the logits of its next one.

    repetition_penalty   HF transformers': the logit of every token of the prompt and of the generated text is
                         divided by it where positive, multiplied where negative (> 0; 1 = off)
    frequency_penalty    OpenAI's: logit -= count among the generated tokens * frequency_penalty ([-2, 2])
    presence_penalty     OpenAI's: logit -= presence_penalty once a token was generated ([-2, 2])
    logit_bias           OpenAI's: {token id: bias in [-100, 100]} added to the logit (-100 bans, +100 forces)

All four are one ``llaisys.ops.penalize_logits`` call per logits row, on the row's device, just before the
token is chosen (``Sampler.select``). ``TokenCounts`` is a sequence's side of it: its distinct tokens in
increasing order with (prompt, generated) counts and the bias of each, kept as the sequence grows (one
search and at most one insertion per new token), never recounted.
"""

from __future__ import annotations

from typing import Any, Protocol

import numpy as np

import llaisys

from .sampling_rules import RULES


class SamplingParams(Protocol):
    """What penalties read of a sequence's ``sampling.SamplingParams`` (sampling.py imports this module)."""

    @property
    def repetition_penalty(self) -> float: ...

    @property
    def frequency_penalty(self) -> float: ...

    @property
    def presence_penalty(self) -> float: ...

    @property
    def logit_bias(self) -> tuple[tuple[int, float], ...]: ...


class TokenCounts:
    """The entries ``penalize_logits`` reads for one sequence: ids (int64 [n], increasing), counts (int64 [n, 2]:
    prompt, generated) and, with a logit_bias, bias (float32 [n]; 0 for a token without one). Arrays grow by
    doubling; ``n`` entries are live."""

    def __init__(self, prompt: list[int], params: SamplingParams) -> None:
        self.params = params
        self.tracks = penalizes(params)  # whether generated tokens change anything (not for a logit_bias alone)
        bias = dict(params.logit_bias)
        # the prompt matters to the repetition penalty only
        context = np.asarray(prompt if params.repetition_penalty != 1.0 else [], dtype=np.int64)
        seen, prompt_counts = np.unique(context, return_counts=True)
        ids = np.union1d(seen, np.fromiter(bias, dtype=np.int64, count=len(bias)))
        self.n = len(ids)
        capacity = max(16, 1 << (self.n + 16).bit_length())
        self.ids = np.zeros(capacity, np.int64)
        self.counts = np.zeros((capacity, 2), np.int64)
        self.ids[:self.n] = ids
        self.counts[np.searchsorted(ids, seen), 0] = prompt_counts
        self.bias: np.ndarray | None = None
        if bias:
            self.bias = np.zeros(capacity, np.float32)
            self.bias[:self.n] = [bias.get(int(t), 0.0) for t in ids]

    @staticmethod
    def of(prompt: list[int], params: SamplingParams) -> TokenCounts | None:
        """A sequence's counts, or None where its parameters leave the logits alone."""
        return TokenCounts(prompt, params) if adjusts_logits(params) else None

    def add(self, token: int, times: int = 1) -> None:
        """``token`` was generated (``times`` < 0: a tentative token taken back; its entry may stay at 0)."""
        if not self.tracks:
            return
        i = int(np.searchsorted(self.ids[:self.n], token))
        if i == self.n or self.ids[i] != token:
            self._insert(i, token)
        self.counts[i, 1] += times

    def _insert(self, i: int, token: int) -> None:
        if self.n == len(self.ids):
            grow = len(self.ids)
            self.ids = np.concatenate([self.ids, np.zeros(grow, np.int64)])
            self.counts = np.concatenate([self.counts, np.zeros((grow, 2), np.int64)])
            if self.bias is not None:
                self.bias = np.concatenate([self.bias, np.zeros(grow, np.float32)])
        n = self.n
        self.ids[i + 1:n + 1] = self.ids[i:n]
        self.counts[i + 1:n + 1] = self.counts[i:n]
        self.ids[i], self.counts[i] = token, 0
        if self.bias is not None:
            self.bias[i + 1:n + 1] = self.bias[i:n]
            self.bias[i] = 0.0
        self.n += 1


def penalizes(params: SamplingParams) -> bool:
    """Whether ``params`` (a SamplingParams) asks for a penalty on tokens seen."""
    return params.repetition_penalty != 1.0 or params.frequency_penalty != 0.0 or params.presence_penalty != 0.0


def adjusts_logits(params: SamplingParams) -> bool:
    """Whether ``params`` changes the logits before the choice at all (a penalty or a logit_bias)."""
    return penalizes(params) or bool(params.logit_bias)


class PenaltyBuffers:
    """Device copies of a sequence's entries for the op, reused across steps (they grow, never shrink)."""

    def __init__(self, device: llaisys.Device) -> None:
        self.device = device
        # (ids int64 [size], counts int64 [size, 2], bias float32 [size]), made at the first sequence's entries
        self._buffers: tuple[llaisys.Tensor, llaisys.Tensor, llaisys.Tensor] | None = None

    def apply(self, logits: llaisys.Tensor, counts: TokenCounts) -> None:
        """``penalize_logits`` on the 1-D ``logits`` with ``counts``' entries and its sequence's penalties."""
        n = counts.n
        if n == 0:
            return
        buffers = self._buffers
        if buffers is None or buffers[0].shape[0] < n:
            size = max(64, 1 << (n - 1).bit_length())
            buffers = self._buffers = (llaisys.empty((size,), llaisys.int64, self.device),
                                       llaisys.empty((size, 2), llaisys.int64, self.device),
                                       llaisys.empty((size,), llaisys.float32, self.device))
        ids_buffer, counts_buffer, bias_buffer = buffers
        ids, table = ids_buffer.slice(0, 0, n), counts_buffer.slice(0, 0, n)
        ids.load(counts.ids[:n])
        table.load(counts.counts[:n])
        bias = None
        if counts.bias is not None:
            bias = bias_buffer.slice(0, 0, n)
            bias.load(counts.bias[:n])
        p = counts.params
        llaisys.ops.penalize_logits(logits, ids, table, bias, p.repetition_penalty, p.frequency_penalty,
                                    p.presence_penalty)


# -- argument checks: sampling_rules.RULES (the server's too) -------------------------------------------------------

def check_repetition_penalty(value: object) -> float:
    return float(RULES["repetition_penalty"].check(value))


def check_frequency_penalty(value: object) -> float:
    return float(RULES["frequency_penalty"].check(value))


def check_presence_penalty(value: object) -> float:
    return float(RULES["presence_penalty"].check(value))


def check_logit_bias(logit_bias: Any, vocab_size: int) -> tuple[tuple[int, float], ...]:
    """``{token id: bias}`` (None: none) as sorted (id, bias) pairs; ids in [0, vocab_size), biases in [-100, 100]."""
    if logit_bias is None:
        return ()
    if not hasattr(logit_bias, "items"):
        raise llaisys.LlaisysValueError(f"logit_bias must be a mapping of token id to bias, got "
                                        f"{type(logit_bias).__name__}")
    pairs = {}
    for token, bias in logit_bias.items():
        if isinstance(token, (bool, np.bool_)) or not isinstance(token, (int, np.integer)) \
                or not 0 <= token < vocab_size:
            raise llaisys.LlaisysValueError(f"logit_bias: {token!r} is not a token id in [0, {vocab_size})")
        pairs[int(token)] = float(RULES["logit_bias"].check(bias, f"logit_bias[{int(token)}]"))
    return tuple(sorted(pairs.items()))


# generate's keyword arguments that take one number, with their checks (the CLI's flags)
PENALTY_FLAGS = {"repetition_penalty": check_repetition_penalty, "frequency_penalty": check_frequency_penalty,
                 "presence_penalty": check_presence_penalty}
