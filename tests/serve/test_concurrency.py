"""Concurrent clients each get their own answer; a client that leaves frees the engine."""

from __future__ import annotations

import pytest

from helpers.serve_helpers import (
    CHAT_MODEL,
    chat_ids,
    generate_text,
    http_request,
    http_stream,
    require_serving,
    stream_chats_at_once,
    user,
    wait_until,
)

require_serving()

LONG = 3000  # max_tokens of a reply that is cut short by its client (it would take many seconds)


def counter(chat_server, name: str, **labels) -> float:
    label_text = ",".join(f'{k}="{v}"' for k, v in {"model": CHAT_MODEL, **labels}.items())
    return chat_server.metrics()[f"{name}{{{label_text}}}"]



def test_eight_concurrent_streams_get_their_own_replies(chat_server, chat_reference, tokenizer):
    n = 8
    conversations = [user(f"Stream {i}: " + "xyz"[i % 3] * (3 * i + 1)) for i in range(n)]
    max_tokens = [12 + 2 * i for i in range(n)]
    want = [generate_text(chat_reference, tokenizer, chat_ids(tokenizer, m), k)
            for m, k in zip(conversations, max_tokens)]
    results = stream_chats_at_once(chat_server, [
        dict(model=CHAT_MODEL, messages=m, max_tokens=k, temperature=0) for m, k in zip(conversations, max_tokens)])
    assert results == want
    assert counter(chat_server, "llaisys_requests_running") == 0


def long_request(stream: bool) -> dict:
    return {"model": CHAT_MODEL, "messages": user("Talk for a long time."), "max_tokens": LONG, "temperature": 0,
            "stream": stream}


@pytest.mark.parametrize("stream", [True, False], ids=["streamed", "not-streamed"])
def test_disconnect_cancels_the_request(chat_server, stream):
    cancelled = counter(chat_server, "llaisys_requests_finished_total", reason="cancelled")
    generated = counter(chat_server, "llaisys_generation_tokens_total")
    path = "/v1/chat/completions"
    if stream:
        with http_stream(chat_server.base_url, path, long_request(True)) as r:
            texts = (line for line in iter(r.readline, b"") if b'"content":"' in line and b'"content":""' not in line)
            next(texts)  # the first text arrived: the reply is under way; now hang up
    else:
        with pytest.raises(TimeoutError):  # the client gives up waiting and closes its connection
            http_request(chat_server.base_url, "POST", path, long_request(False), timeout=0.5)
    assert wait_until(lambda: counter(chat_server, "llaisys_requests_finished_total", reason="cancelled")
                      == cancelled + 1), "the engine did not cancel the request of a client that went away"
    assert counter(chat_server, "llaisys_requests_running") == 0
    assert counter(chat_server, "llaisys_generation_tokens_total") - generated < LONG // 2
    r = chat_server.client().chat.completions.create(model=CHAT_MODEL, messages=user("Still there?"), max_tokens=3,
                                                     temperature=0)
    assert r.usage.completion_tokens == 3
    assert http_request(chat_server.base_url, "GET", "/health").status == 200
