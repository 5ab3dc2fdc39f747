"""The engine: one thread owns the model and turns queued requests into streamed tokens.

HTTP handlers (or any other caller) build a ``Request`` (prompt token ids, ``SamplingParams``,
an ``emit`` callback) and ``submit`` it; they never touch the model. The engine thread loops:

    admit      new requests go to the scheduler (continuous batching, ``llaisys_models.engine.scheduler``),
               which starts them fairly as KV blocks allow: a request that runs nothing goes before more
               choices of one that runs some (taking a slot back from the request that holds the most if it must),
               then by ``priority``, then in arrival order; prompts share each step's token budget
    step       one forward for every running sequence: each decoding sequence's next token plus chunks
               of prompts being read, so a long prompt holds the others up by one chunk at most
    consume    each new token -> text (detokenized, stop strings) -> ``emit(Delta | Finished)``

KV memory is a paged pool (``--kv-memory``) shared by all sequences; prompts of one cache scope (a
tenant: an API key, plus an optional salt) that start alike share blocks, and a finished conversation's
blocks stay cached, so its next turn computes only its new tokens; the cached tokens a response reports
are whole blocks. When the pool runs out the newest sequence is preempted and later recomputed, invisibly to
its client. A request's tokens do not depend on what else is batched with it.

A request may ask for ``n`` choices: n sequences of its prompt, read once (``Scheduler.fork``: the choices share
its KV blocks). Choice i samples with ``choice_seed(seed, i)`` (choice 0 with the request's seed itself), so a
seeded request's every choice is reproducible and each differs from the others; each event names its choice.

``emit`` is called on the engine thread; ``AsyncStream`` turns it into an async iterator for the HTTP
side. A cancelled request (client gone) leaves at the next step. A request that fails fails alone, with its own
error's text: a bad prompt at admission, or anything that fails in a per-sequence stage of a step (its choice,
its grammar's mask or advance, detokenizing, stop strings, log-probabilities' text); only a forward that fails
fails the requests that were running, and the engine keeps serving either way. Each time it runs out of work it
gives the memory the last requests freed back to the system (serve/heap.py).

A request may run under a LoRA adapter of the model (``params.lora``; serve/lora.py): the scheduler mixes adapters
in a batch (at most ``model.max_loras`` at once) and keys the prefix cache by adapter. The engine counts the requests
under each adapter until they end, so that ``retire_adapter`` (an unload) can refuse new ones and wait for those.

With ``trace_dir`` each request's spans (queue, prefill, decode steps, detokenizing) are written there as a
Chrome trace file when it ends (serve/tracing.py); without it the engine checks one attribute per step.
"""

from __future__ import annotations

import asyncio
import collections
import dataclasses
import functools
import logging
import threading
import time
from collections.abc import AsyncIterator, Callable
from typing import TYPE_CHECKING, cast

import llaisys

from ..engine.sampling import MASK64, SamplingParams, TokenLogprob, step_seed
from ..engine.scheduler import Scheduler, Sequence
from ..engine.speculative import Drafter, NgramDrafter, Speculation
from ..engine.speculative.config import check_numerics
from ..errors import RankFailedError
from ..text.stream import TextStream
from .heap import return_free_memory
from .kv_memory import default_kv_memory
from .metrics import EngineMetrics
from .tracing import RequestTrace, RequestTracer

if TYPE_CHECKING:
    from ..families.causal_lm import CausalLM
    from ..loading.files import PathArg
    from ..lora.adapter import LoRAAdapter
    from ..text.tokenizer import Tokenizer

log = logging.getLogger("llaisys.serve")

SHUTTING_DOWN = "the server is shutting down"  # why a stopped engine refuses and fails requests (not an error)


@dataclasses.dataclass(frozen=True)
class Usage:
    prompt_tokens: int
    completion_tokens: int
    cached_tokens: int  # prompt tokens whose KV came from the cache, in whole KV blocks
    reasoning_tokens: int = 0  # of the completion tokens, those a reasoning model thought (engine/thinking.py)


@dataclasses.dataclass(frozen=True)
class Delta:
    """New text of a choice (may cover several tokens, or a token may add none)."""
    text: str
    index: int = 0  # which of the request's choices
    # where the request asked for log-probabilities: one TokenLogprobText per token the text covers
    logprobs: tuple[TokenLogprobText, ...] = ()
    tokens: int = 0  # the choice's tokens so far, this delta's included (what a cancelled choice generated)


@dataclasses.dataclass(frozen=True)
class TokenLogprobText:
    """A generated token's text, its log-probability and the top alternatives' (text, log-probability)."""
    token: str
    logprob: float
    top: tuple[tuple[str, float], ...]


@dataclasses.dataclass(frozen=True)
class Finished:
    """A choice ended (each of a request's choices ends once). ``usage``: the prompt's tokens and this choice's."""
    reason: str  # "stop" (EOS or a stop string), "length" (max_tokens), "cancelled"
    usage: Usage
    index: int = 0


@dataclasses.dataclass(frozen=True)
class Failed:
    message: str
    shutdown: bool = False  # the engine was stopped (the server shuts down), no error of the request's


Event = Delta | Finished | Failed  # what a request's ``emit`` is called with


def adapter_of(params: SamplingParams) -> LoRAAdapter | None:
    """The LoRA adapter a sequence runs under (None: the base model)."""
    return cast("LoRAAdapter | None", params.lora)


def choice_seed(seed: int | None, index: int) -> int | None:
    """The seed of a request's choice ``index``: the request's own for choice 0, else splitmix64 of (seed, -index)
    (``step_seed`` at a negative step, so no choice's seed is another's step seed); None stays None (random)."""
    if seed is None or index == 0:
        return seed
    return step_seed(seed & MASK64, -index - 1)


class Request:
    """What a caller submits. ``emit(event)`` is called on the engine thread with each ``Delta``, then, for each
    of its ``n`` choices, one ``Finished`` (or one ``Failed`` for the request). ``cache_scope``: whose cached prompt
    prefixes this request may reuse (a server's tenant: requests of different scopes never share KV blocks).
    ``keep_tokens``: special tokens whose text its output keeps (the tool-call markers of a request with tools).
    ``trace_name``: its trace file's name under ``--trace-dir`` (the response's id), if the engine traces.
    ``priority``: lower is scheduled first (0 by default; engine/fairness.py); ``leader``: the first request of the
    same HTTP request (a completions request's prompts), whose fair share it shares."""

    def __init__(self, prompt: list[int], params: SamplingParams, emit: Callable[[Event], object],
                 cache_scope: str = "", n: int = 1, keep_tokens: frozenset[int] = frozenset(),
                 trace_name: str | None = None, priority: int = 0, leader: Request | None = None) -> None:
        if not prompt:
            raise ValueError("a request needs at least one prompt token")
        if n < 1:
            raise ValueError("a request needs n >= 1 choices")
        self.prompt = list(prompt)
        self.params = params
        self.n = n
        self.emit = emit
        self.cache_scope = cache_scope  # prefix-cache tenant: cached blocks are shared only within one scope
        self.keep_tokens = keep_tokens
        self.arrival = time.perf_counter()
        self.open = n  # choices not ended yet
        self.trace_name = trace_name
        self.trace: RequestTrace | None = None  # while the engine traces it
        self.priority = priority
        self.leader = leader
        self.group: int | None = None  # its sequences' fairness group, once admitted (its leader's, if it has one)
        self.holds_adapter = False  # counted among its LoRA adapter's users (Engine.submit) until it ends
        self._cancelled = threading.Event()

    def cancel(self) -> None:
        """Ask the engine to drop this request at its next step (thread-safe, idempotent)."""
        self._cancelled.set()

    @property
    def cancelled(self) -> bool:
        return self._cancelled.is_set()


class Choice:
    """One of a request's sequences (a scheduler ``Sequence``'s tag): its index and its text so far."""

    def __init__(self, request: Request, index: int, text: TextStream) -> None:
        self.request = request
        self.index = index
        self.text = text
        self.tokens = 0  # tokens the engine has turned into text for this choice (a verify step gives several)
        self.logprobs: list[TokenLogprobText] = []  # tokens consumed whose log-probabilities are not yet emitted

    @property
    def cancelled(self) -> bool:
        return self.request.cancelled


def choice_of(seq: Sequence) -> Choice:
    """The ``Choice`` an engine tags each of its sequences with (``Scheduler.add`` / ``fork``'s ``tag``)."""
    return cast(Choice, seq.tag)


class EngineUnavailable(RuntimeError):
    """The engine is stopped (``shutdown``: it was asked to) or died; the message says why."""

    def __init__(self, message: str, shutdown: bool) -> None:
        super().__init__(message)
        self.shutdown = shutdown


class EngineBusy(RuntimeError):
    """The waiting queue is full."""


class AdapterRetired(RuntimeError):
    """The request's LoRA adapter is being unloaded (``Engine.retire_adapter``): no new request may use it."""

    def __init__(self, name: str) -> None:
        super().__init__(f"the LoRA adapter '{name}' is being unloaded")
        self.name = name


class Engine:
    """Serve one model from one thread. ``tokenizer`` is used on the engine thread only (detokenizing).

    ``kv_memory``: bytes of KV cache (default: ``default_kv_memory``); ``max_running``: sequences decoded
    together; ``max_batch_tokens``: tokens per forward (decode tokens + prompt chunks); ``batched=False``
    runs each sequence in its own forward (the unbatched engine, for comparison). ``speculation``: the server's
    default for requests whose ``speculative`` field says nothing (applied by serve/openai/sampling.py; a ``Request``
    is decoded as its ``params.speculation`` says); ``draft``: a draft model's drafter, offered to requests as
    ``"speculative": "draft"`` (prompt lookup, "ngram", is always offered under ``numerics="exact"``).
    ``trace_dir``: write a Chrome trace per request there (serve/tracing.py; created if missing).
    """

    def __init__(self, model: CausalLM, tokenizer: Tokenizer, *, max_running: int = 16, max_batch_tokens: int = 128,
                 kv_memory: int | None = None, block_size: int = 16, prefix_reuse: bool = True,
                 max_waiting: int = 256, batched: bool = True, speculation: Speculation | None = None,
                 draft: Drafter | None = None, trace_dir: PathArg | None = None) -> None:
        if max_running < 1 or max_waiting < 1:
            raise ValueError("max_running and max_waiting must be >= 1")
        if speculation is not None or draft is not None:
            check_numerics(model)  # refused at start-up rather than per request
        # what a request may ask for by name; none under numerics that cannot verify drafts exactly
        self.drafters: dict[str, Drafter] = {} if model.numerics != "exact" else {"ngram": NgramDrafter()}
        if draft is not None:
            self.drafters["draft"] = draft
        self.speculation = speculation
        self.model = model
        self.tokenizer = tokenizer
        self.max_waiting = max_waiting
        memory = default_kv_memory(model, max_running) if kv_memory is None else kv_memory
        self.pool = model.new_kv_pool(memory=memory, block_size=block_size, prefix_caching=prefix_reuse)
        self.scheduler = Scheduler(model, self.pool, max_running=max_running, max_batch_tokens=max_batch_tokens,
                                   batched=batched)
        self.metrics = EngineMetrics()
        self.tracer = RequestTracer(trace_dir) if trace_dir is not None else None
        self._incoming: collections.deque[Request] = collections.deque()  # guarded by _cv
        self._sequences: list[Sequence] = []  # engine thread only: every request in the scheduler (its tag)
        self._cv = threading.Condition()
        self._stopping = False
        self._thread: threading.Thread | None = None
        self.error: str | None = None  # why the engine thread ended, if it died
        self._worked = False  # the engine thread ran a step since it last gave freed memory back
        self._token_texts: dict[int, str] = {}  # token id -> its text alone (log-probabilities' alternatives)
        # LoRA adapters (by uid): the requests queued or running under each, and those being unloaded, which no
        # new request may use (guarded by _adapters)
        self._adapters = threading.Condition()
        self._adapter_users: collections.Counter[int] = collections.Counter()
        self._retired: set[int] = set()

    @property
    def max_length(self) -> int:
        """The longest prompt + reply this engine can complete (the model's context, or the KV pool's)."""
        return self.scheduler.max_length

    # -- the caller's side (any thread) ------------------------------------------------

    def start(self) -> Engine:
        self._thread = threading.Thread(target=self._run, name="llaisys-engine", daemon=True)
        self._thread.start()
        return self

    def stop(self, timeout: float | None = 30.0) -> None:
        """Stop the engine thread: every request still open gets ``Failed(SHUTTING_DOWN, shutdown=True)`` once the
        step under way ends. Waits up to ``timeout`` seconds for the thread (0: asks without waiting)."""
        with self._cv:
            self._stopping = True
            self._cv.notify()
        if self._thread is not None:
            self._thread.join(timeout)

    @property
    def alive(self) -> bool:
        return self._thread is not None and self._thread.is_alive() and not self._stopping

    def submit(self, request: Request) -> None:
        """Queue a request (requests queued before ``start`` wait for it). ``AdapterRetired``: its LoRA adapter
        (``params.lora``) is being unloaded."""
        adapter = adapter_of(request.params)
        with self._cv:
            if self._stopping:
                raise EngineUnavailable(self.error or SHUTTING_DOWN, shutdown=self.error is None)
            if self.waiting >= self.max_waiting:
                raise EngineBusy(f"{self.waiting} requests are already waiting; try again later")
            if adapter is not None:
                with self._adapters:
                    if adapter.uid in self._retired:
                        raise AdapterRetired(adapter.name)
                    self._adapter_users[adapter.uid] += 1
                    request.holds_adapter = True
            self._incoming.append(request)
            self.metrics.requests_received += 1
            self.metrics.adapter_requests[adapter.name if adapter is not None else ""] += 1
            self._cv.notify()

    def retire_adapter(self, adapter: LoRAAdapter, timeout: float | None = None) -> bool:
        """Refuse new requests under ``adapter`` (``submit`` raises ``AdapterRetired``), then wait until none
        queues or runs under it: True once none does (the model may unload it), False after ``timeout`` seconds.
        Blocking: call it off the event loop and off the engine thread."""
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._adapters:
            self._retired.add(adapter.uid)
            while self._adapter_users[adapter.uid] > 0:
                left = None if deadline is None else deadline - time.monotonic()
                if left is not None and left <= 0:
                    return False
                self._adapters.wait(1.0 if left is None else min(left, 1.0))
            return True

    def adapter_users(self, adapter: LoRAAdapter) -> int:
        """Requests queued or running under ``adapter``."""
        with self._adapters:
            return self._adapter_users[adapter.uid]

    def _release_adapter(self, request: Request) -> None:
        """``request`` has ended: it no longer holds its LoRA adapter."""
        if request.holds_adapter:
            request.holds_adapter = False
            adapter = adapter_of(request.params)
            assert adapter is not None  # (it holds one)
            uid = adapter.uid
            with self._adapters:
                self._adapter_users[uid] -= 1
                if self._adapter_users[uid] <= 0:
                    del self._adapter_users[uid]
                    self._adapters.notify_all()

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
        except RankFailedError as e:  # the model's own one-line reason (tensor_parallel/followers.py)
            self.error = f"the engine stopped: {e}"
        except BaseException as e:  # a bug, not a request's fault: say so everywhere
            self.error = f"the engine stopped: {type(e).__name__}: {e}"
            log.exception("engine thread died")
        finally:
            ended = Failed(self.error or SHUTTING_DOWN, shutdown=self.error is None)
            for request in {id(choice_of(seq).request): choice_of(seq).request for seq in self._sequences}.values():
                request.emit(ended)
                self._release_adapter(request)
            with self._cv:
                self._stopping = True
                incoming, self._incoming = list(self._incoming), collections.deque()
            for request in incoming:
                request.emit(ended)
                self._release_adapter(request)

    def _wait_for_work(self) -> bool:
        with self._cv:
            idle = not self._stopping and not self._incoming and not self._sequences
        if idle and self._worked:  # out of work: what the last requests freed goes back to the system
            self._worked = False
            return_free_memory()
        with self._cv:
            while not self._stopping and not self._incoming and not self._sequences:
                self._cv.wait()
            self._worked = True
            return not self._stopping

    def _admit(self) -> None:
        """Hand new requests to the scheduler (it starts them as blocks allow, fairly: engine/fairness.py)."""
        while True:
            with self._cv:
                if not self._incoming:
                    return
                request = self._incoming.popleft()
            if request.cancelled:
                for index in range(request.n):
                    self._report(request, Finished("cancelled", Usage(len(request.prompt), 0, 0), index))
                continue
            params = request.params
            try:
                group = request.leader.group if request.leader is not None else None
                seq = self.scheduler.add(self.model.check_input_ids(request.prompt), params, scope=request.cache_scope,
                                         tag=Choice(request, 0, self._text_stream(request)),
                                         arrival_time=request.arrival, priority=request.priority, group=group)
                request.group = seq.group
                sequences = [seq] + [  # the other choices start from its KV blocks once its prompt is read
                    self.scheduler.fork(seq, dataclasses.replace(params, seed=choice_seed(params.seed, i)),
                                        tag=Choice(request, i, self._text_stream(request)))
                    for i in range(1, request.n)]
            except Exception as e:  # the request's failure (a bad prompt, too long for the cache)
                request.open = 0
                self._report(request, Failed(f"{type(e).__name__}: {e}"))
                continue
            self._sequences.extend(sequences)

    def _text_stream(self, request: Request) -> TextStream:
        return TextStream(self.tokenizer, request.params.stop, request.keep_tokens)

    def _step(self) -> None:
        for seq in [s for s in self._sequences if choice_of(s).cancelled]:
            self.scheduler.finish(seq, "cancelled")
            self._done(seq)
        if not self._sequences:
            return
        tracer = self.tracer
        before = tracer.before_step(self._sequences) if tracer is not None else None
        try:
            events = self.scheduler.step()
        except RankFailedError:  # a tensor-parallel group that lost a rank: the engine cannot go on
            raise
        except Exception as e:  # the running requests fail; the engine and the waiting ones go on
            log.exception("engine step failed")
            failed = {id(choice_of(s).request): choice_of(s).request for s in self._sequences if s.kv is not None}
            for request in failed.values():
                self._fail(request, f"{type(e).__name__}: {e}")
            return
        for seq in self.scheduler.take_failed():  # its choice or its grammar failed: its request alone ends
            self._fail_alone(choice_of(seq).request, seq.error)
        if tracer is not None:
            assert before is not None  # (noted above, as there is a tracer)
            tracer.after_step(before, events)
        last = {seq.id: i for i, (seq, _) in enumerate(events)}  # a verify step gives a sequence several
        ended = set()
        for i, (seq, token) in enumerate(events):
            if seq.id in ended or seq not in self._sequences:  # (a choice of a request failed meanwhile)
                continue
            try:
                if self._consume(seq, token, last[seq.id] == i):
                    ended.add(seq.id)  # a stop string may end it before its step's last token
            except Exception as e:  # detokenizing, stop strings, log-probabilities' text: this request's alone
                ended.add(seq.id)
                self._fail_alone(choice_of(seq).request, e)

    def _consume(self, seq: Sequence, token: int, last: bool = True) -> bool:
        """A new token of ``seq`` (``last``: its step's last one): its text (stop strings), and its end if
        this was its last token. Whether the request ended."""
        choice = choice_of(seq)
        text_stream = choice.text
        started = time.perf_counter() if self.tracer is not None else 0.0
        choice.tokens += 1
        if choice.tokens == 1 and choice.index == 0:  # the prompt is read: the request's first token
            assert seq.first_token_time is not None  # (the scheduler notes it with the token)
            self.metrics.observe_first_token(seq.first_token_time - seq.arrival_time)
        self.metrics.generation_tokens += 1
        adapter = adapter_of(seq.params)
        self.metrics.adapter_tokens[adapter.name if adapter is not None else ""] += 1
        ending = last and seq.finished
        stopped = False
        if ending and seq.finish_reason == "stop" and token in seq.eos:  # an EOS token: no text of its own
            text, _ = text_stream.finish()
        else:
            text, stopped = text_stream.push(token)
            if not stopped and ending:  # max_tokens: what is held back may still complete a stop string
                text_end, stopped = text_stream.finish()
                text += text_end
            if stopped:
                self.scheduler.finish(seq, "stop")
                seq.finish_reason = "stop"
        if seq.logprobs is not None:
            choice.logprobs.append(self._logprob_text(token, seq.logprobs[choice.tokens - 1]))
        if self.tracer is not None:
            self.tracer.detokenized(seq, started)
        if text or (choice.logprobs and (ending or stopped)):  # the last tokens' log-probabilities, text or not
            choice.request.emit(Delta(text, choice.index, tuple(choice.logprobs), choice.tokens))
            choice.logprobs.clear()
        if ending or stopped:
            self._done(seq)
            return True
        return False

    def _logprob_text(self, token: int, entry: TokenLogprob) -> TokenLogprobText:
        """A ``sampling.TokenLogprob`` with its token ids decoded (on the engine thread, which owns the tokenizer)."""
        text = self._token_text
        return TokenLogprobText(text(token), entry.logprob, tuple((text(i), lp) for i, lp in entry.top))

    def _token_text(self, token: int) -> str:
        """One token's text alone, decoded once per token id (n=128 choices with 20 alternatives each decode 2,688
        tokens a step, mostly the same few hundred: a dict lookup instead of a tokenizer call each)."""
        text = self._token_texts.get(token)
        if text is None:
            text = self._token_texts[token] = self.tokenizer.decode([token])
        return text

    def _done(self, seq: Sequence) -> None:
        self._sequences.remove(seq)
        block = self.pool.block_size
        # the tokens its client got: a verify step may have drawn some past a stop string
        choice = choice_of(seq)
        thought = seq.thinking.tokens if seq.thinking is not None else 0
        usage = Usage(seq.prompt_len, choice.tokens, (seq.reused or 0) // block * block, thought)
        assert seq.finish_reason is not None  # (it ended: each caller finished it)
        self._report(choice.request, Finished(seq.finish_reason, usage, choice.index))

    def _fail(self, request: Request, error: str) -> None:
        """End every choice of ``request`` and report one ``Failed``."""
        for seq in [s for s in self._sequences if choice_of(s).request is request]:
            self.scheduler.finish(seq, "error")
            self._sequences.remove(seq)
        if request.open == 0:  # (already ended: one report per request)
            return
        request.open = 0
        self._report(request, Failed(error))

    def _fail_alone(self, request: Request, error: BaseException | None) -> None:
        """One request failed in a per-sequence stage of a step (its choice, grammar, text or stop strings): it
        ends with its own error's text (nothing of another request's) and the others go on. A failure of ours
        (not a ``LlaisysError`` about the request) is logged with its traceback."""
        if not isinstance(error, llaisys.LlaisysError):
            log.error("a request failed alone in the engine step", exc_info=error)
        self._fail(request, f"{type(error).__name__}: {error}")

    def _report(self, request: Request, event: Finished | Failed) -> None:
        if isinstance(event, Finished):
            request.open -= 1
            if request.open == 0:  # the request's last choice: counted once, by its reason
                self.metrics.count_finished(event.reason)
        else:
            self.metrics.count_finished("error")
        if self.tracer is not None:  # (written before the client hears of the end)
            if isinstance(event, Finished):
                self.tracer.finished(request, event.index, event.reason, event.usage)
            else:
                self.tracer.failed(request)
        request.emit(event)
        if request.open == 0:  # (a Failed request's choices are all ended: open is 0)
            self._release_adapter(request)


class AsyncStream:
    """The events of one or more requests (a completions request's prompts, each with ``n`` choices) as one async
    iterator on the event loop that made it. Prompt i's choice j is choice ``i * n + j`` (OpenAI's numbering);
    it ends when every choice has finished, or at the first ``Failed`` (the other requests are then cancelled).

    The engine thread hands each event to the loop with ``call_soon_threadsafe``; when the loop
    is gone (the server is stopping) the requests are cancelled instead.
    """

    def __init__(self, jobs: list[tuple[list[int], SamplingParams]], cache_scope: str = "", n: int = 1,
                 keep_tokens: frozenset[int] = frozenset(), observe: Callable[[Event], object] | None = None,
                 trace_name: str | None = None, priority: int = 0) -> None:
        """``jobs``: (prompt token ids, its sampling parameters) of each request; ``observe(event)``: called with
        each event as the iterator yields it (the access log's counts); ``trace_name``: the name of their trace
        files (the response's id; ``<id>-<i>`` for prompt i of several); ``priority``: theirs (lower first). The
        requests share one fair share of the engine (the first one leads)."""
        self._loop = asyncio.get_running_loop()
        self._observe = observe
        self._queue: asyncio.Queue[Event] = asyncio.Queue()
        names = [trace_name if len(jobs) == 1 or trace_name is None else f"{trace_name}-{i}" for i in range(len(jobs))]
        self.requests: list[Request] = []
        for i, ((prompt, params), name) in enumerate(zip(jobs, names)):
            self.requests.append(Request(prompt, params, functools.partial(self._emit, i * n), cache_scope=cache_scope,
                                         n=n, keep_tokens=keep_tokens, trace_name=name, priority=priority,
                                         leader=self.requests[0] if self.requests else None))

    def _emit(self, base: int, event: Event) -> None:
        if not isinstance(event, Failed):
            event = dataclasses.replace(event, index=base + event.index)
        try:
            self._loop.call_soon_threadsafe(self._queue.put_nowait, event)
        except RuntimeError:  # the loop is closed
            self.cancel()

    def cancel(self) -> None:
        for request in self.requests:
            request.cancel()

    def __aiter__(self) -> AsyncIterator[Event]:
        return self._events()

    async def _events(self) -> AsyncIterator[Event]:
        open_choices = sum(request.n for request in self.requests)
        while True:
            event = await self._queue.get()
            if self._observe is not None:
                self._observe(event)
            yield event
            open_choices -= isinstance(event, Finished)
            if isinstance(event, Failed) or not open_choices:
                self.cancel()
                return
