"""``--cors-origin``: the named origins' preflights are answered (before any API key is asked for) and their
requests get Access-Control headers; other origins get none; bad origins are refused at start-up."""

from __future__ import annotations

import pytest

import llaisys
import llaisys_models
from helpers.serve_helpers import API_KEY, CHAT_MODEL, http_request, require_serving, user

require_serving()

ALLOWED = "https://app.example"
CHAT = "/v1/chat/completions"


@pytest.fixture(scope="module")
def cors_server(chat_model_dir):
    from llaisys_models.serve.background import BackgroundServer
    from llaisys_models.serve.engine import Engine
    from llaisys_models.serve.server import Server
    from llaisys_models.text.tokenizer import load_tokenizer

    engine = Engine(llaisys_models.load(chat_model_dir), load_tokenizer(chat_model_dir), max_running=2,
                    kv_memory=8 << 20)
    server = Server(engine, load_tokenizer(chat_model_dir), CHAT_MODEL, api_keys=[API_KEY],
                    cors_origins=[ALLOWED, "http://localhost:5173"])
    with BackgroundServer(server) as running:
        yield running


def preflight(server, origin: str):
    return http_request(server.base_url, "OPTIONS", CHAT, headers={
        "Origin": origin, "Access-Control-Request-Method": "POST",
        "Access-Control-Request-Headers": "authorization, content-type"})


def test_an_allowed_origin_is_answered(cors_server):
    r = preflight(cors_server, ALLOWED)  # no API key: a browser sends none with a preflight
    assert r.status == 200, r.text
    assert r.headers["access-control-allow-origin"] == ALLOWED
    assert "POST" in r.headers["access-control-allow-methods"]
    assert {"authorization", "content-type"} <= {h.strip().lower() for h in
                                                 r.headers["access-control-allow-headers"].split(",")}
    body = {"model": CHAT_MODEL, "messages": user("cors"), "max_tokens": 2}
    r = http_request(cors_server.base_url, "POST", CHAT, body,
                     headers={"Origin": ALLOWED, "Authorization": f"Bearer {API_KEY}"})
    assert r.status == 200 and r.headers["access-control-allow-origin"] == ALLOWED
    r = http_request(cors_server.base_url, "POST", CHAT, body, headers={"Origin": ALLOWED})
    assert r.status == 401  # CORS opens the door to a page, not to the API without its key


def test_other_origins_get_no_access_control_headers(cors_server):
    for origin in ("https://evil.example", "https://app.example.evil", "http://app.example"):
        r = preflight(cors_server, origin)
        assert r.status >= 400 and "access-control-allow-origin" not in r.headers, (origin, r.headers)
        r = http_request(cors_server.base_url, "GET", "/v1/models", headers={
            "Origin": origin, "Authorization": f"Bearer {API_KEY}"})
        assert r.status == 200 and "access-control-allow-origin" not in r.headers


def test_cors_origin_flag_is_checked_and_repeatable():
    from llaisys.cli import build_parser
    from llaisys_models.serve.cli import check_origin

    args = build_parser().parse_args(["serve", "--cors-origin", ALLOWED, "--cors-origin", "http://localhost:5173"])
    assert args.cors_origin == [ALLOWED, "http://localhost:5173"]
    assert build_parser().parse_args(["serve"]).cors_origin == []  # none by default
    for origin in (ALLOWED, "http://localhost:5173", "*"):
        check_origin(origin)
    for bad in ("app.example", "https://app.example/", "ftp://x", "https://app.example/path", "https://u@app.example"):
        with pytest.raises(llaisys.LlaisysValueError, match="not an origin"):
            check_origin(bad)
