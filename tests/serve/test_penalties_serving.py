"""Repetition control over the API: OpenAI's ``frequency_penalty``, ``presence_penalty`` and ``logit_bias``,
vLLM's ``repetition_penalty``, in chat and completions, streamed and not, through the official client: each
reply is ``model.generate`` with the same arguments; bad values get a 400 naming the ``param``."""

from __future__ import annotations

import pytest

from helpers.serve_helpers import CHAT_MODEL, chat_ids, generate_text, http_request, require_serving, text_ids, user

require_serving()

from helpers.serve_helpers import CHAT, COMPLETIONS, chat, check_error_body  # noqa: E402

PENALTIES = dict(frequency_penalty=0.6, presence_penalty=0.3, repetition_penalty=1.2)


@pytest.fixture(scope="module")
def client(chat_server):
    return chat_server.client()


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
def test_chat_penalties_and_bias_equal_generate(client, chat_reference, tokenizer, stream):
    messages = user("Say something, and say it again.")
    ids = chat_ids(tokenizer, messages)
    plain = generate_text(chat_reference, tokenizer, ids, 24)
    banned = ord(plain[0])  # the first byte greedy picks (one printable byte per token)
    want = generate_text(chat_reference, tokenizer, ids, 24, logit_bias={banned: -100}, **PENALTIES)
    assert want != plain and chr(banned) not in want
    r = client.chat.completions.create(model=CHAT_MODEL, messages=messages, max_tokens=24, temperature=0,
                                       frequency_penalty=0.6, presence_penalty=0.3, logit_bias={str(banned): -100},
                                       extra_body={"repetition_penalty": 1.2}, stream=stream)
    text = "".join(c.choices[0].delta.content or "" for c in r if c.choices) if stream else r.choices[0].message.content
    assert text == want


def test_completions_logit_bias_forces_a_token(client, chat_reference, tokenizer):
    ids = text_ids(tokenizer, "Once upon a time")
    r = client.completions.create(model=CHAT_MODEL, prompt="Once upon a time", max_tokens=8, temperature=0,
                                  logit_bias={"90": 100})
    assert r.choices[0].text == "Z" * 8
    r = client.completions.create(model=CHAT_MODEL, prompt="Once upon a time", max_tokens=16, temperature=0,
                                  frequency_penalty=1.0, extra_body={"repetition_penalty": 1.5})
    assert r.choices[0].text == generate_text(chat_reference, tokenizer, ids, 16, frequency_penalty=1.0,
                                              repetition_penalty=1.5)


@pytest.mark.parametrize("path, body, param, code", [
    (CHAT, chat(frequency_penalty=-2.5), "frequency_penalty", "invalid_value"),
    (CHAT, chat(frequency_penalty="high"), "frequency_penalty", "invalid_type"),
    (COMPLETIONS, {"model": CHAT_MODEL, "prompt": "x", "presence_penalty": 3}, "presence_penalty", "invalid_value"),
    (CHAT, chat(repetition_penalty=0), "repetition_penalty", "invalid_value"),
    (CHAT, chat(repetition_penalty=-1.5), "repetition_penalty", "invalid_value"),
    (CHAT, chat(logit_bias=[1, 2]), "logit_bias", "invalid_type"),
    (CHAT, chat(logit_bias={"65": 101}), "logit_bias", "invalid_value"),
    (CHAT, chat(logit_bias={"65": "ban"}), "logit_bias", "invalid_type"),
    (CHAT, chat(logit_bias={"384": 1}), "logit_bias", "invalid_value"),
    (CHAT, chat(logit_bias={"-1": 1}), "logit_bias", "invalid_value"),
    (CHAT, chat(logit_bias={"a": 1}), "logit_bias", "invalid_value"),
    (COMPLETIONS, {"model": CHAT_MODEL, "prompt": "x", "logit_bias": {str(i): 1 for i in range(301)}}, "logit_bias",
     "invalid_value"),
], ids=["freq-range", "freq-type", "presence-range", "repetition-zero", "repetition-negative", "bias-not-object",
        "bias-range", "bias-not-number", "bias-past-vocab", "bias-negative-id", "bias-not-id", "bias-too-many"])
def test_bad_penalties_get_400_naming_the_param(chat_server, path, body, param, code):
    check_error_body(http_request(chat_server.base_url, "POST", path, body), 400, param, code)


def test_neutral_values_are_accepted(client):
    r = client.chat.completions.create(model=CHAT_MODEL, messages=user("hi"), max_tokens=2, frequency_penalty=0,
                                       presence_penalty=0, logit_bias={}, extra_body={"repetition_penalty": 1})
    assert r.choices[0].finish_reason == "length"
