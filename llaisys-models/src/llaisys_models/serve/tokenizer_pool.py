"""The prompt tokenizers: copies of the HTTP side's tokenizer, each owned by one worker thread.

A HF fast tokenizer raises "Already borrowed" when two threads use one instance, and one instance behind a lock let
a single long prompt hold every other request up for its whole tokenization (seconds). Long prompts have threads of
their own (``run(..., long=True)``; serve/openai/prompts.py decides which are), so however many of them are being
tokenized, a short prompt waits at most for other short ones.
"""

from __future__ import annotations

import asyncio
import copy
import queue
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

T = TypeVar("T")


class PromptTokenizers:
    """Copies of ``tokenizer`` on ``short_threads`` threads for short prompts and ``long_threads`` for long ones."""

    def __init__(self, tokenizer: Any, short_threads: int = 1, long_threads: int = 2):
        copies: queue.SimpleQueue = queue.SimpleQueue()
        copies.put(tokenizer)
        for _ in range(short_threads + long_threads - 1):
            copies.put(copy.deepcopy(tokenizer))
        local = threading.local()

        def take_copy() -> None:  # each worker thread, once, when it starts
            local.tokenizer = copies.get_nowait()

        self._local = local
        self._short = ThreadPoolExecutor(short_threads, "llaisys-tokenize", take_copy)
        self._long = ThreadPoolExecutor(long_threads, "llaisys-tokenize-long", take_copy)

    async def run(self, fn: Callable[[Any], T], long: bool) -> T:
        """``fn(tokenizer)`` on a worker thread, with that thread's copy."""
        executor = self._long if long else self._short
        return await asyncio.get_running_loop().run_in_executor(executor, lambda: fn(self._local.tokenizer))

    def shutdown(self) -> None:
        for executor in (self._short, self._long):
            executor.shutdown(wait=False, cancel_futures=True)
