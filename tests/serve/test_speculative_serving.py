"""Speculative decoding in the server: the request fields and the server default give the same text and
usage as plain decoding (stop strings inside a verify step included), bad values get a 400 naming the
parameter, /metrics counts drafted and accepted tokens, and --speculative is parsed with clear errors."""

from __future__ import annotations

import argparse
import queue

import pytest

import llaisys
import llaisys_models
from helpers.serve_helpers import CHAT_MODEL, chat_ids, events_until_done, http_request, require_serving, submit, user
from llaisys_models.cli.speculative_flags import from_arguments as speculative_options
from llaisys_models.engine.speculative import NgramDrafter, Speculation
from llaisys_models.serve.engine import Delta, Engine, Finished
from llaisys_models.text.tokenizer import load_tokenizer

require_serving()

ECHO = "say it again: one two three four five six seven one two three four five six seven one two three"


@pytest.fixture(scope="module")
def spec_model(chat_model_dir):
    return llaisys_models.load(chat_model_dir)


def engine_text(model, directory, ids, max_tokens, speculation=None, stop=("seven",)):
    """The text, usage and scheduler stats of one greedy request through an engine of its own."""
    engine = Engine(model, load_tokenizer(directory)).start()
    try:
        log = queue.Queue()
        submit(engine, ids, max_tokens, log, temperature=0, stop=stop, speculation=speculation)
        events = events_until_done(log, 1)
        return ("".join(e.text for _, e in events if isinstance(e, Delta)),
                [e.usage for _, e in events if isinstance(e, Finished)], engine.scheduler.stats)
    finally:
        engine.stop()


def test_speculating_requests_give_the_plain_text_and_usage(spec_model, chat_model_dir, tokenizer):
    ids = chat_ids(tokenizer, user(ECHO))
    for stop in (("seven",), ()):  # a stop string may end the text inside a verify step
        plain = engine_text(spec_model, chat_model_dir, ids, 40, stop=stop)
        for k in (1, 4):
            spec = engine_text(spec_model, chat_model_dir, ids, 40, Speculation(NgramDrafter(), k), stop)
            assert spec[:2] == plain[:2]
            assert spec[2].draft_tokens > 0


def test_hf_numerics_refuse_a_speculative_engine(chat_model_dir):
    model = llaisys_models.load(chat_model_dir, numerics="hf")
    with pytest.raises(llaisys.LlaisysValueError, match="numerics='exact'"):
        Engine(model, load_tokenizer(chat_model_dir), speculation=Speculation(NgramDrafter()))
    assert Engine(model, load_tokenizer(chat_model_dir)).drafters == {}  # requests cannot ask for it either


def chat(**fields) -> dict:
    return {"model": CHAT_MODEL, "messages": user(ECHO), "max_tokens": 24, "temperature": 0, **fields}


@pytest.mark.parametrize("fields, param", [
    ({"speculative": "medusa"}, "speculative"),
    ({"speculative": "draft"}, "speculative"),  # no draft model on this server
    ({"speculative": 4}, "speculative"),
    ({"speculative": "ngram", "num_speculative_tokens": 0}, "num_speculative_tokens"),
    ({"speculative": "ngram", "num_speculative_tokens": 33}, "num_speculative_tokens"),
    ({"speculative": "ngram", "num_speculative_tokens": "4"}, "num_speculative_tokens"),
    ({"num_speculative_tokens": 4}, "num_speculative_tokens"),  # the server does not speculate by default
])
def test_bad_speculative_fields_get_a_400_naming_them(chat_server, fields, param):
    reply = http_request(chat_server.base_url, "POST", "/v1/chat/completions", chat(**fields))
    assert reply.status == 400, reply.text
    assert reply.json()["error"]["param"] == param


def test_a_request_may_speculate_and_metrics_count_it(chat_server):
    client = chat_server.client()
    plain = client.chat.completions.create(**chat())
    before = chat_server.metrics()
    draft_key = f'llaisys_spec_draft_tokens_total{{model="{CHAT_MODEL}"}}'
    accepted_key = f'llaisys_spec_accepted_tokens_total{{model="{CHAT_MODEL}"}}'
    for k in (2, 5):
        spec = client.chat.completions.create(**chat(), extra_body={"speculative": "ngram",
                                                                     "num_speculative_tokens": k})
        assert spec.choices[0].message.content == plain.choices[0].message.content
        assert spec.usage.completion_tokens == plain.usage.completion_tokens
    off = client.chat.completions.create(**chat(), extra_body={"speculative": "off"})
    assert off.choices[0].message.content == plain.choices[0].message.content
    after = chat_server.metrics()
    assert after[draft_key] > before[draft_key]
    assert before[accepted_key] <= after[accepted_key] <= after[draft_key]


def options(speculative=None, k=None):
    return argparse.Namespace(speculative=speculative, num_speculative_tokens=k)


def test_serve_flags(spec_model):
    assert speculative_options(options(), spec_model) == (None, None)
    spec, draft = speculative_options(options("ngram", 6), spec_model)
    assert isinstance(spec.drafter, NgramDrafter) and spec.num_tokens == 6 and draft is None
    for bad, match in [(options("medusa"), "--speculative"), (options("draft:"), "--speculative"),
                       (options(None, 3), "needs --speculative"), (options("ngram", 0), "num_speculative_tokens")]:
        with pytest.raises(llaisys.LlaisysValueError, match=match):
            speculative_options(bad, spec_model)


def test_the_server_default_applies_unless_a_request_says_otherwise():
    from llaisys_models.engine.sampling import SamplingParams
    from llaisys_models.serve.openai import sampling

    ngram = NgramDrafter()
    server = argparse.Namespace(speculation=Speculation(ngram, 3), drafters={"ngram": ngram})
    params = SamplingParams(8)
    assert sampling.speculation({}, params, server).speculation == Speculation(ngram, 3)
    assert sampling.speculation({"num_speculative_tokens": 5}, params, server).speculation == Speculation(ngram, 5)
    assert sampling.speculation({"speculative": "off"}, params, server).speculation is None
    assert sampling.speculation({}, params, argparse.Namespace(speculation=None, drafters={})).speculation is None
