"""``llaisys serve --trace-dir DIR``: where each request's time went, one Chrome trace file per request.

When a request ends (each of its choices finished, or it failed) the engine writes ``DIR/<id>.json`` (the
response's id, e.g. ``chatcmpl-3f2a….json``; a prompt i of a completions request with several prompts:
``<id>-<i>.json``; a request without an id: a timestamp and a counter) in the Chrome Trace Event Format
(``llaisys.trace``; open it in https://ui.perfetto.dev). Each choice of the request is a track (``tid`` = the
choice's index) holding complete events ("ph": "X"), microseconds from the server's start (so the files of
one server line up)::

    request         submitted -> its last token's text; args: prompt_tokens, cached_tokens,
                    completion_tokens, finish_reason, decode_steps
      queue         submitted -> admitted by the scheduler (KV blocks found)
      prefill       admitted -> first token drawn
        prefill chunk   each step that read a chunk of the prompt; args: tokens (absent for a choice forked
                        from choice 0, which reads no prompt of its own)
      decode        each later step that drew tokens for it; args: batch (the sequences that drew a token in
                    that step), tokens (this choice's: more than one when drafts were kept)
      detokenize    each step's time turning its tokens into text (stop strings, log-probabilities included)

so without speculative decoding a choice has completion_tokens - 1 decode spans (the first token ends its
prefill). Traces hold counts and times only, never a prompt's or a reply's text (the server's privacy
rule, as its logs). Writing costs the engine thread a file per request; without ``--trace-dir`` the
engine does none of this. A file that cannot be written is logged once as a warning; the engine goes on.
"""

from __future__ import annotations

import itertools
import logging
import os
import re
import time
from collections.abc import Iterable
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol, cast

from llaisys import LlaisysError, LlaisysValueError
from llaisys.trace import write_trace

if TYPE_CHECKING:
    from ..engine.scheduler import Sequence
    from ..loading.files import PathArg


# What a trace reads of the engine's requests (engine.py, which imports this module: the shapes, not the classes)
class Request(Protocol):
    trace: RequestTrace | None
    trace_name: str | None
    arrival: float
    n: int
    prompt: list[int]
    open: int  # choices not ended yet


class Choice(Protocol):
    request: Request
    index: int


class Usage(Protocol):
    @property
    def prompt_tokens(self) -> int: ...

    @property
    def completion_tokens(self) -> int: ...

    @property
    def cached_tokens(self) -> int: ...

log = logging.getLogger("llaisys.serve")

_DEPTH = {"request": 0, "prefill chunk": 2}  # how deep a span nests (the others: 1)
_SAFE_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}")


def prepare_trace_dir(directory: PathArg) -> Path:
    """``directory`` created if missing and checked writable (a file is made and removed), as an absolute path
    (a replica's process may start elsewhere); else a LlaisysValueError naming --trace-dir."""
    path = Path(directory).expanduser().absolute()
    try:
        path.mkdir(parents=True, exist_ok=True)
        probe = path / f".llaisys-write-test-{os.getpid()}"
        probe.write_bytes(b"")
        probe.unlink()
    except OSError as e:
        raise LlaisysValueError(f"--trace-dir {directory}: cannot write there: {e.strerror or e}") from None
    return path


def _choice(seq: Sequence) -> Choice:
    """The engine's ``Choice`` that tags ``seq`` (engine.choice_of)."""
    return cast("Choice", seq.tag)


class ChoiceTrace:
    """The spans of one choice (one scheduler sequence) so far."""

    def __init__(self) -> None:
        self.spans: list[tuple[str, float, float, dict]] = []  # (name, start, end, args), perf_counter seconds
        self.admitted: float | None = None
        self.end: float | None = None
        self.args: dict = {}
        self.decode_steps = 0
        self.detokenize = 0.0  # seconds, summed
        self.detokenize_step = -1  # the step of the last detokenize span (a step's tokens share one)


class RequestTrace:
    """The spans of one request's choices, kept on its ``Request`` until it ends."""

    def __init__(self, name: str, arrival: float, n: int) -> None:
        self.name = name
        self.arrival = arrival
        self.choices = [ChoiceTrace() for _ in range(n)]


class RequestTracer:
    """Per-request traces for one engine (its thread only), written to ``directory``."""

    def __init__(self, directory: PathArg) -> None:
        self.directory = prepare_trace_dir(directory)
        self.origin = time.perf_counter()  # ts 0
        self.step_number = 0
        self._names = itertools.count()
        self._warned = False

    def of(self, request: Request) -> RequestTrace:
        """The request's trace, made at its first sight."""
        if request.trace is None:
            name = request.trace_name
            if name is None or not _SAFE_NAME.fullmatch(name):
                name = f"{time.strftime('%Y%m%dT%H%M%S')}-{os.getpid()}-{next(self._names):06d}"
            request.trace = RequestTrace(name, request.arrival, request.n)
        return request.trace

    # -- one scheduler step -------------------------------------------------------------------

    def before_step(self, sequences: Iterable[Sequence]) -> tuple[float, list[tuple[Any, ...]]]:
        """What the step will change, noted before it: (start, each sequence's state)."""
        self.step_number += 1
        state = [(seq, seq.reused is not None, seq.first_token_time is not None, seq.parent is not None,
                  len(seq.kv) if seq.kv is not None else None, len(seq.tokens)) for seq in sequences]
        return time.perf_counter(), state

    def after_step(self, before: tuple[float, list[tuple[Any, ...]]], events: Iterable[tuple[Sequence, int]]) -> None:
        """Spans of the step that just ran (``events``: its (sequence, token) pairs)."""
        end = time.perf_counter()
        start, state = before
        drawn: dict[int, int] = {}
        for seq, _ in events:
            drawn[seq.id] = drawn.get(seq.id, 0) + 1
        batch = len(drawn)
        for seq, admitted, had_first, forked, kv_len, tokens in state:
            tag = _choice(seq)
            choice = self.of(tag.request).choices[tag.index]
            if not admitted and seq.reused is not None:  # the scheduler took it in this step
                choice.admitted = start
                choice.spans.append(("queue", tag.request.arrival, start, {}))
            if choice.admitted is None:
                continue
            if had_first:
                if seq.id in drawn:
                    choice.decode_steps += 1
                    choice.spans.append(("decode", start, end, {"batch": batch, "tokens": drawn[seq.id]}))
                continue
            first = seq.first_token_time
            read_from = kv_len if kv_len is not None else seq.reused
            if first is not None:  # its prompt's last chunk: the whole rest of what was pending
                chunk = {} if forked else {"tokens": tokens - read_from}
                choice.spans.append(("prefill chunk", start, first, chunk))
                choice.spans.append(("prefill", choice.admitted, first, {}))
            elif seq.kv is not None and len(seq.kv) > read_from:
                choice.spans.append(("prefill chunk", start, end, {"tokens": len(seq.kv) - read_from}))

    def detokenized(self, seq: Sequence, start: float) -> None:
        """``seq``'s token has been turned into text since ``start`` (on the engine thread)."""
        end = time.perf_counter()
        tag = _choice(seq)
        choice = self.of(tag.request).choices[tag.index]
        choice.detokenize += end - start
        last = choice.spans[-1] if choice.spans else None
        if choice.detokenize_step == self.step_number and last is not None and last[0] == "detokenize":
            # another token of the same step (kept drafts): one span, its time summed
            choice.spans[-1] = ("detokenize", last[1], last[2] + end - start, last[3])
        else:
            choice.spans.append(("detokenize", start, end, {}))
            choice.detokenize_step = self.step_number

    # -- the request's end ----------------------------------------------------------------------

    def finished(self, request: Request, index: int, reason: str, usage: Usage) -> None:
        """Choice ``index`` ended (``usage``: the engine's ``Usage``); the file is written at the request's last."""
        choice = self.of(request).choices[index]
        choice.end = time.perf_counter()
        choice.args = {"prompt_tokens": usage.prompt_tokens, "cached_tokens": usage.cached_tokens,
                       "completion_tokens": usage.completion_tokens, "finish_reason": reason}
        if request.open == 0:
            self._write(request)

    def failed(self, request: Request) -> None:
        """The request failed: its choices still open end with finish_reason "error" (no message: counts only)."""
        trace = self.of(request)
        now = time.perf_counter()
        for choice in trace.choices:
            if choice.end is None:
                choice.end = now
                choice.args = {"prompt_tokens": len(request.prompt), "finish_reason": "error"}
        self._write(request)

    def _write(self, request: Request) -> None:
        trace = self.of(request)
        request.trace = None  # written once; its memory goes with it
        try:
            write_trace(self.directory / f"{trace.name}.json", self._events(trace))
        except (LlaisysError, OSError) as e:
            if not self._warned:  # once: a full disk must not fill the log as well
                self._warned = True
                log.warning("--trace-dir: %s (further trace write failures are not logged)", e)

    def _events(self, trace: RequestTrace) -> list[dict]:
        pid = os.getpid()
        events: list[dict] = [{"name": "process_name", "ph": "M", "pid": pid, "tid": 0,
                               "args": {"name": f"llaisys serve {trace.name}"}}]
        for index, choice in enumerate(trace.choices):
            events.append({"name": "thread_name", "ph": "M", "pid": pid, "tid": index,
                           "args": {"name": f"choice {index}"}})
            summary = {**choice.args, "decode_steps": choice.decode_steps,
                       "detokenize_us": round(choice.detokenize * 1e6, 3)}
            spans = [("request", trace.arrival, choice.end or trace.arrival, summary), *choice.spans]
            # by start, the enclosing span first where two coincide (a viewer nests them in file order)
            spans.sort(key=lambda span: (span[1], -(span[2] - span[1]), _DEPTH.get(span[0], 1)))
            for name, start, end, args in spans:
                events.append({"name": name, "cat": "serve", "ph": "X", "ts": self._us(start),
                               "dur": round(max(end - start, 0.0) * 1e6, 3), "pid": pid, "tid": index, "args": args})
        return events

    def _us(self, t: float) -> float:
        return round((t - self.origin) * 1e6, 3)
