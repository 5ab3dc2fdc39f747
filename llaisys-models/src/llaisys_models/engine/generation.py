"""``generate``, ``stream_generate`` and ``generate_batch``: runs of the scheduler (scheduler.py).

A model keeps one ``Generator`` for ``generate`` / ``stream_generate``: a KV pool of its own, with prefix
caching (a chat's next turn, or the same prompt again, computes only what the cache does not hold), and a
scheduler over it that runs one call at a time: calls from several threads take turns, and the thread whose
``stream_generate`` is still open gets a ``ModelBusyError`` if it starts another (it would wait for itself).
``generate_batch`` runs its prompts together through a scheduler and pool of their own.
"""

from __future__ import annotations

import contextlib
import dataclasses
import threading
import time
from collections.abc import Generator as PyGenerator
from collections.abc import Iterator
from typing import TYPE_CHECKING

import llaisys

from ..errors import ModelBusyError
from .grammar import Grammar
from .penalties import check_frequency_penalty, check_logit_bias, check_presence_penalty, check_repetition_penalty
from .sampling import SamplingParams, check_max_new_tokens, check_sampling
from .scheduler import Scheduler, Sequence
from .speculative import resolve as resolve_speculation
from .thinking import ThinkingRule

if TYPE_CHECKING:
    from ..families.config import ModelConfig
    from ..lora.adapter import LoRAAdapter
    from .kv_cache import KVPool
    from .step_inputs import Batch

BLOCK_SIZE = 16
FIRST_POOL_TOKENS = 256  # the model's own pool at first use; it grows when a sequence needs more
# On the CPU a long prompt is read in forwards of this many tokens: the work buffers (the 1.5B shape's in f32:
# 143 KiB a row) then hold 256 rows, not the prompt's length (75 MiB at 512 tokens), and the weights, re-read
# once per chunk, cost ~1% of a chunk's time. Other devices read a prompt in one forward.
CPU_PREFILL_CHUNK = 256


@dataclasses.dataclass
class GenerationStats:
    prompt_tokens: int = 0  # tokens run by the prefill (the prompt minus any reused cache prefix)
    prefill_seconds: float = 0.0  # prefill forwards + choosing the first new token
    new_tokens: int = 0
    decode_seconds: float = 0.0  # the decode steps: one forward + choice per token after the first
    draft_tokens: int = 0  # speculative decoding: tokens drafted, and how many of them the model kept
    accepted_tokens: int = 0
    first_token_seconds: float = 0.0  # time to first token: from the start of the run (the model's, not a queue's)
    started: float = dataclasses.field(default_factory=time.perf_counter, repr=False)  # when the call came

    @property
    def prefill_tokens_per_second(self) -> float:
        return self.prompt_tokens / self.prefill_seconds if self.prefill_seconds else 0.0

    @property
    def decode_tokens_per_second(self) -> float:
        steps = max(self.new_tokens - 1, 0)
        return steps / self.decode_seconds if self.decode_seconds else 0.0


def run(scheduler: Scheduler, seq: Sequence, stats: GenerationStats) -> Iterator[int]:
    """Step ``scheduler`` until ``seq`` finishes, yielding its tokens (the scheduler runs nothing else)."""
    try:
        while not seq.finished:
            t0 = time.perf_counter()
            events = scheduler.step()
            scheduler.raise_failed()  # (its choice failed: the caller hears why)
            elapsed = time.perf_counter() - t0
            for _, token in events:
                if stats.new_tokens == 0:
                    stats.prompt_tokens = seq.prompt_len - (seq.reused or 0)
                    stats.first_token_seconds = time.perf_counter() - stats.started
                stats.new_tokens += 1
                yield token
            if stats.new_tokens <= 1:
                stats.prefill_seconds += elapsed
            else:
                stats.decode_seconds += elapsed
    finally:
        stats.draft_tokens, stats.accepted_tokens = seq.draft_tokens, seq.accepted_tokens
        scheduler.finish(seq)  # a no-op once finished; frees the blocks of a stream closed early


class Generator:
    """The model's own scheduler and KV pool, one call at a time."""

    def __init__(self, model):
        self.model = model
        # (a block table, and so blocks, for each of the model's layer groups: kv_cache.layer_groups)
        self.pool = model.new_kv_pool(num_blocks=-(-FIRST_POOL_TOKENS // BLOCK_SIZE) * len(model.kv_layer_groups),
                                      block_size=BLOCK_SIZE)
        # nothing else runs beside the one sequence: its prompt is read in one forward, or in chunks on the CPU
        chunk = CPU_PREFILL_CHUNK if model.device.type == "cpu" else 1 << 62
        self.scheduler = Scheduler(model, self.pool, max_running=1, max_batch_tokens=chunk)
        self._lock = threading.Lock()
        self._owner: int | None = None

    @contextlib.contextmanager
    def hold(self, what: str):
        me = threading.get_ident()
        if self._owner == me:
            raise ModelBusyError(f"{what}: this thread is already running the model (a stream_generate not "
                                 f"finished); finish or close() the stream first, or load a second model")
        with self._lock:
            self._owner = me
            try:
                yield
            finally:
                self._owner = None

    def stream(self, ids: list[int], params: SamplingParams) -> PyGenerator[int, None, None]:
        with self.hold("stream_generate"):  # until the last token, or until the stream is closed
            stats = self.model.last_stats = GenerationStats()
            self.pool.prefix_caching = self.model.numerics == "exact"  # a benchmark may switch numerics
            total = len(ids) + params.max_tokens
            if total > self.pool.capacity_tokens:  # grow, at least doubling
                blocks = -(-total // self.pool.block_size) * self.pool.num_groups
                self.pool.grow(max(blocks, 2 * self.pool.num_blocks))
            seq = self.scheduler.add(ids, params)
            yield from run(self.scheduler, seq, stats)


class GenerationMixin:
    """What a model (causal_lm.CausalLM) offers for generating: every path is a run of the scheduler."""

    last_stats: GenerationStats | None = None
    _generator: Generator | None = None

    if TYPE_CHECKING:  # what the model (causal_lm.CausalLM) provides: a scheduler.SchedulerModel
        config: ModelConfig
        device: llaisys.Device
        dtype: llaisys.DType
        eos_token_ids: tuple[int, ...]
        numerics: str

        @property
        def context_length(self) -> int: ...

        def check_length(self, total: int) -> None: ...

        def check_input_ids(self, input_ids: object) -> list[int]: ...

        @property
        def kv_layer_groups(self) -> tuple: ...

        def new_kv_pool(self, num_blocks: int | None = None, *, memory: int | None = None, block_size: int = 16,
                        prefix_caching: bool = True) -> KVPool: ...

        def release_kv_pool(self, pool: KVPool) -> None: ...

        def forward_batch(self, pool: KVPool, batch: Batch, logits_of: list[int] | None = None) -> llaisys.Tensor: ...

        def lora_for(self, name: str | None) -> LoRAAdapter | None: ...

    @property
    def generator(self) -> Generator:
        if self._generator is None:
            self._generator = Generator(self)
        return self._generator

    def generate(self, input_ids, max_new_tokens: int, top_k: int = 1, top_p: float = 1.0,
                 temperature: float = 1.0, seed: int | None = None, *, eos_token_ids=None, speculative=None,
                 num_speculative_tokens: int | None = None, grammar=None, thinking=None, lora: str | None = None,
                 **penalties) -> list[int]:
        """Prompt + new tokens; stops right after an EOS token (which is included).

        top_k=1 (or temperature=0) is greedy. ``eos_token_ids=()`` never stops early. A prompt that starts
        like an earlier one reuses its cached keys and values (the same tokens as computing them).
        ``speculative``: "ngram" (prompt lookup), a draft model (a loaded model of the same tokenizer) or a
        ``speculative.Drafter`` drafts up to ``num_speculative_tokens`` (default 4) tokens a step, verified
        in one forward: greedy tokens are the same as without, sampled ones have the same distribution.
        Repetition control, applied to the logits before each choice (penalties.py): ``repetition_penalty``
        (HF transformers': > 0, 1 = off, over the prompt and the new tokens), ``frequency_penalty`` and
        ``presence_penalty`` (OpenAI's: in [-2, 2], 0 = off, over the new tokens), ``logit_bias`` ({token id:
        bias in [-100, 100]}: -100 bans a token, +100 forces it).
        ``grammar``: a ``grammar.Grammar`` (e.g. ``Grammar.json_schema(tokenizer, schema)``) the new tokens must
        match; generation stops when it is complete (structured outputs; not with ``speculative``).
        ``thinking``: a reasoning model's ``thinking.ThinkingRule`` for this prompt (text/reasoning.py's
        ``parser.rule(prompt, budget)``): its thinking tokens are at most the rule's budget, after which the
        rule's end of the thinking is appended, and the ``grammar`` applies only after the thinking.
        ``lora``: the name of a loaded LoRA adapter (``load_lora``) to generate under; None: the base model.
        """
        ids = self.check_input_ids(input_ids)
        return ids + list(self.stream_generate(ids, max_new_tokens, top_k, top_p, temperature, seed,
                                               eos_token_ids=eos_token_ids, speculative=speculative,
                                               num_speculative_tokens=num_speculative_tokens, grammar=grammar,
                                               thinking=thinking, lora=lora, **penalties))

    def stream_generate(self, input_ids, max_new_tokens: int, top_k: int = 1, top_p: float = 1.0,
                        temperature: float = 1.0, seed: int | None = None, *, eos_token_ids=None,
                        speculative=None, num_speculative_tokens: int | None = None, grammar=None,
                        thinking=None, lora: str | None = None, **penalties) -> PyGenerator[int, None, None]:
        """Yield each new token as soon as it is chosen (the EOS token included; a verify step of speculative
        decoding yields several at once). Arguments are checked here, before the first token is asked for;
        ``thinking``, ``lora``, ``penalties``: as ``generate``."""
        ids = self.check_input_ids(input_ids)
        params = self._params(max_new_tokens, top_k, top_p, temperature, seed, eos_token_ids,
                              resolve_speculation(speculative, num_speculative_tokens, self), grammar,
                              thinking=thinking, lora=self.lora_for(lora), **penalties)
        self.check_length(len(ids) + params.max_tokens)
        return self.generator.stream(ids, params)

    def generate_batch(self, prompts, max_new_tokens: int, top_k: int = 1, top_p: float = 1.0,
                       temperature: float = 1.0, seed=None, *, eos_token_ids=None, kv_memory: int | None = None,
                       max_running: int | None = None, max_batch_tokens: int = 128, speculative=None,
                       num_speculative_tokens: int | None = None, grammar=None, lora=None,
                       **penalties) -> list[list[int]]:
        """``generate`` for a list of prompts at once (continuous batching: one forward per step for all of
        them); each result equals ``generate(prompt, ...)`` with the same seed. ``seed``: None (a random
        seed per prompt), one int for every prompt, or one per prompt. ``kv_memory``: the KV pool's bytes
        (None: room for every sequence at full length; less makes the scheduler preempt and recompute, with
        the same results). ``speculative``, ``num_speculative_tokens`` and the penalties (``repetition_penalty``,
        ``frequency_penalty``, ``presence_penalty``, ``logit_bias``): as ``generate``, for every prompt.
        ``grammar``: as ``generate``: one for every prompt, or a list with one (or None) per prompt. ``lora``: one
        adapter name (or None) for every prompt, or a list with one per prompt: the base model and any adapters in
        one batch (at most ``max_loras`` adapters run at once; the others wait their turn)."""
        prompts = [self.check_input_ids(p) for p in prompts]
        seeds = list(seed) if isinstance(seed, (list, tuple)) else [seed] * len(prompts)
        if len(seeds) != len(prompts):
            raise llaisys.LlaisysValueError(f"{len(seeds)} seeds for {len(prompts)} prompts")
        grammars = list(grammar) if isinstance(grammar, (list, tuple)) else [grammar] * len(prompts)
        if len(grammars) != len(prompts):
            raise llaisys.LlaisysValueError(f"{len(grammars)} grammars for {len(prompts)} prompts")
        names = list(lora) if isinstance(lora, (list, tuple)) else [lora] * len(prompts)
        if len(names) != len(prompts):
            raise llaisys.LlaisysValueError(f"{len(names)} LoRA adapter names for {len(prompts)} prompts")
        speculation = resolve_speculation(speculative, num_speculative_tokens, self)
        params = [self._params(max_new_tokens, top_k, top_p, temperature, s, eos_token_ids, speculation, gr,
                               lora=self.lora_for(name), **penalties) for s, gr, name in zip(seeds, grammars, names)]
        if not prompts or max_new_tokens == 0:
            return [list(p) for p in prompts]
        if kv_memory is None:
            blocks = sum(-(-(len(p) + max_new_tokens) // BLOCK_SIZE) for p in prompts) * len(self.kv_layer_groups)
            pool = self.new_kv_pool(num_blocks=blocks, block_size=BLOCK_SIZE)
        else:
            pool = self.new_kv_pool(memory=kv_memory, block_size=BLOCK_SIZE)
        scheduler = Scheduler(self, pool, max_running=max_running or len(prompts), max_batch_tokens=max_batch_tokens)
        sequences = [scheduler.add(p, ps) for p, ps in zip(prompts, params)]
        try:
            while scheduler.has_work:
                scheduler.step()
                scheduler.raise_failed()  # one prompt's choice failed: the call fails with its error
        finally:
            self.release_kv_pool(pool)
        return [seq.tokens for seq in sequences]

    def _params(self, max_new_tokens, top_k, top_p, temperature, seed, eos_token_ids, speculation=None,
                grammar=None, *, thinking=None, lora=None,
                repetition_penalty: float = 1.0, frequency_penalty: float = 0.0, presence_penalty: float = 0.0,
                logit_bias=None) -> SamplingParams:
        check_max_new_tokens(max_new_tokens)
        check_sampling(top_k, top_p, temperature, seed)
        if grammar is not None and not isinstance(grammar, Grammar):
            raise llaisys.LlaisysValueError(f"grammar must be a llaisys_models.engine.grammar.Grammar, got "
                                            f"{type(grammar).__name__}")
        if thinking is not None and not isinstance(thinking, ThinkingRule):
            raise llaisys.LlaisysValueError(f"thinking must be a llaisys_models.engine.thinking.ThinkingRule (a "
                                            f"reasoning parser's rule(prompt, budget)), got {type(thinking).__name__}")
        eos = None if eos_token_ids is None else frozenset(int(t) for t in eos_token_ids)
        return SamplingParams(int(max_new_tokens), float(temperature), float(top_p), int(min(top_k, 1 << 62)),
                              None if seed is None else int(seed), eos_token_ids=eos, speculation=speculation,
                              grammar=grammar, thinking=thinking, lora=lora,
                              repetition_penalty=check_repetition_penalty(repetition_penalty),
                              frequency_penalty=check_frequency_penalty(frequency_penalty),
                              presence_penalty=check_presence_penalty(presence_penalty),
                              logit_bias=check_logit_bias(logit_bias, self.config.vocab_size))
