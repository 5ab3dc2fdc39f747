"""A sequence: one request's tokens, KV blocks and state, as the scheduler keeps it and the runner reads it.

The scheduler (scheduler.py) admits, plans, extends and finishes sequences; the model runner (runner.py) reads
what a sequence's choice needs (its parameters, seed, token counts for penalties, grammar matcher, tokens so far)
and writes only its KV blocks' contents.
"""

from __future__ import annotations

import itertools
import secrets
import time
from typing import TYPE_CHECKING, cast

from .kv_blocks import SequenceKV
from .penalties import TokenCounts
from .sampling import MASK64, SamplingParams, TokenLogprob
from .thinking import ThinkingState

if TYPE_CHECKING:
    from ..lora.adapter import LoRAAdapter
    from .grammar import Matcher, TokenMask
    from .speculative.config import Speculation
    from .thinking import ThinkingRule

_ids = itertools.count()


class Sequence:
    """One request in the scheduler: its tokens so far (prompt + generated), its KV blocks, its state."""

    def __init__(self, prompt: list[int], params: SamplingParams, eos: frozenset[int], *, scope: str = "",
                 tag: object = None, arrival_time: float | None = None, priority: int = 0,
                 group: int | None = None) -> None:
        self.id = next(_ids)  # arrival order, kept through preemption: "newest" means the largest id
        self.priority = priority  # lower values are scheduled first (vLLM's convention; engine/fairness.py)
        # the request it belongs to, for fair scheduling (engine/fairness.py): its own id, or its parent's group
        # (a fork: the n choices of one request are one group) or the caller's (the prompts of one request)
        self.group = self.id if group is None else group
        self.tokens = list(prompt)
        self.prompt_len = len(prompt)
        self.params = params
        self.seed = params.seed & MASK64 if params.seed is not None else secrets.randbits(63)
        self.eos = eos
        self.scope = scope  # whose cached prefix blocks this sequence may reuse (a server's tenant)
        self.adapter = cast("LoRAAdapter | None", params.lora)  # its LoRA adapter (prefix blocks are keyed by it too)
        self.tag = tag  # the caller's object
        self.arrival_time = time.perf_counter() if arrival_time is None else arrival_time
        self.kv: SequenceKV | None = None  # its blocks while admitted
        self.reused: int | None = None  # prompt tokens found in the cache at the first admission
        self.first_token_time: float | None = None
        self.preemptions = 0
        self.counts = TokenCounts.of(prompt, params)  # its tokens for penalties / logit_bias, or None
        # each generated token's sampling.TokenLogprob where params.logprobs is set, else None
        self.logprobs: list[TokenLogprob] | None = [] if params.logprobs is not None else None
        # speculative.Speculation, or None: one token per step (SamplingParams types its field as object)
        self.speculation = cast("Speculation | None", params.speculation)
        # tokens to draft next (adapted to what was kept, up to the Speculation's num_tokens)
        self.draft_length = self.speculation.num_tokens if self.speculation is not None else 0
        self.draft_tokens = 0  # tokens drafted for this sequence, and how many of them were kept
        self.accepted_tokens = 0
        self.draft_misses = 0  # verify steps in a row that kept no draft, and steps left without drafting
        self.draft_pause = 0
        self.finish_reason: str | None = None  # "stop", "length", "cancelled", ... once finished
        self.error: Exception | None = None  # why it failed alone (finish_reason "error"; Scheduler.failed)
        self.forks: list[Sequence] = []  # sequences of this prompt waiting to start from its KV blocks
        self.parent: Sequence | None = None  # the sequence this one waits for, while it does
        self.matcher: Matcher | None = None  # its position in params.grammar (structured output), set by the scheduler
        # its progress through a reasoning model's thinking (params.thinking), or None; the grammar waits for its end
        rule = cast("ThinkingRule | None", params.thinking)
        self.thinking = ThinkingState(rule) if rule is not None else None

    @property
    def num_generated(self) -> int:
        return len(self.tokens) - self.prompt_len

    @property
    def pending(self) -> int:
        """Tokens whose keys/values are not in the cache yet (the next forward's input)."""
        return len(self.tokens) - len(self.kv) if self.kv is not None else len(self.tokens)

    @property
    def grammar(self) -> TokenMask | None:
        """The matcher that constrains its next token: none while its thinking is open (structured outputs
        constrain the answer only); where the first token may open the thinking, the matcher with that tag allowed
        beside what the grammar allows."""
        thinking = self.thinking
        if thinking is None or self.matcher is None:
            return self.matcher
        if thinking.open:
            return None
        return self.matcher.also_allowing(thinking.rule.start_ids) if thinking.may_open else self.matcher

    @property
    def finished(self) -> bool:
        return self.finish_reason is not None
