"""A plain stderr progress bar that stays silent for work that finishes in a moment."""

from __future__ import annotations

import sys
import time
from typing import TextIO


class Progress:
    """``update(n)`` as work is done; draws only once ``delay`` seconds have passed.

    ``enabled=None`` draws when stderr is a terminal; True always (after the delay); False never.
    """

    def __init__(self, total: int, label: str, enabled: bool | None = None, delay: float = 0.5,
                 stream: TextIO | None = None) -> None:
        self.total = max(int(total), 1)
        self.label = label
        self.stream = stream or sys.stderr
        if enabled is None:
            enabled = bool(getattr(self.stream, "isatty", lambda: False)())
        self.enabled = enabled
        self.delay = delay
        self.done = 0
        self.start = time.perf_counter()
        self._last_draw = 0.0
        self._drawn = False

    def update(self, n: int) -> None:
        self.done += n
        if not self.enabled:
            return
        now = time.perf_counter()
        if now - self.start >= self.delay and (now - self._last_draw >= 0.1 or self.done >= self.total):
            self._draw(now)

    def _draw(self, now: float) -> None:
        frac = min(self.done / self.total, 1.0)
        width = 30
        bar = "#" * int(frac * width) + "-" * (width - int(frac * width))
        gib = self.total / (1 << 30)
        self.stream.write(f"\r{self.label} [{bar}] {frac * 100:5.1f}% of {gib:.2f} GiB  {now - self.start:5.1f}s")
        self.stream.flush()
        self._drawn = True
        self._last_draw = now

    def close(self) -> None:
        if self._drawn:
            self._draw(time.perf_counter())
            self.stream.write("\n")
            self.stream.flush()

    def __enter__(self) -> "Progress":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
