"""``llaisys serve --default-max-tokens N``: a request that sets no max_tokens (max_completion_tokens,
max_output_tokens) gets at most N tokens, or the room its prompt leaves in the context if that is less; a request
that sets one gets what it asks for (more than fits is still a 400).

The served model is the chat test model (conftest.py): it has no EOS, so a greedy reply runs exactly to its cap.
Its KV cache is kept small (--kv-memory), which makes its context (what /v1/models reports) short enough for a
prompt that fills it to be read quickly.
"""

from __future__ import annotations

import subprocess

import pytest

from helpers.serve_helpers import http_request, require_serving, user
from helpers.serve_process import ServeProcess, llaisys_command

require_serving()

import openai  # noqa: E402

import llaisys_models  # noqa: E402

CAP = 5


@pytest.fixture(scope="module")
def server(chat_model_dir, tmp_path_factory):
    with ServeProcess(tmp_path_factory.mktemp("cap"), "--model", str(chat_model_dir), "--kv-memory", "2MiB",
                      "--default-max-tokens", str(CAP)) as process:
        yield process


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=server.base_url + "/v1", api_key="-", max_retries=0, timeout=60)


@pytest.fixture(scope="module")
def card(server) -> dict:
    return http_request(server.base_url, "GET", "/v1/models").json()["data"][0]


@pytest.fixture(scope="module")
def model(card) -> str:
    return card["id"]


@pytest.fixture(scope="module")
def context(card) -> int:
    return card["max_model_len"]


def test_the_model_card_says_the_cap(server, card, context):
    assert card["default_max_tokens"] == CAP and context > 3 * CAP
    assert http_request(server.base_url, "GET", f"/v1/models/{card['id']}").json()["default_max_tokens"] == CAP


def test_chat_without_max_tokens_stops_at_the_cap(client, model):
    reply = client.chat.completions.create(model=model, messages=user("hello"), temperature=0)
    assert reply.choices[0].finish_reason == "length"
    assert reply.usage.completion_tokens == CAP


def test_streamed_chat_and_completions_without_max_tokens_stop_at_the_cap(client, model):
    stream = client.chat.completions.create(model=model, messages=user("hi"), temperature=0, stream=True,
                                            stream_options={"include_usage": True})
    chunks = list(stream)
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "length"
    assert chunks[-1].usage.completion_tokens == CAP
    completion = client.completions.create(model=model, prompt="once upon a time", temperature=0, n=2)
    assert [c.finish_reason for c in completion.choices] == ["length", "length"]
    assert completion.usage.completion_tokens == 2 * CAP


def test_responses_without_max_output_tokens_stop_at_the_cap(server):
    r = http_request(server.base_url, "POST", "/v1/responses", {"input": "hello", "temperature": 0})
    assert r.status == 200, r.text
    assert r.json()["status"] == "incomplete" and r.json()["usage"]["output_tokens"] == CAP


@pytest.mark.parametrize("name", ["max_tokens", "max_completion_tokens"])
def test_a_request_may_ask_for_more_than_the_cap(client, model, name):
    reply = client.chat.completions.create(model=model, messages=user("hello"), temperature=0, **{name: 3 * CAP})
    assert reply.choices[0].finish_reason == "length" and reply.usage.completion_tokens == 3 * CAP


def test_the_cap_is_at_most_the_room_left(server, context):
    """A prompt that leaves fewer tokens than the cap gets those (not a 400); one that leaves none is a 400."""
    for room in (CAP - 2, 1):
        r = http_request(server.base_url, "POST", "/v1/completions", {"prompt": [65] * (context - room),
                                                                      "temperature": 0})
        assert r.status == 200, r.text
        assert r.json()["usage"]["completion_tokens"] == room and r.json()["choices"][0]["finish_reason"] == "length"
    r = http_request(server.base_url, "POST", "/v1/completions", {"prompt": [65] * context})
    assert r.status == 400 and r.json()["error"]["code"] == "context_length_exceeded"


def test_an_explicit_max_tokens_past_the_context_is_still_refused(server, context):
    r = http_request(server.base_url, "POST", "/v1/completions", {"prompt": "hello", "max_tokens": context})
    assert r.status == 400 and r.json()["error"]["param"] == "max_tokens"


@pytest.mark.parametrize("value", ["0", "-3"])
def test_a_cap_below_one_is_refused_at_start_up(value):
    done = subprocess.run([llaisys_command(), "serve", "--default-max-tokens", value], capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 2
    assert done.stderr.strip() == f"llaisys: error: --default-max-tokens = {value} is out of range"


def test_replicas_get_the_cap_and_the_log_options(monkeypatch):
    """A replica on Ray builds its server with ``cli.load_server`` from the same options as ``llaisys serve``."""
    from llaisys.cli import build_parser
    from llaisys_models.serve import access_log
    from llaisys_models.serve.launch import load_server
    from llaisys_models.serve.tenancy import Tenants

    configured = []
    monkeypatch.setattr(access_log, "configure", lambda *options: configured.append(options))  # (this process's log)
    args = build_parser().parse_args(["serve", "--default-max-tokens", "7", "--log-level", "warning",
                                      "--log-format", "json"])
    server = load_server(args, llaisys_models.DEMO_MODEL_DIR, 1 << 20, Tenants(), 8000)
    assert server.default_max_tokens == 7 and configured == [("warning", "json")]
