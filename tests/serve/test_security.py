"""The server under attack: no prompt stalls the others, tenants are kept apart, a page on
another site cannot reach a server on 127.0.0.1, and a client's misbehaviour is never a 500."""

from __future__ import annotations

import hashlib
import json
import logging
import socket
import threading

import pytest

from helpers.serve_helpers import CHAT_MODEL, http_request, require_serving, user, wait_until

require_serving()

import llaisys_models  # noqa: E402
from llaisys_models.serve.openai import prompts  # noqa: E402
from llaisys_models.text.tokenizer import PromptTooLongError, encode, longest_token  # noqa: E402

CHAT = "/v1/chat/completions"
KEY_A, KEY_B = "tenant-a-key", "tenant-b-key"


def chat(**fields) -> dict:
    return {"model": CHAT_MODEL, "messages": user("hi"), "max_tokens": 1, "temperature": 0, **fields}


def error_of(r, status: int, param, code) -> str:
    """The message of an OpenAI error body with this status, param and code (the body strict UTF-8 JSON)."""
    assert r.status == status, r.text
    error = json.loads(r.body.decode("utf-8"))["error"]
    assert (error["param"], error["code"]) == (param, code), error
    return error["message"]



def metric(server, name: str) -> float:
    return server.metrics().get(f'{name}{{model="{CHAT_MODEL}"}}', 0)


def prompt_chars(prompt) -> int:
    return len(prompt) if isinstance(prompt, str) else sum(len(m["content"]) for m in prompt)


# -- B: prompts are bounded before tokenizing, and tokenized side by side ---------------------------------

@pytest.fixture
def encode_calls(monkeypatch):
    """The prompts the server's tokenizers encode, in order."""
    calls, real = [], prompts.encode

    def counting(tokenizer, prompt, **kwargs):
        calls.append(prompt)
        return real(tokenizer, prompt, **kwargs)
    monkeypatch.setattr(prompts, "encode", counting)
    return calls


def test_prompt_beyond_what_the_context_can_hold_is_refused_without_tokenizing(chat_server, encode_calls):
    server = chat_server.server
    bound = server.max_prompt_chars
    assert bound == server.context * 13  # the tokenizer's longest token is "<|endoftext|>"
    for path, body, param in [(CHAT, chat(messages=user("x" * 3_900_000)), "messages"),  # under the 4 MB body cap
                              (CHAT, chat(messages=[*user("x" * (bound // 2)), *user("y" * (bound // 2 + 1))]),
                               "messages"),
                              ("/v1/completions", {"model": CHAT_MODEL, "prompt": "z" * (bound + 1)}, "prompt")]:
        message = error_of(http_request(chat_server.base_url, "POST", path, body), 400, param,
                           "context_length_exceeded")
        assert f"{prompt_chars(body.get('messages') or body.get('prompt'))} characters" in message
        assert str(bound) in message and str(server.context) in message
    assert encode_calls == []


def test_prompt_within_the_character_bound_is_tokenized_then_checked_in_tokens(chat_server, encode_calls):
    bound = chat_server.server.max_prompt_chars
    r = http_request(chat_server.base_url, "POST", "/v1/completions", {"model": CHAT_MODEL, "prompt": "z" * bound})
    assert "maximum context length is 4096 tokens; the prompt has" in error_of(r, 400, "prompt",
                                                                                "context_length_exceeded")
    assert len(encode_calls) == 1


def test_many_short_messages_are_bounded_once_in_the_chat_template(chat_server, encode_calls):
    """Their text is under the bound, the rendered template is not: refused before the tokenizer reads it."""
    bound, count = chat_server.server.max_prompt_chars, 2048  # as many messages as a request may have
    size = (bound - count * len("<user>\n") // 2) // count  # each message's text; the template adds "<user>", "\n"
    messages = user("a" * size) * count
    assert size * count <= bound < count * (size + len("<user>\n"))
    message = error_of(http_request(chat_server.base_url, "POST", CHAT, chat(messages=messages)), 400, "messages",
                       "context_length_exceeded")
    assert "once in the chat template" in message and len(encode_calls) == 1


def test_encode_refuses_before_tokenizing(tokenizer):
    messages = user("ab") * 10
    rendered = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    with pytest.raises(PromptTooLongError) as e:
        encode(tokenizer, messages, max_chars=len(rendered) - 1)
    assert e.value.chars == len(rendered)
    assert encode(tokenizer, messages, max_chars=len(rendered)) == tokenizer(rendered, add_special_tokens=False).input_ids
    with pytest.raises(PromptTooLongError):
        encode(tokenizer, "abc", chat=False, max_chars=2)


def test_longest_token_bounds_the_characters_per_token(tokenizer):
    longest = longest_token(tokenizer)
    assert longest == max(len(t) for t in tokenizer.get_vocab())
    for text in ["plain ascii text", "héllo 世界 🙂", "<|endoftext|>" * 5, " " * 40]:
        assert len(tokenizer(text).input_ids) * longest >= len(text)


def test_short_prompt_is_tokenized_while_long_ones_are(chat_server, monkeypatch):
    """Two long prompts hold every thread for long prompts (their tokenization is stopped in the middle),
    a third waits for one: a short chat still gets its answer, before any long one is let go."""
    real, started, release = prompts.encode, threading.Semaphore(0), threading.Event()

    def slow_for_long(tokenizer, prompt, **kwargs):
        if prompt_chars(prompt) > prompts.LONG_PROMPT_CHARS:
            started.release()
            release.wait(120)
        return real(tokenizer, prompt, **kwargs)
    monkeypatch.setattr(prompts, "encode", slow_for_long)

    long_body = chat(messages=user("y" * (prompts.LONG_PROMPT_CHARS + 1)))  # over the context once tokenized
    replies = []
    threads = [threading.Thread(target=lambda: replies.append(http_request(chat_server.base_url, "POST", CHAT,
                                                                           long_body, timeout=180)))
               for _ in range(3)]
    for t in threads:
        t.start()
    try:
        assert started.acquire(timeout=60) and started.acquire(timeout=60), "the long prompts were not tokenized"
        r = chat_server.client(timeout=60).chat.completions.create(model=CHAT_MODEL, messages=user("1+2="),
                                                                   max_tokens=2, temperature=0)
        assert r.usage.completion_tokens == 2
        assert not release.is_set() and replies == []  # every long prompt is still being tokenized
    finally:
        release.set()
        for t in threads:
            t.join(180)
    assert [r.status for r in replies] == [400] * 3
    assert {r.json()["error"]["code"] for r in replies} == {"context_length_exceeded"}


# -- C and E: API keys are tenants; the cache scope of each request ----------------------------------------

@pytest.fixture(scope="module")
def keyed_server(chat_server, chat_model_dir):
    """The chat model served again, with two API keys (a small engine of its own)."""
    from llaisys_models.serve.background import BackgroundServer
    from llaisys_models.serve.engine import Engine
    from llaisys_models.serve.server import Server
    from llaisys_models.text.tokenizer import load_tokenizer

    model = llaisys_models.load(chat_model_dir, device=str(chat_server.engine.model.device))
    engine = Engine(model, load_tokenizer(chat_model_dir), max_running=2, kv_memory=16 << 20)
    with BackgroundServer(Server(engine, load_tokenizer(chat_model_dir), CHAT_MODEL, api_keys=[KEY_A, KEY_B])) as s:
        yield s


@pytest.fixture
def submitted(monkeypatch):
    """Returns a list that collects each Request the given server's engine is handed."""
    def watch(server) -> list:
        seen, real = [], server.engine.submit

        def record(request):
            seen.append(request)
            real(request)
        monkeypatch.setattr(server.engine, "submit", record)
        return seen
    return watch


def bearer(key: str) -> dict:
    return {"Authorization": f"Bearer {key}"}


def test_each_key_is_a_tenant_with_its_own_cache_scope(keyed_server, submitted):
    seen = submitted(keyed_server.server)
    url = keyed_server.base_url
    for headers in [{}, bearer("wrong-key"), {"Authorization": KEY_A}]:
        error_of(http_request(url, "POST", CHAT, chat(), headers=headers), 401, None, "invalid_api_key")
    assert seen == []
    scopes = []
    for key, salt in [(KEY_A, None), (KEY_B, None), (KEY_A, "conversation-1"), (KEY_B, "conversation-1")]:
        body = chat() if salt is None else chat(cache_salt=salt)
        assert http_request(url, "POST", CHAT, body, headers=bearer(key)).status == 200
        scopes.append(seen[-1].cache_scope)
    digest_a, digest_b = (hashlib.sha256(k.encode()).hexdigest() for k in (KEY_A, KEY_B))
    assert scopes == [digest_a, digest_b, f"{digest_a}:conversation-1", f"{digest_b}:conversation-1"]
    assert not any(KEY_A in s or KEY_B in s for s in scopes)  # the key itself goes nowhere
    assert http_request(url, "GET", "/health").status == 200  # open without a key


def test_without_keys_everyone_is_one_tenant(chat_server, submitted):
    seen = submitted(chat_server.server)
    for body in [chat(), chat(cache_salt="s" * 256)]:
        assert http_request(chat_server.base_url, "POST", CHAT, body).status == 200
    assert [r.cache_scope for r in seen] == ["", ":" + "s" * 256]


@pytest.mark.parametrize("salt, code", [("", "invalid_value"), ("s" * 257, "invalid_value"), (7, "invalid_type"),
                                        ("a\ud800", "invalid_text")])
def test_bad_cache_salt(chat_server, salt, code):
    raw = json.dumps(chat(cache_salt=salt)).encode()
    error_of(http_request(chat_server.base_url, "POST", CHAT, raw=raw), 400, "cache_salt", code)


@pytest.mark.parametrize("key", ["", " padded", "line\nbreak"])
def test_server_refuses_a_key_no_client_can_send(key):
    from llaisys_models.serve.server import Server

    with pytest.raises(ValueError, match="empty" if not key else "spaces or holds control"):
        Server(None, None, CHAT_MODEL, api_keys=[KEY_A, key])


# -- D: a client's misbehaviour is a 4xx (or a disconnect), never a 500 or a traceback ----------------------

class Records(logging.Handler):
    def __init__(self):
        super().__init__(logging.DEBUG)
        self.records = []

    def emit(self, record):
        self.records.append(record)


def test_client_hanging_up_during_upload_is_a_disconnect_not_an_error(chat_server):
    handler = Records()
    loggers = [logging.getLogger(name) for name in ("llaisys.serve", "uvicorn.error", "uvicorn")]
    for logger in loggers:
        logger.addHandler(handler)
    before = metric(chat_server, "llaisys_http_client_disconnects_total")
    try:
        with socket.create_connection(("127.0.0.1", chat_server.port), timeout=30) as s:
            s.sendall(f"POST {CHAT} HTTP/1.1\r\nHost: 127.0.0.1:{chat_server.port}\r\n"
                      f"Content-Type: application/json\r\nContent-Length: 100000\r\n\r\n".encode() + b'{"model": "ti')
        assert wait_until(lambda: metric(chat_server, "llaisys_http_client_disconnects_total") == before + 1)
    finally:
        for logger in loggers:
            logger.removeHandler(handler)
    lines = [r.getMessage() for r in handler.records]
    assert len([line for line in lines if "hung up" in line]) == 1, lines
    assert not any(r.exc_info or r.levelno >= logging.ERROR for r in handler.records), lines
    assert not any(k.startswith("llaisys_http_errors_total") and 'status="5' in k for k in chat_server.metrics())


# -- F: a page on another site cannot reach a server bound to 127.0.0.1 -------------------------------------

@pytest.mark.parametrize("host", ["127.0.0.1:{port}", "localhost:{port}", "LocalHost:{port}", "[::1]:{port}",
                                  "127.0.0.2:{port}"])
def test_loopback_host_names_are_served(chat_server, host):
    headers = {"Host": host.format(port=chat_server.port)}
    assert http_request(chat_server.base_url, "GET", "/health", headers=headers).status == 200


@pytest.mark.parametrize("host", ["evil.example:{port}", "evil.example", "127.0.0.1", "127.0.0.1:{other}",
                                  "localhost.evil.example:{port}", "127.0.0.1.nip.io:{port}", "0.0.0.0:{port}",
                                  "[::2]:{port}", "user@127.0.0.1:{port}", ""])
@pytest.mark.parametrize("method, path", [("GET", "/health"), ("GET", "/"), ("GET", "/v1/models"), ("POST", CHAT)])
def test_other_host_names_are_refused(chat_server, submitted, host, method, path):
    """A DNS-rebound name (the page's own origin, so no CORS check applies) gets 421 from every route."""
    seen = submitted(chat_server.server)
    headers = {"Host": host.format(port=chat_server.port, other=chat_server.port + 1)}
    r = http_request(chat_server.base_url, method, path, chat() if method == "POST" else None, headers=headers)
    assert "this server answers requests for localhost:" in error_of(r, 421, None, "invalid_host")
    assert seen == []


def test_request_without_a_host_header_is_refused(chat_server):
    with socket.create_connection(("127.0.0.1", chat_server.port), timeout=30) as s:
        s.sendall(b"GET /health HTTP/1.0\r\n\r\n")
        response = b""
        while data := s.recv(65536):
            response += data
    head, _, body = response.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 421") and json.loads(body)["error"]["code"] == "invalid_host"


def test_any_host_is_served_when_bound_beyond_loopback(chat_server, monkeypatch):
    monkeypatch.setattr(chat_server.server, "host", "0.0.0.0")
    headers = {"Host": f"my-server.example:{chat_server.port}"}
    assert http_request(chat_server.base_url, "GET", "/health", headers=headers).status == 200


@pytest.mark.parametrize("content_type", ["text/plain", "application/x-www-form-urlencoded", "multipart/form-data",
                                          "", "application/jsonx", "text/plain; a=application/json"])
def test_post_must_be_json(chat_server, submitted, content_type):
    """The content types a cross-origin page may send without a CORS preflight (and others) get 415."""
    seen = submitted(chat_server.server)
    r = http_request(chat_server.base_url, "POST", CHAT, chat(), headers={"Content-Type": content_type})
    error_of(r, 415, None, "unsupported_media_type")
    assert seen == []


@pytest.mark.parametrize("content_type", ["application/json; charset=utf-8", "Application/JSON"])
def test_json_content_types_are_accepted(chat_server, content_type):
    r = http_request(chat_server.base_url, "POST", CHAT, chat(), headers={"Content-Type": content_type})
    assert r.status == 200 and r.json()["usage"]["completion_tokens"] == 1


@pytest.mark.parametrize("method, path", [("GET", "/v1/models/"), ("POST", CHAT + "/"), ("GET", "/health/")])
def test_no_trailing_slash_redirects(chat_server, method, path):
    headers = {"Host": f"localhost:{chat_server.port}"}
    r = http_request(chat_server.base_url, method, path, chat() if method == "POST" else None, headers=headers)
    assert r.status == 404 and "location" not in r.headers
    assert set(r.json()["error"]) == {"message", "type", "param", "code"}


def test_no_cors_headers(chat_server):
    origin = {"Origin": "http://evil.example"}
    preflight = http_request(chat_server.base_url, "OPTIONS", CHAT, headers={
        **origin, "Access-Control-Request-Method": "POST", "Access-Control-Request-Headers": "content-type"})
    simple = http_request(chat_server.base_url, "GET", "/v1/models", headers=origin)
    assert preflight.status >= 400 and simple.status == 200
    for r in (preflight, simple):
        assert not any(name.startswith("access-control-") for name in r.headers), r.headers
