"""KV caches kept between requests, so a conversation's next turn reuses its cached prefix.

The pool holds up to ``slots`` dense KV caches (``model.new_cache()``), each remembering the
token ids it stores. A new sequence takes the idle cache that shares the longest token prefix
with its prompt (a follow-up turn starts with the previous turn's prompt and reply; an edited
last message shares everything before the edit), keeps that prefix and computes only the rest.
With no useful match it takes the least recently used idle cache and starts it empty.

The paged KV cache of continuous batching replaces this with block-level prefix sharing; the
engine only sees ``acquire`` / ``release``.
"""

from __future__ import annotations

from ..kv_cache import KVCache


def common_prefix(a, b) -> int:
    n = 0
    for x, y in zip(a, b):
        if x != y:
            break
        n += 1
    return n


class KVPool:
    def __init__(self, model, slots: int, reuse: bool = True):
        if slots < 1:
            raise ValueError(f"the KV pool needs at least one slot, got {slots}")
        self.model = model
        self.slots = slots
        self.reuse = reuse  # may be switched while the engine runs: read once per admitted sequence
        self._caches: list[KVCache] = []  # every cache made so far (at most ``slots``)
        self._idle: list[KVCache] = []  # least recently used first
        self._busy = 0

    @property
    def available(self) -> bool:
        return self._busy < self.slots

    def acquire(self, prompt: list[int]) -> tuple[KVCache, int]:
        """A cache for a sequence with this prompt, and how many prompt tokens it already holds.

        At least the prompt's last token is always left to compute: its logits choose the first
        new token.
        """
        if not self.available:
            raise RuntimeError("no free KV cache slot")  # the engine admits only while one is available
        limit = len(prompt) - 1
        best, reused = None, 0
        if self.reuse:
            for cache in self._idle:
                n = min(common_prefix(cache.tokens, prompt), limit)
                if n > reused:
                    best, reused = cache, n
        if best is None and len(self._caches) < self.slots:
            best = self.model.new_cache()
            self._caches.append(best)
        else:
            best = best if best is not None else self._idle[0]
            self._idle.remove(best)
        best.truncate(reused)
        self._busy += 1
        return best, reused

    def release(self, cache: KVCache, keep: bool = True) -> None:
        """Give a sequence's cache back; ``keep=False`` forgets its content (after an error)."""
        if not keep:
            cache.reset()
        self._busy -= 1
        self._idle.append(cache)  # most recently used last

    @property
    def nbytes(self) -> int:
        """Device bytes held by every cache of the pool."""
        return sum(c.nbytes for c in self._caches)
