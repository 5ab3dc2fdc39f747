"""Every kind of bad request gets a 4xx with OpenAI's error body naming the problem; the server
keeps serving afterwards (no 500, no hang, no dead engine)."""

from __future__ import annotations

import json
import socket

import pytest

from helpers.serve_helpers import CHAT_MODEL, Reply, http_request, require_serving, user

require_serving()

import openai  # noqa: E402

from helpers.serve_helpers import CHAT, COMPLETIONS, chat, check_error_body  # noqa: E402

CONTEXT = 4096  # the chat model's max_position_embeddings


def without(body: dict, key: str) -> dict:
    return {k: v for k, v in body.items() if k != key}


# (id, path, body (dict -> JSON, bytes -> sent as is), status, param, code)
CASES = [
    ("malformed-json", CHAT, b'{"model": "tiny-chat", "messages": [', 400, None, "invalid_json"),
    ("not-utf8", CHAT, b'\xff\xfe{}', 400, None, "invalid_json"),
    ("nan", CHAT, b'{"model": "tiny-chat", "messages": [{"role": "user", "content": "x"}], "temperature": NaN}',
     400, None, "invalid_json"),
    ("body-not-object", CHAT, b'[1, 2]', 400, None, "invalid_type"),
    ("deeply-nested", CHAT, b'{"model": "tiny-chat", "messages": ' + b"[" * 100_000 + b"]" * 100_000 + b"}", 400, None,
     "invalid_json"),
    ("missing-messages", CHAT, without(chat(), "messages"), 400, "messages", "missing_required_parameter"),
    ("model-wrong-type", CHAT, chat(model=5), 400, "model", "invalid_type"),
    ("messages-wrong-type", CHAT, chat(messages="hi"), 400, "messages", "invalid_type"),
    ("message-not-object", CHAT, chat(messages=["hi"]), 400, "messages[0]", "invalid_type"),
    ("content-wrong-type", CHAT, chat(messages=[{"role": "user", "content": 5}]), 400, "messages[0].content",
     "invalid_type"),
    ("content-missing", CHAT, chat(messages=[{"role": "user"}]), 400, "messages[0].content",
     "missing_required_parameter"),
    ("image-part", CHAT, chat(messages=[{"role": "user", "content": [{"type": "image_url", "image_url": {}}]}]), 400,
     "messages[0].content[0].type", "unsupported_content"),
    ("empty-messages", CHAT, chat(messages=[]), 400, "messages", "empty_array"),
    ("too-many-messages", CHAT, chat(messages=user("") * 2049), 400, "messages", "array_too_long"),
    ("unknown-role", CHAT, chat(messages=[{"role": "wizard", "content": "x"}]), 400, "messages[0].role",
     "invalid_role"),
    ("role-wrong-type", CHAT, chat(messages=[{"role": 3, "content": "x"}]), 400, "messages[0].role", "invalid_type"),
    ("prompt-beyond-context", CHAT, chat(messages=user("x" * CONTEXT)), 400, "messages", "context_length_exceeded"),
    ("prompt-beyond-any-context", CHAT, chat(messages=user("x" * 3_900_000)), 400, "messages",
     "context_length_exceeded"),
    ("completion-ids-far-beyond-context", COMPLETIONS, {"model": CHAT_MODEL, "prompt": [65] * 500_000}, 400,
     "prompt", "context_length_exceeded"),
    ("max-tokens-zero", CHAT, chat(max_tokens=0), 400, "max_tokens", "invalid_value"),
    ("max-tokens-negative", CHAT, chat(max_tokens=-5), 400, "max_tokens", "invalid_value"),
    ("max-completion-tokens-zero", CHAT, chat(max_completion_tokens=0), 400, "max_completion_tokens", "invalid_value"),
    ("max-tokens-beyond-context", CHAT, chat(max_tokens=CONTEXT), 400, "max_tokens", "context_length_exceeded"),
    ("max-tokens-float", CHAT, chat(max_tokens=1.5), 400, "max_tokens", "invalid_type"),
    ("max-tokens-string", CHAT, chat(max_tokens="10"), 400, "max_tokens", "invalid_type"),
    ("temperature-string", CHAT, chat(temperature="hot"), 400, "temperature", "invalid_type"),
    ("temperature-range", CHAT, chat(temperature=3), 400, "temperature", "invalid_value"),
    ("top-p-zero", CHAT, chat(top_p=0), 400, "top_p", "invalid_value"),
    ("top-k-negative", CHAT, chat(top_k=-2), 400, "top_k", "invalid_value"),
    ("seed-string", CHAT, chat(seed="x"), 400, "seed", "invalid_type"),
    ("stream-string", CHAT, chat(stream="yes"), 400, "stream", "invalid_type"),
    ("stream-options-without-stream", CHAT, chat(stream_options={"include_usage": True}), 400, "stream_options",
     "invalid_value"),
    ("stop-wrong-type", CHAT, chat(stop=5), 400, "stop", "invalid_type"),
    ("too-many-stops", CHAT, chat(stop=["a", "b", "c", "d", "e"]), 400, "stop", "invalid_value"),
    ("n-zero", CHAT, chat(n=0), 400, "n", "invalid_value"),
    ("n-too-many", CHAT, chat(n=129), 400, "n", "invalid_value"),
    ("n-string", CHAT, chat(n="2"), 400, "n", "invalid_type"),
    ("n-times-prompts", COMPLETIONS, {"prompt": ["a"] * 3, "n": 100}, 400, "n", "invalid_value"),
    ("seed-above-int64", CHAT, chat(seed=1 << 63), 400, "seed", "invalid_value"),
    ("seed-below-int64", CHAT, chat(seed=-(1 << 63) - 1), 400, "seed", "invalid_value"),
    ("logprobs-wrong-type", CHAT, chat(logprobs=1), 400, "logprobs", "invalid_type"),
    ("top-logprobs-without-logprobs", CHAT, chat(top_logprobs=3), 400, "top_logprobs", "invalid_value"),
    ("top-logprobs-range", CHAT, chat(logprobs=True, top_logprobs=21), 400, "top_logprobs", "invalid_value"),
    ("completion-logprobs-range", COMPLETIONS, {"prompt": "a", "logprobs": 6}, 400, "logprobs", "invalid_value"),
    ("penalty-range", CHAT, chat(presence_penalty=2.5), 400, "presence_penalty", "invalid_value"),
    ("unknown-model", CHAT, chat(model="gpt-9"), 404, "model", "model_not_found"),
    ("model-lone-surrogate", CHAT, json.dumps(chat(model="\ud800")).encode(), 400, "model", "invalid_text"),
    ("oversized-body", CHAT, chat(messages=user("x" * (5 << 20))), 413, None, "request_too_large"),
    ("completion-missing-prompt", COMPLETIONS, {"model": CHAT_MODEL}, 400, "prompt", "missing_required_parameter"),
    ("completion-empty-prompt", COMPLETIONS, {"model": CHAT_MODEL, "prompt": ""}, 400, "prompt", "empty_prompt"),
    ("completion-lone-surrogate", COMPLETIONS, json.dumps({"model": CHAT_MODEL, "prompt": "a\ud800b"}).encode(), 400,
     "prompt", "invalid_text"),
    ("message-lone-surrogate", CHAT, json.dumps(chat(messages=user("a\udcffb"))).encode(), 400,
     "messages[0].content", "invalid_text"),
    ("completion-bad-token-id", COMPLETIONS, {"model": CHAT_MODEL, "prompt": [1, 2, 99999]}, 400, "prompt",
     "invalid_value"),
    ("completion-prompt-wrong-type", COMPLETIONS, {"model": CHAT_MODEL, "prompt": {"text": "x"}}, 400, "prompt",
     "invalid_type"),
    ("completion-prompts-mixed", COMPLETIONS, {"prompt": ["a", 5]}, 400, "prompt", "invalid_type"),
    ("completion-prompts-bad-id", COMPLETIONS, {"prompt": ["a", [1, 99999]]}, 400, "prompt[1]", "invalid_value"),
    ("completion-prompts-empty-item", COMPLETIONS, {"prompt": ["a", []]}, 400, "prompt[1]", "invalid_type"),
    ("completion-prompts-empty-text", COMPLETIONS, {"prompt": ["a", ""]}, 400, "prompt[1]", "empty_prompt"),
    ("completion-prompts-too-many", COMPLETIONS, {"prompt": ["a"] * 65}, 400, "prompt", "array_too_long"),
    ("completion-prompts-beyond-context", COMPLETIONS, {"prompt": ["a", [65] * CONTEXT]}, 400, "prompt[1]",
     "context_length_exceeded"),
    ("completion-best-of", COMPLETIONS, {"prompt": "x", "n": 2, "best_of": 3}, 400, "best_of",
     "unsupported_parameter"),
    ("completion-beyond-context", COMPLETIONS, {"model": CHAT_MODEL, "prompt": [65] * CONTEXT}, 400, "prompt",
     "context_length_exceeded"),
    ("completion-echo", COMPLETIONS, {"model": CHAT_MODEL, "prompt": "x", "echo": True}, 400, "echo",
     "unsupported_parameter"),
]


def post(server, path: str, body) -> Reply:
    """POST a dict as JSON, or bytes as they are."""
    if isinstance(body, bytes):
        return http_request(server.base_url, "POST", path, raw=body)
    return http_request(server.base_url, "POST", path, body)


@pytest.mark.parametrize("path, body, status, param, code", [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_bad_request_gets_openai_error(chat_server, path, body, status, param, code):
    check_error_body(post(chat_server, path, body), status, param, code)


def test_error_message_names_the_problem(chat_server):
    r = post(chat_server, CHAT, json.dumps(chat(model="a\ud800b")).encode())
    assert "'model'" in r.json()["error"]["message"] and "\\ud800" in r.json()["error"]["message"]
    r = post(chat_server, CHAT, chat(messages=[{"role": "wizard", "content": "x"}]))
    assert "'wizard'" in r.json()["error"]["message"] and "user" in r.json()["error"]["message"]
    r = post(chat_server, CHAT, chat(max_tokens=CONTEXT))
    assert str(CONTEXT) in r.json()["error"]["message"]


def test_oversized_declared_length_is_refused_before_reading(chat_server):
    """A Content-Length over the limit is answered 413 before any of the body is sent."""
    with socket.create_connection(("127.0.0.1", chat_server.port), timeout=30) as s:
        s.sendall(f"POST {CHAT} HTTP/1.1\r\nHost: 127.0.0.1:{chat_server.port}\r\nContent-Type: application/json\r\n"
                  f"Content-Length: {64 << 20}\r\n\r\n".encode())
        response = b""
        while b"}}" not in response:  # the JSON error body ends with "}}"
            data = s.recv(65536)
            if not data:
                break
            response += data
    head, _, body = response.decode(errors="replace").partition("\r\n\r\n")
    assert head.startswith("HTTP/1.1 413"), head
    assert json.loads(body)["error"]["code"] == "request_too_large"


def test_unknown_route_and_method(chat_server):
    check_error_body(http_request(chat_server.base_url, "GET", "/v1/nothing"), 404, None, None)
    r = http_request(chat_server.base_url, "GET", CHAT)
    assert r.status == 405 and set(r.json()["error"]) == {"message", "type", "param", "code"}


def test_client_raises_the_matching_error(chat_server):
    client = chat_server.client()
    with pytest.raises(openai.BadRequestError, match="at least one message"):
        client.chat.completions.create(model=CHAT_MODEL, messages=[])
    with pytest.raises(openai.NotFoundError):
        client.chat.completions.create(model="nope", messages=user("x"))


def test_still_serving_after_bad_requests(chat_server):
    for _, path, body, *_ in CASES:  # every bad request again, back to back
        assert post(chat_server, path, body).status < 500
    r = chat_server.client().chat.completions.create(model=CHAT_MODEL, messages=user("fine?"), max_tokens=4,
                                                     temperature=0)
    assert r.choices[0].finish_reason == "length" and r.usage.completion_tokens == 4
    m = chat_server.metrics()
    assert m[f'llaisys_requests_finished_total{{model="{CHAT_MODEL}",reason="error"}}'] == 0
    assert not any(k.startswith("llaisys_http_errors_total") and 'status="5' in k for k in m)
    assert http_request(chat_server.base_url, "GET", "/health").json()["status"] == "ok"
