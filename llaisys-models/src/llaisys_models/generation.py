"""Token generation on top of a model's ``forward``: prefill the prompt once, then one token per step.

The model provides ``_forward(ids) -> logits [1, vocab]`` (appending to its KV cache; the
caller holds ``lock``), ``lock`` (a ModelLock), ``cache``, ``config``, ``device`` and
``eos_token_ids``. Greedy decoding (top_k=1 or
temperature=0) takes ``argmax``; anything else goes through the ``sample`` op with a
seed derived from (seed, step), so a seeded run repeats exactly on every device.
"""

from __future__ import annotations

import dataclasses
import math
import secrets
import time
from collections.abc import Iterator, Sequence

import numpy as np

import llaisys

MASK64 = (1 << 64) - 1


@dataclasses.dataclass
class GenerationStats:
    prompt_tokens: int = 0  # tokens run by the prefill (the prompt minus any reused cache prefix)
    prefill_seconds: float = 0.0  # prefill forward + choosing the first new token
    new_tokens: int = 0
    decode_seconds: float = 0.0  # the decode steps: one forward + choice per token after the first

    @property
    def prefill_tokens_per_second(self) -> float:
        return self.prompt_tokens / self.prefill_seconds if self.prefill_seconds else 0.0

    @property
    def decode_tokens_per_second(self) -> float:
        steps = max(self.new_tokens - 1, 0)
        return steps / self.decode_seconds if self.decode_seconds else 0.0


def step_seed(seed: int, step: int) -> int:
    """A 64-bit seed for one step: splitmix64 of (seed, step), so steps draw independently."""
    z = (seed + (step + 1) * 0x9E3779B97F4A7C15) & MASK64
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & MASK64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & MASK64
    return z ^ (z >> 31)


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
    """The sampling arguments of ``generate`` (seed None = random), checked in Python before any of them
    reaches a C type: a huge top_k must not wrap to greedy, an infinite temperature fails here."""
    _check_number("top_k", top_k, 0, integer=True)
    _check_number("top_p", top_p, 0, 1, low_open=True)
    _check_number("temperature", temperature, 0)
    if seed is not None:
        _check_number("seed", seed, 0, MASK64, integer=True)


class GenerationMixin:
    """``generate`` and ``stream_generate`` for a model with ``forward`` and a ``cache``."""

    last_stats: GenerationStats | None = None

    def check_input_ids(self, input_ids) -> list[int]:
        """The prompt as a list of ints, each a valid token id (else a LlaisysValueError naming it)."""
        if isinstance(input_ids, llaisys.Tensor):
            input_ids = input_ids.numpy()
        if isinstance(input_ids, np.ndarray):
            if input_ids.ndim != 1 or input_ids.dtype.kind not in "iu":
                raise llaisys.LlaisysValueError(f"input_ids must be a 1-D integer array, got shape "
                                                f"{input_ids.shape} of {input_ids.dtype}")
            input_ids = input_ids.tolist()
        if isinstance(input_ids, (str, bytes)) or not isinstance(input_ids, Sequence):
            raise llaisys.LlaisysValueError(f"input_ids must be a sequence of token ids, got "
                                            f"{type(input_ids).__name__} (tokenize text first)")
        ids = list(input_ids)
        if not ids:
            raise llaisys.LlaisysValueError("input_ids is empty: the prompt needs at least one token")
        vocab = self.config.vocab_size
        for i, t in enumerate(ids):
            if isinstance(t, bool) or not isinstance(t, (int, np.integer)) or not 0 <= t < vocab:
                raise llaisys.LlaisysValueError(f"input_ids[{i}] = {t!r} is not a token id in [0, {vocab})")
        return [int(t) for t in ids]

    @property
    def context_length(self) -> int:
        """The most positions (prompt + new tokens) one sequence may take."""
        window = self.config.sliding_window
        return min(self.config.max_position_embeddings, window or self.config.max_position_embeddings)

    def check_length(self, total: int) -> None:
        limit = self.config.max_position_embeddings
        if total > limit:
            raise llaisys.LlaisysValueError(f"prompt + max_new_tokens = {total} positions exceed the model's "
                                            f"max_position_embeddings = {limit}")
        window = self.config.sliding_window
        if window is not None and total > window:
            raise llaisys.LlaisysValueError(f"{total} positions exceed the sliding window of {window}, which "
                                            f"llaisys does not implement")

    def generate(self, input_ids, max_new_tokens: int, top_k: int = 1, top_p: float = 1.0,
                 temperature: float = 1.0, seed: int | None = None, *, eos_token_ids=None,
                 reuse_cache: bool = False) -> list[int]:
        """Prompt + new tokens; stops right after an EOS token (which is included).

        top_k=1 (or temperature=0) is greedy. ``eos_token_ids=()`` never stops early.
        ``reuse_cache=True`` keeps the part of the KV cache that matches the prompt's start.
        """
        ids = self.check_input_ids(input_ids)
        return ids + list(self.stream_generate(ids, max_new_tokens, top_k, top_p, temperature, seed,
                                               eos_token_ids=eos_token_ids, reuse_cache=reuse_cache))

    def stream_generate(self, input_ids, max_new_tokens: int, top_k: int = 1, top_p: float = 1.0,
                        temperature: float = 1.0, seed: int | None = None, *, eos_token_ids=None,
                        reuse_cache: bool = False) -> Iterator[int]:
        """Yield each new token as soon as it is chosen (the EOS token included). Arguments are
        checked here, before the first token is asked for."""
        ids = self.check_input_ids(input_ids)
        check_max_new_tokens(max_new_tokens)
        check_sampling(top_k, top_p, temperature, seed)
        if seed is None:
            seed = secrets.randbits(63)
        self.check_length(len(ids) + max_new_tokens)
        eos = set(self.eos_token_ids if eos_token_ids is None else eos_token_ids)
        greedy = top_k == 1 or temperature == 0
        return self._stream(ids, int(max_new_tokens), greedy, int(top_k), float(top_p), float(temperature),
                            int(seed), eos, reuse_cache)

    def generate_batch(self, prompts, max_new_tokens: int, top_k: int = 1, top_p: float = 1.0,
                       temperature: float = 1.0, seed=None, **options) -> list[list[int]]:
        """``generate`` for a list of prompts at once (continuous batching: one forward per step for all of
        them); each result equals ``generate(prompt, ...)`` with the same seed. ``seed`` may be one int or
        one per prompt; options: ``eos_token_ids``, ``kv_memory`` (bytes), ``max_running``,
        ``max_batch_tokens`` (see ``scheduler.generate_batch``)."""
        from .scheduler import generate_batch

        return generate_batch(self, prompts, max_new_tokens, top_k, top_p, temperature, seed, **options)

    def _stream(self, ids, max_new_tokens, greedy, top_k, top_p, temperature, seed, eos, reuse_cache):
        if max_new_tokens == 0:
            self.last_stats = GenerationStats()
            return
        with self.lock.hold("stream_generate"):  # until the last token, or until the stream is closed
            stats = self.last_stats = GenerationStats()
            if reuse_cache:
                self.cache.truncate(_common_prefix(self.cache.tokens, ids, limit=len(ids) - 1))
            else:
                self.cache.release()
            self.reserve(self.cache, len(ids) + max_new_tokens - 1)
            pending = ids[len(self.cache):]
            for step in range(max_new_tokens):
                t0 = time.perf_counter()
                logits = self._forward(pending)
                token = self.select(logits.view(logits.shape[-1]), greedy, top_k, top_p, temperature,
                                    step_seed(seed, step))
                elapsed = time.perf_counter() - t0
                if step == 0:
                    stats.prompt_tokens, stats.prefill_seconds = len(pending), elapsed
                else:
                    stats.decode_seconds += elapsed
                stats.new_tokens += 1
                yield token
                if token in eos:
                    return
                pending = [token]

    def select(self, logits: llaisys.Tensor, greedy: bool, top_k: int, top_p: float, temperature: float,
               seed: int) -> int:
        """The next token from 1-D logits: argmax when greedy, else the sample op (a top_k beyond the
        vocabulary means all of it, as in HF, and never reaches the op as an integer it cannot hold)."""
        if self._chosen is None:
            self._chosen = llaisys.empty((1,), llaisys.int64, self.device)
            self._chosen_value = llaisys.empty((1,), self.dtype, self.device)
        if greedy:
            llaisys.ops.argmax(self._chosen, self._chosen_value, logits)
        else:
            llaisys.ops.sample(self._chosen, logits, temperature, min(top_k, logits.shape[0]), top_p, seed)
        return int(self._chosen.numpy()[0])

    _chosen: llaisys.Tensor | None = None


def _common_prefix(a: list[int], b: list[int], limit: int) -> int:
    n = 0
    for x, y in zip(a, b):
        if x != y or n >= limit:
            break
        n += 1
    return n
