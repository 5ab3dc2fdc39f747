"""The server under attack (issue 27): a client's misbehaviour is never a 500."""

from __future__ import annotations

import json
import logging
import socket
import time

from serve_helpers import CHAT_MODEL, require_serving, user

require_serving()


CHAT = "/v1/chat/completions"


def chat(**fields) -> dict:
    return {"model": CHAT_MODEL, "messages": user("hi"), "max_tokens": 1, "temperature": 0, **fields}


def error_of(r, status: int, param, code) -> str:
    """The message of an OpenAI error body with this status, param and code (the body strict UTF-8 JSON)."""
    assert r.status == status, r.text
    error = json.loads(r.body.decode("utf-8"))["error"]
    assert (error["param"], error["code"]) == (param, code), error
    return error["message"]


def wait_until(condition, timeout: float = 30.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(0.05)
    return False


def metric(server, name: str) -> float:
    return server.metrics().get(f'{name}{{model="{CHAT_MODEL}"}}', 0)


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
