"""The engine: one thread owns the model and turns queued requests into streamed tokens.

HTTP handlers (or any other caller) build a ``Request`` (prompt token ids, ``SamplingParams``,
an ``emit`` callback) and ``submit`` it; they never touch the model. The engine thread loops:

    admit      waiting requests, first come first served, while a KV cache slot is free
    step       every running sequence advances by one token (round robin: all streams progress)
    consume    each new token -> text (detokenized, stop strings) -> ``emit(Delta | Finished)``

``emit`` is called on the engine thread; ``AsyncStream`` turns it into an async iterator for
the HTTP side. A cancelled request (client gone) leaves at its next step. Anything a request
raises fails that request only (``Failed``); the engine keeps serving.

Continuous batching (the next step) replaces ``_forward`` — today one ``model.forward`` per
sequence — by one batched forward over all scheduled sequences, and the KV pool by a paged
cache; admission, per-sequence sampling (seeded per step, as ``model.generate``), output
processing and the request/event interface stay as they are.
"""

from __future__ import annotations

import asyncio
import collections
import dataclasses
import itertools
import logging
import secrets
import threading
import time

from ..generation import MASK64, step_seed
from .kv_pool import KVPool
from .metrics import EngineMetrics
from .output import TextStream

log = logging.getLogger("llaisys.serve")


@dataclasses.dataclass(frozen=True)
class SamplingParams:
    max_tokens: int  # new tokens at most (>= 1)
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0  # 0: all tokens; 1: greedy
    seed: int | None = None  # None: a random seed per request
    stop: tuple[str, ...] = ()

    @property
    def greedy(self) -> bool:
        return self.top_k == 1 or self.temperature == 0


@dataclasses.dataclass(frozen=True)
class Usage:
    prompt_tokens: int
    completion_tokens: int
    cached_tokens: int  # prompt tokens whose KV came from the cache instead of being computed


@dataclasses.dataclass(frozen=True)
class Delta:
    """New text of a sequence (may cover several tokens, or a token may add none)."""
    text: str


@dataclasses.dataclass(frozen=True)
class Finished:
    reason: str  # "stop" (EOS or a stop string), "length" (max_tokens), "cancelled"
    usage: Usage


@dataclasses.dataclass(frozen=True)
class Failed:
    message: str


_ids = itertools.count()


class Request:
    """What a caller submits. ``emit(event)`` is called on the engine thread with each ``Delta``,
    then exactly one ``Finished`` or ``Failed``."""

    def __init__(self, prompt: list[int], params: SamplingParams, emit):
        if not prompt:
            raise ValueError("a request needs at least one prompt token")
        self.id = next(_ids)
        self.prompt = list(prompt)
        self.params = params
        self.seed = params.seed & MASK64 if params.seed is not None else secrets.randbits(63)
        self.emit = emit
        self.arrival = time.perf_counter()
        self._cancelled = threading.Event()

    def cancel(self) -> None:
        """Ask the engine to drop this request at its next step (thread-safe, idempotent)."""
        self._cancelled.set()

    @property
    def cancelled(self) -> bool:
        return self._cancelled.is_set()


class Sequence:
    """A running request: its KV cache, the tokens still to feed, its text so far."""

    def __init__(self, request: Request, cache, reused: int, tokenizer):
        self.request = request
        self.cache = cache
        self.reused = reused  # prompt tokens already in ``cache``
        self.pending = request.prompt[reused:]  # fed by the next forward
        self.generated = 0
        self.text = TextStream(tokenizer, request.params.stop)


class EngineUnavailable(RuntimeError):
    """The engine is stopped or died; the message says why."""


class EngineBusy(RuntimeError):
    """The waiting queue is full."""


class Engine:
    """Serve one model from one thread. ``tokenizer`` is used on the engine thread only (detokenizing)."""

    def __init__(self, model, tokenizer, *, max_running: int = 8, kv_slots: int = 16, prefix_reuse: bool = True,
                 max_waiting: int = 256):
        if max_running < 1 or max_waiting < 1:
            raise ValueError("max_running and max_waiting must be >= 1")
        self.model = model
        self.tokenizer = tokenizer
        self.max_running = max_running
        self.max_waiting = max_waiting
        self.pool = KVPool(model, max(kv_slots, max_running), reuse=prefix_reuse)
        self.eos = frozenset(model.eos_token_ids)
        self.metrics = EngineMetrics()
        self._waiting: collections.deque[Request] = collections.deque()  # guarded by _cv
        self._running: list[Sequence] = []  # engine thread only
        self._cv = threading.Condition()
        self._stopping = False
        self._thread: threading.Thread | None = None
        self.error: str | None = None  # why the engine thread ended, if it died

    # -- the caller's side (any thread) ------------------------------------------------

    def start(self) -> Engine:
        self._thread = threading.Thread(target=self._run, name="llaisys-engine", daemon=True)
        self._thread.start()
        return self

    def stop(self, timeout: float | None = 30.0) -> None:
        with self._cv:
            self._stopping = True
            self._cv.notify()
        if self._thread is not None:
            self._thread.join(timeout)

    @property
    def alive(self) -> bool:
        return self._thread is not None and self._thread.is_alive() and not self._stopping

    def submit(self, request: Request) -> None:
        """Queue a request (requests queued before ``start`` wait for it)."""
        with self._cv:
            if self._stopping:
                raise EngineUnavailable(self.error or "the engine is stopped")
            if len(self._waiting) >= self.max_waiting:
                raise EngineBusy(f"{len(self._waiting)} requests are already waiting; try again later")
            self._waiting.append(request)
            self.metrics.requests_received += 1
            self._cv.notify()

    @property
    def waiting(self) -> int:
        return len(self._waiting)

    @property
    def running(self) -> int:
        return len(self._running)

    # -- the engine thread ---------------------------------------------------------------

    def _run(self) -> None:
        try:
            while self._wait_for_work():
                self._admit()
                self._step()
        except BaseException as e:  # a bug, not a request's fault: say so everywhere
            self.error = f"the engine stopped: {type(e).__name__}: {e}"
            log.exception("engine thread died")
        finally:
            reason = self.error or "the server is shutting down"
            for seq in self._running:
                seq.request.emit(Failed(reason))
            with self._cv:
                self._stopping = True
                waiting, self._waiting = list(self._waiting), collections.deque()
            for request in waiting:
                request.emit(Failed(reason))

    def _wait_for_work(self) -> bool:
        with self._cv:
            while not self._stopping and not self._waiting and not self._running:
                self._cv.wait()
            return not self._stopping

    def _admit(self) -> None:
        """Start waiting requests in arrival order while there is room."""
        while len(self._running) < self.max_running and self.pool.available:
            with self._cv:
                if not self._waiting:
                    return
                request = self._waiting.popleft()
            if request.cancelled:
                self._report(request, Finished("cancelled", Usage(len(request.prompt), 0, 0)))
                continue
            cache, reused = self.pool.acquire(request.prompt)
            self._running.append(Sequence(request, cache, reused, self.tokenizer))

    def _step(self) -> None:
        for seq in list(self._running):  # one token each; a batched forward replaces this loop
            if seq.request.cancelled:
                self._finish(seq, "cancelled")
                continue
            try:
                token = self._forward(seq)
                self._consume(seq, token)
            except Exception as e:  # the request's failure, not the engine's
                log.exception("request %d failed", seq.request.id)
                self._finish(seq, None, error=f"{type(e).__name__}: {e}")

    def _forward(self, seq: Sequence) -> int:
        """Feed the sequence's pending tokens and choose its next token (as ``model.generate`` does)."""
        p, model = seq.request.params, self.model
        prefill = seq.generated == 0
        logits = model.forward(seq.pending, cache=seq.cache)
        token = model.select(logits.view(logits.shape[-1]), p.greedy, p.top_k, p.top_p, p.temperature,
                             step_seed(seq.request.seed, seq.generated))
        if prefill:
            self.metrics.prompt_tokens_computed += len(seq.pending)
            self.metrics.prompt_tokens_reused += seq.reused
            self.metrics.observe_first_token(time.perf_counter() - seq.request.arrival)
        seq.generated += 1
        seq.pending = [token]
        self.metrics.generation_tokens += 1
        return token

    def _consume(self, seq: Sequence, token: int) -> None:
        if token in self.eos:
            text, stopped = seq.text.finish()
            reason = "stop"
        else:
            text, stopped = seq.text.push(token)
            reason = "stop" if stopped else None
            if reason is None and seq.generated >= seq.request.params.max_tokens:
                text_end, stopped = seq.text.finish()
                text, reason = text + text_end, "stop" if stopped else "length"
        if text:
            seq.request.emit(Delta(text))
        if reason:
            self._finish(seq, reason)

    def _finish(self, seq: Sequence, reason: str | None, error: str | None = None) -> None:
        self._running.remove(seq)
        self.pool.release(seq.cache, keep=error is None)
        usage = Usage(len(seq.request.prompt), seq.generated, seq.reused)
        self._report(seq.request, Failed(error) if error else Finished(reason, usage))

    def _report(self, request: Request, event) -> None:
        self.metrics.count_finished(event.reason if isinstance(event, Finished) else "error")
        request.emit(event)


class AsyncStream:
    """A request's events as an async iterator on the event loop that made it.

    The engine thread hands each event to the loop with ``call_soon_threadsafe``; when the loop
    is gone (the server is stopping) the request is cancelled instead.
    """

    def __init__(self, prompt: list[int], params: SamplingParams):
        self._loop = asyncio.get_running_loop()
        self._queue: asyncio.Queue = asyncio.Queue()
        self.request = Request(prompt, params, self._emit)

    def _emit(self, event) -> None:
        try:
            self._loop.call_soon_threadsafe(self._queue.put_nowait, event)
        except RuntimeError:  # the loop is closed
            self.request.cancel()

    def cancel(self) -> None:
        self.request.cancel()

    def __aiter__(self):
        return self._events()

    async def _events(self):
        while True:
            event = await self._queue.get()
            yield event
            if not isinstance(event, Delta):
                return
