"""A draft model: a small model of the target's tokenizer guesses the next tokens greedily.

The drafter keeps, per target sequence, a sequence in a KV pool of its own (no prefix caching). Each
``propose`` first brings it in step with the target's tokens: it keeps the longest common prefix
(``truncate``: rejected drafts' blocks go back), runs the tokens it lacks in one forward, then drafts k
tokens one forward each. ``release`` frees a finished sequence's blocks.
"""

from __future__ import annotations

import threading
import weakref
from typing import TYPE_CHECKING, Any

import llaisys

from ..runner import ModelRunner
from ..sequence import Sequence
from .drafters import Drafter

if TYPE_CHECKING:
    from ..kv_blocks import SequenceKV

BLOCK_SIZE = 16
FIRST_POOL_BLOCKS = 16
_drafters: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # draft model -> its drafter


class DraftModelDrafter(Drafter):
    """Drafts with ``model`` (greedy), whose token ids mean what the target's do."""

    def __init__(self, model: Any) -> None:  # a loaded model (families/causal_lm.py)
        self.model = model
        self.pool = model.new_kv_pool(num_blocks=FIRST_POOL_BLOCKS, block_size=BLOCK_SIZE, prefix_caching=False)
        self._sequences: dict[int, SequenceKV] = {}  # target sequence id -> its SequenceKV here
        self._lock = threading.Lock()  # the server's engine and generate() may share a draft model
        self.runner = ModelRunner(model, self.pool)  # its forwards and greedy choices (engine/runner.py)

    @classmethod
    def of(cls, model, target) -> DraftModelDrafter:
        """The drafter of ``model`` (one per draft model, kept as long as the model), checked against ``target``."""
        if model is target:
            raise llaisys.LlaisysValueError("the draft model is the target model itself; use a smaller model")
        if model.config.vocab_size != target.config.vocab_size:
            raise llaisys.LlaisysValueError(
                f"the draft model's vocabulary ({model.config.vocab_size} tokens) is not the target's "
                f"({target.config.vocab_size}): a draft model must share the target's tokenizer")
        drafter = _drafters.get(model)
        if drafter is None:
            drafter = _drafters[model] = cls(model)
        return drafter

    def __repr__(self) -> str:
        return f"DraftModelDrafter({self.model!r})"

    def propose(self, seq: Sequence, k: int) -> list[int]:
        tokens = seq.tokens
        room = min(self.model.context_length, self.model.config.max_position_embeddings)
        k = min(k, room - len(tokens))
        if k < 1:
            return []
        with self._lock:
            kv = self._sequences.get(seq.id)
            if kv is None:
                kv = self._sequences[seq.id] = self.pool.sequence()
            common = 0
            for a, b in zip(kv.tokens, tokens[:-1]):  # the last token is always run: its logits give d1
                if a != b:
                    break
                common += 1
            kv.truncate(common)
            drafts = []
            feed = tokens[common:]
            for _ in range(k):
                self.pool.reserve_growing(kv, len(kv) + len(feed))
                logits = self.runner.forward([(kv, feed)], [True])
                feed = [self.runner.greedy(logits.view(logits.shape[-1]))]
                drafts.append(feed[0])
            return drafts

    def release(self, seq) -> None:
        with self._lock:
            kv = self._sequences.pop(seq.id, None)
            if kv is not None:
                kv.release()

    def close(self) -> None:
        """Free every sequence's blocks and the pool's captured decode steps."""
        with self._lock:
            for kv in self._sequences.values():
                kv.release()
            self._sequences.clear()
        self.model.release_kv_pool(self.pool)
