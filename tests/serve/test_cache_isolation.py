"""The prefix cache leaks nothing between tenants: the probe that recovered another client's secret from
``cached_tokens`` (a known prefix + a candidate character, max_tokens 1, watching the count rise by one)
recovers nothing.

Two defences, each tested: a request reuses only blocks cached in its own cache scope (its tenant: the
API key it authenticated with, plus an optional ``cache_salt``), and the count a response reports is in
whole KV blocks, so even inside one scope it does not move with one more matching character.
"""

from __future__ import annotations

import queue
import string

import pytest

from helpers.serve_helpers import TIMEOUT, require_serving

require_serving()

import llaisys_models  # noqa: E402
from llaisys_models.engine.sampling import SamplingParams  # noqa: E402
from llaisys_models.serve.engine import Delta, Engine, Finished, Request  # noqa: E402
from llaisys_models.text.tokenizer import load_tokenizer  # noqa: E402

KNOWN = "my door code is "  # what the attacker knows of the victim's message
SECRET = "4821 93"
BLOCK = 16


@pytest.fixture(scope="module")
def engine(chat_model_dir):
    engine = Engine(llaisys_models.load(chat_model_dir), load_tokenizer(chat_model_dir), block_size=BLOCK,
                    kv_memory=32 << 20).start()
    yield engine
    engine.stop()


def cached_tokens(engine, tokenizer, text: str, scope: str) -> int:
    """Send ``text`` (max_tokens 1) in ``scope``; the cached tokens its response reports."""
    events: queue.Queue = queue.Queue()
    ids = tokenizer(text, add_special_tokens=False)["input_ids"]
    engine.submit(Request(ids, SamplingParams(max_tokens=1, temperature=0), events.put, cache_scope=scope))
    while True:
        event = events.get(timeout=TIMEOUT)
        if not isinstance(event, Delta):
            assert isinstance(event, Finished), event
            return event.usage.cached_tokens


def probe(engine, tokenizer, scope: str) -> str:
    """The attack: extend the known prefix one character at a time, keeping the candidate whose probe
    reports more cached tokens than the others; returns what it recovered (stops when no candidate stands out)."""
    recovered = ""
    for _ in SECRET:
        counts = {c: cached_tokens(engine, tokenizer, KNOWN + recovered + c + "#" * 8, scope)
                  for c in string.digits + " "}
        best = max(counts.values())
        leaders = [c for c, n in counts.items() if n == best]
        if len(leaders) != 1:
            return recovered
        recovered += leaders[0]
    return recovered


def test_another_tenant_recovers_nothing(engine, tokenizer):
    cached_tokens(engine, tokenizer, KNOWN + SECRET + ", please remember it", scope="victim")
    assert probe(engine, tokenizer, scope="attacker") == ""
    # the victim's whole message again, from other tenants: a fresh one reuses nothing of the victim's blocks,
    # the attacker only the block its own probes cached (KNOWN), not the victim's second one
    message = KNOWN + SECRET + ", please remember it"
    assert cached_tokens(engine, tokenizer, message, scope="stranger") == 0
    assert cached_tokens(engine, tokenizer, message, scope="attacker") == BLOCK
    assert cached_tokens(engine, tokenizer, message, scope="victim") == 2 * BLOCK


def test_within_a_tenant_counts_move_only_by_whole_blocks(engine, tokenizer):
    message = KNOWN + SECRET + ", please remember it"
    cached_tokens(engine, tokenizer, message, scope="team")
    again = cached_tokens(engine, tokenizer, message, scope="team")
    assert again > 0 and again % BLOCK == 0  # the same tenant does reuse its cache
    # KNOWN is 16 characters: the secret's characters sit inside the second block, so one more matching
    # character changes no whole-block count: the probe learns nothing there either
    assert probe(engine, tokenizer, scope="team") == ""
