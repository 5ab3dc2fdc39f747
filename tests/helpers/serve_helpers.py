"""References for the serving tests, computed without the server: HF's chat template and tokenizer,
and ``model.generate`` on a separate copy of the model."""

from __future__ import annotations

import contextlib
import dataclasses
import http.client
import json
import threading
import time
import urllib.parse

import pytest

CHAT_MODEL = "tiny-chat"  # the id the chat server serves its model under
API_KEY = "test-key-123"  # the demo server's key


def require_serving() -> None:
    """Skip the calling test module where the serve extra or the test clients are not installed."""
    extra = "the serve extra is not installed: pip install './llaisys-models[serve]'"
    pytest.importorskip("fastapi", reason=extra)
    pytest.importorskip("uvicorn", reason=extra)
    pytest.importorskip("openai", reason="the serving tests drive the server with the official client: pip install openai")


def wait_until(condition, timeout: float = 30.0) -> bool:
    """Whether ``condition()`` became true within ``timeout`` seconds (polled every 50 ms)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(0.05)
    return False


def chat_ids(tokenizer, messages) -> list[int]:
    text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    return list(tokenizer(text, add_special_tokens=False).input_ids)


def text_ids(tokenizer, text: str) -> list[int]:
    return list(tokenizer(text).input_ids)


def generate_text(model, tokenizer, ids, max_tokens: int, **sampling) -> str:
    """The text ``model.generate`` produces after ``ids`` (its new tokens decoded at once)."""
    out = model.generate(ids, max_tokens, **sampling)
    return tokenizer.decode(out[len(ids):], skip_special_tokens=True)


def user(text: str) -> list[dict]:
    return [{"role": "user", "content": text}]


# -- the engine without HTTP ---------------------------------------------------------------------------------

TIMEOUT = 60  # seconds to wait for an engine event


def at_once(jobs, timeout: float = 2 * TIMEOUT) -> list:
    """Each job (a function of no arguments) on a thread of its own, started together; their results in order.
    Any job's error fails the caller."""
    results, errors = [None] * len(jobs), []
    start = threading.Barrier(len(jobs))

    def run(i):
        try:
            start.wait()
            results[i] = jobs[i]()
        except Exception as e:  # reported below, with the job's index
            errors.append((i, e))

    threads = [threading.Thread(target=run, args=(i,)) for i in range(len(jobs))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout)
    assert not errors, errors
    return results


def stream_chats_at_once(server, requests: list[dict]) -> list[str]:
    """Start one streamed chat completion per request (``create`` keyword arguments) in as many threads at
    the same moment; the text of each, in request order. Any thread's error fails the caller."""
    def chat(client, request) -> str:
        stream = client.chat.completions.create(stream=True, **request)
        return "".join(c.choices[0].delta.content or "" for c in stream if c.choices)

    clients = [server.client() for _ in requests]  # (made before the start, as a client of its own per thread)
    return at_once([lambda c=c, r=r: chat(c, r) for c, r in zip(clients, requests)], timeout=120)


def submit(engine, prompt, max_tokens: int, log, name=None, **sampling):
    """Submit a request whose events go to ``log`` (a queue) as (name, event); returns the Request."""
    from llaisys_models.serve.engine import Request, SamplingParams

    request = Request(prompt, SamplingParams(max_tokens=max_tokens, **sampling), lambda event: log.put((name, event)))
    engine.submit(request)
    return request


def events_until_done(log, count: int) -> list:
    """(name, event) pairs from ``log`` until ``count`` requests have ended (Finished or Failed)."""
    from llaisys_models.serve.engine import Delta

    events, done = [], 0
    while done < count:
        name, event = log.get(timeout=TIMEOUT)
        events.append((name, event))
        done += not isinstance(event, Delta)
    return events


# -- raw HTTP (the standard library: the openai client's own HTTP package varies between versions) --------

@dataclasses.dataclass
class Reply:
    status: int
    headers: dict[str, str]  # lower-case names
    body: bytes

    @property
    def text(self) -> str:
        return self.body.decode()

    def json(self):
        return json.loads(self.body)


def _connection(base_url: str, timeout: float) -> http.client.HTTPConnection:
    url = urllib.parse.urlsplit(base_url)
    return http.client.HTTPConnection(url.hostname, url.port, timeout=timeout)


def _payload(json_body, raw: bytes | None) -> bytes | None:
    return raw if raw is not None else (None if json_body is None else json.dumps(json_body).encode())


def http_request(base_url: str, method: str, path: str, json_body=None, *, raw: bytes | None = None,
                 headers: dict | None = None, timeout: float = 30) -> Reply:
    """One request on a fresh connection; any status comes back as a Reply (4xx/5xx included)."""
    conn = _connection(base_url, timeout)
    try:
        conn.request(method, path, body=_payload(json_body, raw),
                     headers={"Content-Type": "application/json", **(headers or {})})
        r = conn.getresponse()
        return Reply(r.status, {k.lower(): v for k, v in r.getheaders()}, r.read())
    finally:
        conn.close()


@contextlib.contextmanager
def http_stream(base_url: str, path: str, json_body, timeout: float = 30):
    """POST and yield the open response (``readline()`` reads the stream); closing hangs up."""
    conn = _connection(base_url, timeout)
    try:
        conn.request("POST", path, body=_payload(json_body, None), headers={"Content-Type": "application/json"})
        yield conn.getresponse()
    finally:
        conn.close()


CHAT = "/v1/chat/completions"


COMPLETIONS = "/v1/completions"



def chat(**fields) -> dict:
    return {"model": CHAT_MODEL, "messages": user("hi"), **fields}



def check_error_body(r: Reply, status: int, param, code) -> dict:
    assert r.status == status, r.text
    assert r.headers["content-type"].startswith("application/json")
    error = json.loads(r.body.decode("utf-8"))["error"]  # strict UTF-8: what the client echoed included
    assert set(error) == {"message", "type", "param", "code"}
    assert isinstance(error["message"], str) and error["message"]
    assert error["type"] == {401: "authentication_error", 404: "not_found_error"}.get(status, "invalid_request_error")
    assert (error["param"], error["code"]) == (param, code), error
    return error
