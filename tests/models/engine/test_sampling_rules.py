"""The one table of sampling parameters' rules (engine/sampling_rules.py): the Python API checks by it, with the
rule's own words, and the rows say what the server's own ranges are and why."""

from __future__ import annotations

import numpy as np
import pytest

import llaisys
from llaisys_models.engine.penalties import check_logit_bias, check_repetition_penalty
from llaisys_models.engine.sampling import check_max_new_tokens, check_sampling
from llaisys_models.engine.sampling_rules import MASK64, RULES, Range, describe
from llaisys_models.engine.speculative import MAX_NUM_TOKENS

SAMPLING = {"top_k": 0, "top_p": 1.0, "temperature": 1.0, "seed": None}


@pytest.mark.parametrize("name, value, message", [
    ("temperature", -0.5, "temperature must be >= 0, got -0.5"),
    ("temperature", True, "temperature must be a finite number, got True"),
    ("top_p", 0, "top_p must be > 0 and <= 1, got 0"),
    ("top_k", -1, "top_k must be >= 0, got -1"),
    ("top_k", np.float32(2), "top_k must be an integer, got np.float32(2.0)"),
    ("seed", MASK64 + 1, f"seed must be >= 0 and <= {MASK64}, got {MASK64 + 1}"),
])
def test_check_sampling_says_the_rule(name, value, message):
    with pytest.raises(llaisys.LlaisysValueError) as e:
        check_sampling(**{**SAMPLING, name: value})
    assert str(e.value) == message


def test_every_check_of_the_python_api_is_a_row():
    with pytest.raises(llaisys.LlaisysValueError, match="^max_new_tokens must be >= 0, got -1$"):
        check_max_new_tokens(-1)
    with pytest.raises(llaisys.LlaisysValueError, match=r"^repetition_penalty must be > 0.0, got 0$"):
        check_repetition_penalty(0)
    with pytest.raises(llaisys.LlaisysValueError, match=r"^logit_bias\[3\] must be >= -100.0 and <= 100.0, got 101$"):
        check_logit_bias({3: 101}, 10)
    assert check_logit_bias({np.int64(3): np.float32(1.5)}, 10) == ((3, 1.5),)


def test_the_servers_range_says_why_where_it_differs():
    temperature = RULES["temperature"]
    assert temperature.range_complaint(3) is None  # the Python API: any temperature >= 0
    assert temperature.range_complaint(3, served=True) == "must be >= 0 and <= 2, got 3 (OpenAI's range)"
    assert RULES["top_p"].range_complaint(0, served=True) == RULES["top_p"].range_complaint(0)  # one rule for both
    assert RULES["n"].range_complaint(0, served=True) == "must be >= 1 and <= 128, got 0"  # the server's alone
    for rule in RULES.values():
        assert (rule.served is None) == (rule.why == ""), rule.name
        assert rule.range is not None or rule.served is not None, rule.name


def test_range_words():
    assert str(Range(0, 1, low_open=True)) == "> 0 and <= 1" and str(Range(-2.0, 2.0)) == ">= -2.0 and <= 2.0"
    assert Range(0, 1, low_open=True).holds(1) and not Range(0, 1, low_open=True).holds(0)


def test_the_table_is_written_out_and_matches_speculations_bound():
    assert RULES["num_speculative_tokens"].range == Range(1, MAX_NUM_TOKENS)
    text = describe()
    assert all(name in text for name in RULES) and "OpenAI's range" in text
