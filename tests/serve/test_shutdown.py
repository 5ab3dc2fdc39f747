"""SIGINT (Ctrl+C) and SIGTERM end ``llaisys serve`` at once and quietly (serve/shutdown.py): exit status 0, one
line saying so and no traceback; a stream still open ends with an error event (``server_shutdown``) and
``data: [DONE]``, a request not streamed gets a 503 in OpenAI's error shape.

The served model is the chat test model (conftest.py): no EOS, so a reply of thousands of tokens is still
streaming when the signal comes."""

from __future__ import annotations

import json
import signal
import threading
import time

import pytest

from helpers.serve_helpers import http_request, http_stream, require_serving, wait_until
from helpers.serve_process import ServeProcess

require_serving()

import openai  # noqa: E402

SIGNALS = [signal.SIGINT, signal.SIGTERM]
LONG = 3000  # tokens: a reply that streams for many seconds


def start(directory, chat_model_dir) -> ServeProcess:
    return ServeProcess(directory, "--model", str(chat_model_dir))


def running(server: ServeProcess) -> float:
    """The sequences its engine is generating (/metrics)."""
    text = http_request(server.base_url, "GET", "/metrics").text
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines() if line.startswith("llaisys_requests_running"))


def assert_ended_quietly(server: ServeProcess, sig) -> None:
    """It exits with status 0, saying why in one line, without a traceback."""
    assert server.wait_exit() == 0, server.log()
    log = server.log()
    assert f"llaisys serve: shutting down ({sig.name})" in log.splitlines()
    assert "Traceback" not in log and "Error" not in log, log


@pytest.mark.parametrize("sig", SIGNALS, ids=lambda s: s.name)
def test_idle_server_exits_at_once(chat_model_dir, tmp_path, sig):
    with start(tmp_path, chat_model_dir) as server:
        sent = time.monotonic()
        server.signal(sig)
        assert_ended_quietly(server, sig)
        print(f"{sig.name}: exited {time.monotonic() - sent:.2f} s after the signal")


def ask_in_background(server: ServeProcess, body: dict) -> list:
    """POST ``body`` (not streamed) on a thread; the list gets its Reply."""
    replies = []
    threading.Thread(target=lambda: replies.append(http_request(server.base_url, "POST", "/v1/chat/completions", body,
                                                                timeout=60)), daemon=True).start()
    return replies


def chat(max_tokens: int, **extra) -> dict:
    return {"messages": [{"role": "user", "content": "tell me everything"}], "max_tokens": max_tokens, **extra}


@pytest.mark.parametrize("sig", SIGNALS, ids=lambda s: s.name)
def test_open_requests_end_with_the_shutdown(chat_model_dir, tmp_path, sig):
    """A raw SSE stream ends with the error event then [DONE]; a request not streamed gets a 503."""
    with start(tmp_path, chat_model_dir) as server:
        waiting = ask_in_background(server, chat(LONG))
        with http_stream(server.base_url, "/v1/chat/completions", chat(LONG, stream=True), timeout=60) as response:
            assert response.status == 200
            for _ in range(4):  # the role's chunk, then tokens'
                assert response.readline().startswith(b"data: {")
                response.readline()
            assert wait_until(lambda: running(server) == 2)
            sent = time.monotonic()
            server.signal(sig)
            rest = [line.decode().strip() for line in iter(response.readline, b"")]
        ended = time.monotonic() - sent
        events = [line.removeprefix("data: ") for line in rest if line.startswith("data: ")]
        assert events[-1] == "[DONE]"
        error = json.loads(events[-2])["error"]
        assert error == {"message": "the server is shutting down", "type": "server_error", "param": None,
                         "code": "server_shutdown"}
        assert all("choices" in json.loads(event) for event in events[:-2])  # tokens until then
        assert wait_until(lambda: waiting, 30)
        assert waiting[0].status == 503 and waiting[0].json()["error"]["code"] == "server_shutdown"
        assert_ended_quietly(server, sig)
        assert '"finish": "shutdown"' in server.log() or "finish=shutdown" in server.log()
        print(f"{sig.name}: the stream ended {ended:.2f} s after the signal")


def test_the_openai_client_is_told_why_the_stream_ended(chat_model_dir, tmp_path):
    """The official client raises an APIError carrying the server's message (not a connection error)."""
    with start(tmp_path, chat_model_dir) as server:
        client = openai.OpenAI(base_url=server.base_url + "/v1", api_key="-", max_retries=0, timeout=60)
        model = client.models.list().data[0].id
        stream = client.chat.completions.create(model=model, messages=[{"role": "user", "content": "hi"}],
                                                max_tokens=LONG, stream=True)
        chunks = iter(stream)
        for _ in range(3):
            next(chunks)
        server.signal(signal.SIGTERM)
        with pytest.raises(openai.APIError, match="the server is shutting down") as raised:
            for _ in chunks:
                pass
        assert not isinstance(raised.value, openai.APIConnectionError)
        assert_ended_quietly(server, signal.SIGTERM)
