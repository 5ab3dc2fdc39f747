"""How a sequence chooses its tokens: ``SamplingParams``, the per-step seed, and the choice itself.

Greedy decoding (top_k=1 or temperature=0) takes ``argmax``; anything else goes through the ``sample`` op
with a seed derived from (seed, step), so a seeded sequence draws the same tokens on every device and
whatever else shares its forward passes.
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, NamedTuple

import llaisys

from .penalties import PenaltyBuffers, TokenCounts
from .sampling_rules import MASK64, RULES

if TYPE_CHECKING:
    from .grammar import TokenMask


@dataclasses.dataclass(frozen=True)
class SamplingParams:
    """A sequence's sampling and stopping rules (checked by the caller, by sampling_rules.RULES: ``check_sampling``
    and the penalties' checks for the Python API, serve/openai/sampling.py for requests)."""
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
    thinking: object = None  # a thinking.ThinkingRule (a reasoning model's thinking: budget, grammar after it), or None
    lora: object = None  # the lora.LoRAAdapter the sequence runs under (the model's loaded adapter), or None: the base

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
               counts: TokenCounts | None = None, matcher: TokenMask | None = None) -> int:
        """The next token from 1-D logits: argmax when greedy, else the sample op (a top_k beyond the
        vocabulary means all of it, as in HF, and never reaches the op as an integer it cannot hold).
        ``counts``: the sequence's tokens so far, for its penalties and logit_bias (applied to ``logits`` in
        place first); None where its parameters have none. A ``matcher`` (grammar.Matcher) then masks the
        logits (in place: what the grammar forbids stays forbidden whatever its bias); advancing it past the
        token is the caller's (the scheduler's commit, when it keeps the token)."""
        if counts is not None:
            self._penalties.apply(logits, counts)
        if matcher is not None:
            matcher.mask(logits)  # the grammar's forbidden tokens to -inf, on the logits' device
        if params.greedy:
            llaisys.ops.argmax(self._chosen, self._value, logits)
        else:
            llaisys.ops.sample(self._chosen, logits, params.temperature, min(params.top_k, logits.shape[0]),
                               params.top_p, seed)
        return int(self._chosen.numpy()[0])

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


class Verifier:
    """Decides a verify step's tokens on one device (the ``Sampler``'s argmax / sample buffers): the point-mass
    rejection rule of speculative/verify.py, each row chosen as plain decoding would choose it."""

    def __init__(self, sampler: Sampler) -> None:
        self.sampler = sampler

    def verify(self, rows: list[llaisys.Tensor], drafts: list[int], params: SamplingParams, seed: int,
               n: int, counts: TokenCounts | None = None, matcher: TokenMask | None = None,
               logprobs: list[TokenLogprob] | None = None) -> list[int]:
        """The new tokens of a sequence that drafted ``drafts`` (maybe none): ``rows`` are the 1-D logits of
        its last len(drafts)+1 rows, ``n`` the index of its next generated token, ``counts`` its tokens so far
        (penalties, logit_bias) or None. Returns the drafts that matched and the model's token after them (1 to
        len(drafts)+1 tokens). Row i is penalized as plain decoding would penalize token n+i: with the drafts
        kept before it counted (for the call only: the scheduler counts what it keeps). A grammar ``matcher``
        masks the one row of a sequence that drafted nothing (the scheduler never drafts for a sequence that has
        one; it advances the matcher past the token when it keeps it). ``logprobs``: a list that gets each
        returned token's ``TokenLogprob`` (from its own row) where ``params.logprobs`` is set."""
        if len(rows) != len(drafts) + 1:
            raise ValueError(f"{len(rows)} logit rows for {len(drafts)} drafted tokens")
        if matcher is not None and drafts:
            raise ValueError("a grammar constrains one token at a time: a sequence with one drafts nothing")
        out: list[int] = []
        try:
            for i, row in enumerate(rows):
                if counts is not None and out:
                    counts.add(out[-1])
                token = self.sampler.select(row, params, step_seed(seed, n + i), counts, matcher)
                out.append(token)
                if logprobs is not None and params.logprobs is not None:
                    logprobs.append(self.sampler.logprobs(row, token, params))
                if i == len(drafts) or token != drafts[i]:
                    break
        finally:
            if counts is not None:
                for token in out[:-1]:
                    counts.add(token, -1)
        return out


# -- argument checks (before any value reaches a C type): sampling_rules.RULES, the server's rules too ------------

def check_max_new_tokens(max_new_tokens: object) -> None:
    RULES["max_new_tokens"].check(max_new_tokens)


def check_sampling(top_k: object, top_p: object, temperature: object, seed: object) -> None:
    """``generate``'s sampling arguments (seed None = random): a huge top_k must not wrap to greedy, an
    infinite temperature fails here."""
    for name, value in (("top_k", top_k), ("top_p", top_p), ("temperature", temperature)):
        RULES[name].check(value)
    if seed is not None:
        RULES["seed"].check(seed)
