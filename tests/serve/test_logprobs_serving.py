"""Log-probabilities over the API through the official client: chat's ``logprobs`` / ``top_logprobs`` and
completions' ``logprobs: k``, streamed and not (a seeded request streams what it returns whole), the chosen
token among its alternatives with the same log-probability, alternatives sorted, the tokens spelling the text;
``logprobs`` absent gives null; bad values get a 400 naming the ``param``."""

from __future__ import annotations

import math

import pytest

from helpers.serve_helpers import CHAT_MODEL, http_request, require_serving, user

require_serving()

from helpers.serve_helpers import CHAT, COMPLETIONS, chat, check_error_body  # noqa: E402


@pytest.fixture(scope="module")
def client(chat_server):
    return chat_server.client()


def check_entry(token: str, logprob: float, top: list[tuple[str, float]], k: int):
    assert logprob <= 0.0 and len(top) == k
    values = [lp for _, lp in top]
    assert values == sorted(values, reverse=True)
    assert sum(math.exp(v) for v in values) <= 1.0 + 1e-5
    if k and logprob >= values[-1]:  # the chosen token is among the alternatives, with its own log-probability
        assert dict(top)[token] == pytest.approx(logprob, abs=1e-6)


def chat_logprobs(client, stream: bool, **kwargs):
    r = client.chat.completions.create(model=CHAT_MODEL, messages=user("Count to five."), max_tokens=12,
                                       logprobs=True, stream=stream, **kwargs)
    if not stream:
        return r.choices[0].message.content, r.choices[0].logprobs.content
    text, content = "", []
    for c in r:
        if c.choices:
            text += c.choices[0].delta.content or ""
            content += c.choices[0].logprobs.content if c.choices[0].logprobs else []
    return text, content


@pytest.mark.parametrize("sampling", [dict(temperature=0), dict(temperature=0.8, seed=7)], ids=["greedy", "seeded"])
def test_chat_logprobs_streamed_equal_whole(client, sampling):
    text, whole = chat_logprobs(client, False, top_logprobs=4, **sampling)
    streamed_text, streamed = chat_logprobs(client, True, top_logprobs=4, **sampling)
    assert streamed_text == text and len(whole) == 12
    assert [e.model_dump() for e in streamed] == [e.model_dump() for e in whole]
    assert "".join(e.token for e in whole) == text
    for e in whole:
        assert e.bytes == list(e.token.encode())
        check_entry(e.token, e.logprob, [(t.token, t.logprob) for t in e.top_logprobs], 4)
        if sampling["temperature"] == 0:  # greedy: the chosen token is the most probable
            assert e.top_logprobs[0].token == e.token


def test_chat_logprobs_without_top_and_off(client):
    _, content = chat_logprobs(client, False, temperature=0)
    assert content and all(e.top_logprobs == [] for e in content)
    r = client.chat.completions.create(model=CHAT_MODEL, messages=user("Hi"), max_tokens=4, temperature=0)
    assert r.choices[0].logprobs is None


@pytest.mark.parametrize("k", [0, 5])
def test_completions_logprobs_streamed_equal_whole(client, k):
    args = dict(model=CHAT_MODEL, prompt="Once upon a time", max_tokens=10, temperature=0.9, seed=3, logprobs=k)
    whole = client.completions.create(**args)
    lp = whole.choices[0].logprobs
    tokens, values, tops, offsets = [], [], [], []
    for c in client.completions.create(stream=True, **args):
        if c.choices and c.choices[0].logprobs:
            part = c.choices[0].logprobs
            tokens += part.tokens
            values += part.token_logprobs
            tops += part.top_logprobs
            offsets += part.text_offset
    assert (tokens, values, tops, offsets) == (lp.tokens, lp.token_logprobs, lp.top_logprobs, lp.text_offset)
    assert "".join(lp.tokens) == whole.choices[0].text and len(lp.tokens) == 10
    assert lp.text_offset == [sum(len(t) for t in lp.tokens[:i]) for i in range(10)]
    for token, value, top in zip(lp.tokens, lp.token_logprobs, lp.top_logprobs):
        check_entry(token, value, sorted(top.items(), key=lambda kv: -kv[1]), k)


def test_speculative_requests_get_logprobs_too(client):
    base = dict(model=CHAT_MODEL, prompt="ab ab ab ab ab ab", max_tokens=10, temperature=0, logprobs=2)
    plain = client.completions.create(**base).choices[0].logprobs
    spec = client.completions.create(**base, extra_body={"speculative": "ngram"}).choices[0].logprobs
    assert spec.tokens == plain.tokens
    assert spec.token_logprobs == pytest.approx(plain.token_logprobs, abs=1e-4)


@pytest.mark.parametrize("path, body, param, code", [
    (CHAT, chat(top_logprobs=2), "top_logprobs", "invalid_value"),
    (CHAT, chat(logprobs=False, top_logprobs=2), "top_logprobs", "invalid_value"),
    (CHAT, chat(logprobs=True, top_logprobs=21), "top_logprobs", "invalid_value"),
    (CHAT, chat(logprobs=True, top_logprobs=-1), "top_logprobs", "invalid_value"),
    (CHAT, chat(logprobs="yes"), "logprobs", "invalid_type"),
    (COMPLETIONS, {"model": CHAT_MODEL, "prompt": "x", "logprobs": 6}, "logprobs", "invalid_value"),
    (COMPLETIONS, {"model": CHAT_MODEL, "prompt": "x", "logprobs": True}, "logprobs", "invalid_type"),
], ids=["top-without-logprobs", "top-with-false", "top-range", "top-negative", "logprobs-type", "completion-range",
        "completion-type"])
def test_bad_logprobs_get_400_naming_the_param(chat_server, path, body, param, code):
    check_error_body(http_request(chat_server.base_url, "POST", path, body), 400, param, code)
