"""A sequence's text as its tokens arrive: incremental detokenization, then stop strings.

Text is only released once it can no longer become part of a stop string, so a client never
sees the start of a stop string that later completes (OpenAI leaves the stop string out).
"""

from __future__ import annotations

from collections.abc import Iterable

from .tokenizer import IncrementalDecoder, Tokenizer


class StopMatcher:
    """Finds the first stop string in a growing text, holding back a tail that may start one.

    Each push costs time in proportion to the new text (amortized; at worst the new text plus the
    longest stop string): every stop string is matched by a Knuth-Morris-Pratt automaton that reads
    each character of the output once, instead of comparing every prefix of every stop string
    against the text's end at each token, which cost the square of a stop string's length per token.
    """

    def __init__(self, stops: Iterable[str]) -> None:
        self._automata = [_StopAutomaton(s) for s in stops if s]
        self._held = ""  # text not released yet: the longest suffix that is a prefix of some stop string

    def push(self, text: str) -> tuple[str, bool]:
        """Add text; return (text safe to release, whether a stop string was hit).
        After a hit the released text ends right before the stop string (of those that occur in the
        held text and ``text``, the one that begins first)."""
        if not self._automata:
            return text, False
        pending = self._held + text
        start = None  # where the earliest stop string found in ``pending`` begins
        for end, char in enumerate(text, len(self._held) + 1):
            for automaton in self._automata:
                if automaton.feed(char):
                    begin = end - len(automaton.stop)
                    start = begin if start is None else min(start, begin)
        if start is not None:
            self._held = ""
            return pending[:start], True
        keep = max(automaton.matched for automaton in self._automata)  # <= len(pending)
        self._held = pending[len(pending) - keep:] if keep else ""
        return pending[:len(pending) - keep], False

    def flush(self) -> str:
        """The held-back tail, at the end of the sequence (no stop string can complete any more)."""
        held, self._held = self._held, ""
        for automaton in self._automata:
            automaton.matched = 0
        return held


class _StopAutomaton:
    """Knuth-Morris-Pratt matching of one stop string against a text fed a character at a time.

    ``matched`` is the length of the longest suffix of the text so far that is a proper prefix of the
    stop string. The failure table is built only as far as ``matched`` has reached, so a long stop
    string costs nothing up front, and each character fed costs O(1) amortized.
    """

    def __init__(self, stop: str) -> None:
        self.stop = stop
        self.matched = 0
        self._borders = [0]  # _borders[i]: the longest proper prefix of stop[:i + 1] that is also its suffix

    def feed(self, char: str) -> bool:
        """Advance by one character; True when the stop string ends with it."""
        stop, k = self.stop, self.matched
        while k and stop[k] != char:
            k = self._border(k - 1)
        if stop[k] == char:
            k += 1
        if k == len(stop):
            self.matched = self._border(k - 1)  # an occurrence may overlap the next one
            return True
        self.matched = k
        return False

    def _border(self, i: int) -> int:
        borders, stop = self._borders, self.stop
        while len(borders) <= i:  # the prefix function, extended to index i
            n, k = len(borders), borders[-1]
            while k and stop[k] != stop[n]:
                k = borders[k - 1]
            borders.append(k + 1 if stop[k] == stop[n] else k)
        return borders[i]


class TextStream:
    """Token ids in, released text out: ``push(token)`` and, at the end, ``finish()``, each returning
    (text, whether a stop string was hit). ``keep``: special tokens whose text is kept (tool-call markers)."""

    def __init__(self, tokenizer: Tokenizer, stops: Iterable[str] = (), keep: frozenset[int] = frozenset()) -> None:
        self.decoder = IncrementalDecoder(tokenizer, keep)
        self.stops = StopMatcher(stops)

    def push(self, token: int) -> tuple[str, bool]:
        return self.stops.push(self.decoder.push(token))

    def finish(self) -> tuple[str, bool]:
        """What is still held back once no more tokens come (a stop string may still complete in it)."""
        text, stopped = self.stops.push(self.decoder.finish())
        return (text, True) if stopped else (text + self.stops.flush(), False)
