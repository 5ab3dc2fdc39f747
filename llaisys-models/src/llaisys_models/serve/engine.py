"""The engine: one thread owns the model and turns queued requests into streamed tokens.

HTTP handlers (or any other caller) build a ``Request`` (prompt token ids, ``SamplingParams``,
an ``emit`` callback) and ``submit`` it; they never touch the model. The engine thread loops:

    admit      new requests go to the scheduler (continuous batching, ``llaisys_models.scheduler``),
               which starts them in arrival order as KV blocks allow
    step       one forward for every running sequence: each decoding sequence's next token plus chunks
               of prompts being read, so a long prompt holds the others up by one chunk at most
    consume    each new token -> text (detokenized, stop strings) -> ``emit(Delta | Finished)``

KV memory is a paged pool (``--kv-memory``) shared by all sequences; prompts that start alike share
blocks, and a finished conversation's blocks stay cached, so its next turn computes only its new
tokens. When the pool runs out the newest sequence is preempted and later recomputed, invisibly to
its client. A request's tokens do not depend on what else is batched with it.

``emit`` is called on the engine thread; ``AsyncStream`` turns it into an async iterator for the HTTP
side. A cancelled request (client gone) leaves at the next step. A request that fails (a bad prompt)
fails alone; a step that fails fails the requests that were running, and the engine keeps serving.
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

from ..generation import MASK64
from ..scheduler import Sampling, Scheduler
from .kv_memory import default_kv_memory
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

    def __init__(self, prompt: list[int], params: SamplingParams, emit, cache_scope: str = ""):
        if not prompt:
            raise ValueError("a request needs at least one prompt token")
        self.id = next(_ids)
        self.prompt = list(prompt)
        self.params = params
        self.seed = params.seed & MASK64 if params.seed is not None else secrets.randbits(63)
        self.emit = emit
        self.cache_scope = cache_scope  # prefix-cache tenant: cached blocks are shared only within one scope
        self.arrival = time.perf_counter()
        self._cancelled = threading.Event()

    def cancel(self) -> None:
        """Ask the engine to drop this request at its next step (thread-safe, idempotent)."""
        self._cancelled.set()

    @property
    def cancelled(self) -> bool:
        return self._cancelled.is_set()


class Job:
    """A request the engine is working on: its sequence in the scheduler and its text so far."""

    def __init__(self, request: Request, tokenizer):
        self.request = request
        self.text = TextStream(tokenizer, request.params.stop)
        self.seq = None  # the scheduler's Sequence


class EngineUnavailable(RuntimeError):
    """The engine is stopped or died; the message says why."""


class EngineBusy(RuntimeError):
    """The waiting queue is full."""


class Engine:
    """Serve one model from one thread. ``tokenizer`` is used on the engine thread only (detokenizing).

    ``kv_memory``: bytes of KV cache (default: ``default_kv_memory``); ``max_running``: sequences decoded
    together; ``max_batch_tokens``: tokens per forward (decode tokens + prompt chunks); ``batched=False``
    runs each sequence in its own forward (the unbatched engine, for comparison).
    """

    def __init__(self, model, tokenizer, *, max_running: int = 16, max_batch_tokens: int = 128,
                 kv_memory: int | None = None, block_size: int = 16, prefix_reuse: bool = True,
                 max_waiting: int = 256, batched: bool = True):
        if max_running < 1 or max_waiting < 1:
            raise ValueError("max_running and max_waiting must be >= 1")
        self.model = model
        self.tokenizer = tokenizer
        self.max_waiting = max_waiting
        memory = default_kv_memory(model, max_running) if kv_memory is None else kv_memory
        self.pool = model.new_kv_pool(memory=memory, block_size=block_size, prefix_caching=prefix_reuse)
        self.scheduler = Scheduler(model, self.pool, max_running=max_running, max_batch_tokens=max_batch_tokens,
                                   batched=batched)
        self.eos = frozenset(model.eos_token_ids)
        self.metrics = EngineMetrics()
        self._incoming: collections.deque[Request] = collections.deque()  # guarded by _cv
        self._jobs: list[Job] = []  # engine thread only: every request in the scheduler
        self._cv = threading.Condition()
        self._stopping = False
        self._thread: threading.Thread | None = None
        self.error: str | None = None  # why the engine thread ended, if it died

    @property
    def max_length(self) -> int:
        """The longest prompt + reply this engine can complete (the model's context, or the KV pool's)."""
        return self.scheduler.max_length()

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
            if self.waiting >= self.max_waiting:
                raise EngineBusy(f"{self.waiting} requests are already waiting; try again later")
            self._incoming.append(request)
            self.metrics.requests_received += 1
            self._cv.notify()

    @property
    def waiting(self) -> int:
        return len(self._incoming) + len(self.scheduler.waiting)

    @property
    def running(self) -> int:
        return len(self.scheduler.running)

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
            for job in self._jobs:
                job.request.emit(Failed(reason))
            with self._cv:
                self._stopping = True
                incoming, self._incoming = list(self._incoming), collections.deque()
            for request in incoming:
                request.emit(Failed(reason))

    def _wait_for_work(self) -> bool:
        with self._cv:
            while not self._stopping and not self._incoming and not self._jobs:
                self._cv.wait()
            return not self._stopping

    def _admit(self) -> None:
        """Hand new requests to the scheduler (it starts them as blocks allow, in arrival order)."""
        while True:
            with self._cv:
                if not self._incoming:
                    return
                request = self._incoming.popleft()
            if request.cancelled:
                self._report(request, Finished("cancelled", Usage(len(request.prompt), 0, 0)))
                continue
            job = Job(request, self.tokenizer)
            p = request.params
            try:
                job.seq = self.scheduler.add(self.model.check_input_ids(request.prompt),
                                             Sampling(p.greedy, p.top_k, p.top_p, p.temperature, request.seed),
                                             p.max_tokens, tag=job)
            except Exception as e:  # the request's failure (a bad prompt, too long for the cache)
                self._report(request, Failed(f"{type(e).__name__}: {e}"))
                continue
            self._jobs.append(job)

    def _step(self) -> None:
        for job in [j for j in self._jobs if j.request.cancelled]:
            self._finish(job, "cancelled")
        if not self._jobs:
            return
        try:
            events = self.scheduler.step()
        except Exception as e:  # the running requests fail; the engine and the waiting ones go on
            log.exception("engine step failed")
            for job in [j for j in self._jobs if j.seq.kv is not None]:
                self._finish(job, None, error=f"{type(e).__name__}: {e}")
            return
        for seq, token in events:
            self._consume(seq.tag, token)

    def _consume(self, job: Job, token: int) -> None:
        seq = job.seq
        if seq.generated == 1:  # the prompt is read: its first token
            self.metrics.prompt_tokens_computed += seq.prompt_len - seq.reused
            self.metrics.prompt_tokens_reused += seq.reused
            self.metrics.observe_first_token(seq.first_token_time - job.request.arrival)
        self.metrics.generation_tokens += 1
        if token in self.eos:
            text, stopped = job.text.finish()
            reason = "stop"
        else:
            text, stopped = job.text.push(token)
            reason = "stop" if stopped else None
            if reason is None and seq.generated >= job.request.params.max_tokens:
                text_end, stopped = job.text.finish()
                text, reason = text + text_end, "stop" if stopped else "length"
        if text:
            job.request.emit(Delta(text))
        if reason:
            self._finish(job, reason)

    def _finish(self, job: Job, reason: str | None, error: str | None = None) -> None:
        self._jobs.remove(job)
        self.scheduler.finish(job.seq)
        seq = job.seq
        usage = Usage(len(job.request.prompt), seq.generated, seq.reused or 0)
        self._report(job.request, Failed(error) if error else Finished(reason, usage))

    def _report(self, request: Request, event) -> None:
        self.metrics.count_finished(event.reason if isinstance(event, Finished) else "error")
        request.emit(event)


class AsyncStream:
    """A request's events as an async iterator on the event loop that made it.

    The engine thread hands each event to the loop with ``call_soon_threadsafe``; when the loop
    is gone (the server is stopping) the request is cancelled instead.
    """

    def __init__(self, prompt: list[int], params: SamplingParams, cache_scope: str = ""):
        self._loop = asyncio.get_running_loop()
        self._queue: asyncio.Queue = asyncio.Queue()
        self.request = Request(prompt, params, self._emit, cache_scope=cache_scope)

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
