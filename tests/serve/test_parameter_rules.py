"""A sampling parameter has one rule, with one message, whether it comes to ``model.generate`` or in a request
(engine/sampling_rules.py): the server says the Python API's words, naming the field as its ``param``, and ends
with the reason where OpenAI's range is its own."""

from __future__ import annotations

import pytest

from helpers.serve_helpers import require_serving

require_serving()

import llaisys  # noqa: E402
from helpers.serve_helpers import CHAT, chat, http_request  # noqa: E402
from llaisys_models.engine.sampling_rules import RULES  # noqa: E402


@pytest.mark.parametrize("name, value", [("top_p", 0), ("top_p", 1.5), ("temperature", -1), ("top_k", -2),
                                         ("repetition_penalty", 0), ("frequency_penalty", -2.5),
                                         ("presence_penalty", 3), ("seed", -(1 << 63) - 1)])
def test_a_request_and_generate_are_told_the_same(chat_server, chat_reference, name, value):
    r = http_request(chat_server.base_url, "POST", CHAT, chat(**{name: value}))
    error = r.json()["error"]
    assert r.status == 400 and (error["param"], error["code"]) == (name, "invalid_value"), error
    rule = RULES[name]
    if rule.served is None:  # one range: the Python API's message, the name quoted as the server quotes fields
        with pytest.raises(llaisys.LlaisysValueError) as e:
            chat_reference.generate([65, 66], 1, **{name: value})
        assert error["message"] == str(e.value).replace(name, f"'{name}'", 1)
    else:  # the server's own range, and why
        assert error["message"] == f"'{name}' {rule.range_complaint(value, served=True)}"
        assert error["message"].endswith(f"({rule.why})")


def test_a_wrong_type_is_told_the_rules_words(chat_server):
    r = http_request(chat_server.base_url, "POST", CHAT, chat(temperature="hot"))
    assert r.json()["error"]["message"] == "'temperature' must be a finite number, got a string"
    r = http_request(chat_server.base_url, "POST", CHAT, chat(logit_bias={"65": "ban"}))
    assert r.json()["error"]["message"] == "'logit_bias[65]' must be a finite number, got a string"
