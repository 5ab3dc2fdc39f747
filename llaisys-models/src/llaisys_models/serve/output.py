"""A sequence's text as its tokens arrive: incremental detokenization, then stop strings.

Text is only released once it can no longer become part of a stop string, so a client never
sees the start of a stop string that later completes (OpenAI leaves the stop string out).
"""

from __future__ import annotations

from ..tokenizer import IncrementalDecoder


class StopMatcher:
    """Finds the first stop string in a growing text, holding back a tail that may start one."""

    def __init__(self, stops):
        self.stops = tuple(s for s in stops if s)
        self._held = ""  # text not released yet: a suffix that is a prefix of some stop string

    def push(self, text: str) -> tuple[str, bool]:
        """Add text; return (text safe to release, whether a stop string was hit).
        After a hit the released text ends right before the stop string."""
        if not self.stops:
            return text, False
        pending = self._held + text
        hits = [i for i in (pending.find(s) for s in self.stops) if i >= 0]
        if hits:
            self._held = ""
            return pending[:min(hits)], True
        keep = max((n for s in self.stops for n in range(min(len(s) - 1, len(pending)), 0, -1)
                    if pending.endswith(s[:n])), default=0)
        self._held = pending[len(pending) - keep:] if keep else ""
        return pending[:len(pending) - keep], False

    def flush(self) -> str:
        """The held-back tail, at the end of the sequence (no stop string can complete any more)."""
        held, self._held = self._held, ""
        return held


class TextStream:
    """Token ids in, released text out: ``push(token)`` and, at the end, ``finish()``, each returning
    (text, whether a stop string was hit)."""

    def __init__(self, tokenizer, stops=()):
        self.decoder = IncrementalDecoder(tokenizer)
        self.stops = StopMatcher(stops)

    def push(self, token: int) -> tuple[str, bool]:
        return self.stops.push(self.decoder.push(token))

    def finish(self) -> tuple[str, bool]:
        """What is still held back once no more tokens come (a stop string may still complete in it)."""
        text, stopped = self.stops.push(self.decoder.finish())
        return (text, True) if stopped else (text + self.stops.flush(), False)
