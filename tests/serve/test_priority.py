"""A request's ``priority`` (vLLM's field: lower is scheduled first): a request may put itself after others (batch
work), never before them, on every endpoint; the engine gives a completions request's prompts one fair share."""

from __future__ import annotations

import queue

import pytest

from helpers.serve_helpers import require_serving

require_serving()

import llaisys_models  # noqa: E402
from helpers.serve_helpers import (  # noqa: E402
    CHAT,
    CHAT_MODEL,
    COMPLETIONS,
    chat,
    chat_ids,
    check_error_body,
    events_until_done,
    http_request,
    user,
)
from llaisys_models.serve.engine import Delta, Engine, Request, SamplingParams  # noqa: E402
from llaisys_models.text.tokenizer import load_tokenizer  # noqa: E402

RESPONSES = "/v1/responses"


def bodies(**fields) -> dict[str, dict]:
    return {CHAT: chat(max_tokens=2, **fields),
            COMPLETIONS: {"model": CHAT_MODEL, "prompt": "hi", "max_tokens": 2, **fields},
            RESPONSES: {"model": CHAT_MODEL, "input": "hi", "max_output_tokens": 2, **fields}}


@pytest.mark.parametrize("path", [CHAT, COMPLETIONS, RESPONSES])
def test_a_request_may_lower_its_priority(chat_server, path):
    r = http_request(chat_server.base_url, "POST", path, bodies(priority=7)[path])
    assert r.status == 200, r.text


@pytest.mark.parametrize("path", [CHAT, COMPLETIONS, RESPONSES])
@pytest.mark.parametrize("value, code", [(-1, "invalid_value"), (1 << 31, "invalid_value"), ("high", "invalid_type"),
                                         (1.5, "invalid_type")])
def test_a_request_cannot_go_before_others(chat_server, path, value, code):
    r = http_request(chat_server.base_url, "POST", path, bodies(priority=value)[path])
    error = check_error_body(r, 400, "priority", code)
    assert "'priority'" in error["message"]


@pytest.fixture(scope="module")
def engine_model(chat_model_dir):
    return llaisys_models.load(chat_model_dir)


def test_the_lower_priority_request_waits_for_a_slot(engine_model, chat_model_dir, tokenizer):
    """One slot: of two requests queued together, the later one with the lower value runs first."""
    engine = Engine(engine_model, load_tokenizer(chat_model_dir), max_running=1)
    try:
        log: queue.Queue = queue.Queue()
        for name, priority in (("batch", 5), ("chat", 0)):
            engine.submit(Request(chat_ids(tokenizer, user(name)), SamplingParams(max_tokens=3, temperature=0),
                                  lambda e, name=name: log.put((name, e)), priority=priority))
        engine.start()
        events = events_until_done(log, 2)
        assert [name for name, e in events if not isinstance(e, Delta)] == ["chat", "batch"]
    finally:
        engine.stop()


def test_the_prompts_of_one_request_share_one_fair_share(engine_model, chat_model_dir, tokenizer):
    """Two slots, a request of three prompts (one leader and two followers) and a request of one: the single
    prompt gets the second slot before the request's other prompts do."""
    engine = Engine(engine_model, load_tokenizer(chat_model_dir), max_running=2)
    try:
        log: queue.Queue = queue.Queue()
        leader = None
        for i in range(3):
            request = Request(chat_ids(tokenizer, user(f"list {i}")), SamplingParams(max_tokens=3, temperature=0),
                              lambda e, i=i: log.put((f"list {i}", e)), leader=leader)
            leader = leader or request
            engine.submit(request)
        engine.submit(Request(chat_ids(tokenizer, user("alone")), SamplingParams(max_tokens=3, temperature=0),
                              lambda e: log.put(("alone", e))))
        engine.start()
        events = events_until_done(log, 4)
        ended = [name for name, e in events if not isinstance(e, Delta)]
        assert ended.index("alone") < ended.index("list 1") and ended.index("alone") < ended.index("list 2")
    finally:
        engine.stop()
