"""The HTTP side of ``llaisys bench serve``: one streamed request to an OpenAI-compatible server, timed chunk by chunk.

The standard library's client (``http.client``): a fresh connection per request, read as server-sent events
until ``data: [DONE]``. A ``Record`` holds what one request measured (seconds).
"""

from __future__ import annotations

import dataclasses
import http.client
import json
import socket
import threading
import time
import urllib.parse
from typing import Any

from llaisys import LlaisysValueError

CHECK_TIMEOUT = 5.0  # seconds for GET /v1/models: an unreachable server is reported quickly

@dataclasses.dataclass(frozen=True)
class Target:
    """Where requests go: a host, a port, the path the OpenAI API lives under, and the headers to send."""
    url: str
    https: bool
    host: str
    port: int
    prefix: str  # the base URL's path, without /v1
    headers: dict[str, str]

    @classmethod
    def parse(cls, url: str, api_key: str | None) -> Target:
        parts = urllib.parse.urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise LlaisysValueError(f"--url {url!r}: expected http://HOST[:PORT] or https://...")
        prefix = parts.path.rstrip("/")
        prefix = prefix[:-3] if prefix.endswith("/v1") else prefix  # a URL given with /v1 means the same server
        headers = {"Content-Type": "application/json", "Accept": "text/event-stream"}
        if api_key:
            headers["Authorization"] = f"Bearer {api_key}"
        https = parts.scheme == "https"
        return cls(url, https, parts.hostname, parts.port or (443 if https else 80), prefix, headers)

    def connect(self, timeout: float) -> http.client.HTTPConnection:
        kind = http.client.HTTPSConnection if self.https else http.client.HTTPConnection
        return kind(self.host, self.port, timeout=timeout)

def error_message(status: int, raw: bytes) -> str:
    """A server's error in one line: OpenAI's ``error.message`` where the body has one, else the body's start."""
    text = raw.decode("utf-8", "replace")
    try:
        body = json.loads(text)
        message = body["error"]["message"] if isinstance(body.get("error"), dict) else body.get("detail", body)
    except (ValueError, AttributeError, KeyError, TypeError):
        message = text[:200]
    return f"HTTP {status}: {' '.join(str(message).split())}"

def served_models(target: Target) -> list[str]:
    """The ids of GET /v1/models, within CHECK_TIMEOUT: a server that is not there is reported at once."""
    conn = target.connect(CHECK_TIMEOUT)
    try:
        conn.request("GET", target.prefix + "/v1/models", headers=target.headers)
        response = conn.getresponse()
        raw = response.read()
    except (OSError, http.client.HTTPException) as e:
        raise LlaisysValueError(f"cannot reach {target.url}: {e or type(e).__name__}") from None
    finally:
        conn.close()
    if response.status != 200:
        raise LlaisysValueError(f"GET /v1/models at {target.url}: {error_message(response.status, raw)}")
    try:
        return [m["id"] for m in json.loads(raw)["data"]]
    except (ValueError, KeyError, TypeError):
        raise LlaisysValueError(f"GET /v1/models at {target.url} did not answer OpenAI's model list") from None

@dataclasses.dataclass
class Record:
    """One request's measurements (seconds; ``start`` from the start of the run)."""
    index: int
    max_tokens: int
    start: float = 0.0
    error: str | None = None
    ttft: float | None = None
    e2e: float | None = None
    itl: list[float] = dataclasses.field(default_factory=list)
    chunks: int = 0  # chunks that carried output
    prompt_tokens: int | None = None  # from the usage chunk
    completion_tokens: int | None = None

    @property
    def ok(self) -> bool:
        return self.error is None

    @property
    def output_tokens(self) -> int:
        """The server's count, else one per output chunk (a server without usage in its streams)."""
        return self.completion_tokens if self.completion_tokens is not None else self.chunks

    @property
    def tpot(self) -> float | None:
        """(E2E - TTFT) / (output tokens - 1): the decode time per token after the first."""
        if self.ttft is None or self.e2e is None or self.output_tokens < 2:
            return None
        return (self.e2e - self.ttft) / (self.output_tokens - 1)

    def as_json(self) -> dict[str, Any]:
        def ms(s: float | None) -> float | None:
            return None if s is None else round(s * 1e3, 3)
        return {"index": self.index, "ok": self.ok, "error": self.error, "start_s": round(self.start, 6),
                "ttft_ms": ms(self.ttft), "tpot_ms": ms(self.tpot), "e2e_ms": ms(self.e2e),
                "itl_ms": [ms(s) for s in self.itl], "prompt_tokens": self.prompt_tokens,
                "output_tokens": self.output_tokens, "max_tokens": self.max_tokens}

class Client:
    """Streams requests to one endpoint; keeps the connections in flight so that an interrupt can close them."""

    def __init__(self, target: Target, path: str, timeout: float):
        self.target, self.path, self.timeout = target, target.prefix + path, timeout
        self.open: set[http.client.HTTPConnection] = set()
        self.lock = threading.Lock()

    def send(self, record: Record, body: dict[str, Any], t0: float) -> Record:
        """``record`` filled in by one streamed request (``t0``: the run's start on perf_counter's clock)."""
        conn = self.target.connect(self.timeout)
        with self.lock:
            self.open.add(conn)
        start = time.perf_counter()
        record.start = start - t0
        try:
            conn.request("POST", self.path, body=json.dumps(body).encode(), headers=self.target.headers)
            response = conn.getresponse()
            if response.status != 200:
                record.error = error_message(response.status, response.read())
            else:
                read_stream(response, record, start)
        except Exception as e:  # any failure (a malformed chunk too) is counted, and the run goes on
            record.error = f"{type(e).__name__}: {e}" if str(e) else type(e).__name__
        finally:
            with self.lock:
                self.open.discard(conn)
            conn.close()
        record.e2e = time.perf_counter() - start
        return record

    def close_all(self) -> None:
        """Cut every request in flight (the server then cancels them); their threads end with an error."""
        with self.lock:
            for conn in self.open:
                if conn.sock is not None:
                    try:
                        conn.sock.shutdown(socket.SHUT_RDWR)
                    except OSError:
                        pass

def read_stream(response: http.client.HTTPResponse, record: Record, start: float) -> None:
    """Read server-sent events until ``data: [DONE]``, timing each chunk that carries output."""
    last = None
    while True:
        line = response.readline()
        if not line:
            record.error = "the stream ended before data: [DONE]"
            return
        if not line.startswith(b"data:"):
            continue  # blank lines between events, comments, event: names
        data = line[5:].strip()
        if data == b"[DONE]":
            return
        chunk = json.loads(data)
        if not isinstance(chunk, dict):
            raise ValueError(f"a stream chunk is not a JSON object: {data[:80]!r}")
        if chunk.get("error"):  # an error after the stream started travels as an event
            error = chunk["error"]
            record.error = "error event: " + str(error.get("message", error) if isinstance(error, dict) else error)
            return
        if chunk.get("usage"):
            record.prompt_tokens = chunk["usage"].get("prompt_tokens")
            record.completion_tokens = chunk["usage"].get("completion_tokens")
        if any(_output(choice) for choice in chunk.get("choices") or ()):
            now = time.perf_counter()
            if last is None:
                record.ttft = now - start
            else:
                record.itl.append(now - last)
            last = now
            record.chunks += 1

def _output(choice: dict[str, Any]) -> bool:
    """Whether a stream choice carries output: text (completions), content, reasoning or a tool call (chat)."""
    delta = choice.get("delta") or {}
    return bool(choice.get("text") or delta.get("content") or delta.get("reasoning_content")
                or delta.get("tool_calls"))
