"""What the replicas' prefix-aware router routes by (serve/replicas/routing.py) and remembers
(serve/replicas/prefix_index.py): no Ray needed."""

from __future__ import annotations

import hashlib
import json

import pytest

from helpers.serve_helpers import require_serving

require_serving()

from llaisys_models.serve.replicas.prefix_index import PrefixIndex  # noqa: E402
from llaisys_models.serve.replicas.routing import Route, route_of  # noqa: E402
from llaisys_models.serve.tenancy import Tenants  # noqa: E402

KEYS = ("key-of-a", "key-of-b")
TENANTS = Tenants.of_keys(KEYS)
CHAT = "/v1/chat/completions"


def chat_route(messages, key=KEYS[0], **fields) -> Route | None:
    body = json.dumps({"model": "m", "messages": messages, **fields}).encode()
    return route_of("POST", CHAT, f"Bearer {key}", body, TENANTS)


def test_a_chat_routes_by_its_tenant_and_messages():
    route = chat_route([{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}])
    assert route.scope == hashlib.sha256(KEYS[0].encode()).hexdigest()  # the tenant the replicas scope caches by
    assert route.text.startswith("system") and "Be brief." in route.text and "Hi" in route.text
    salted = chat_route([{"role": "user", "content": "Hi"}], cache_salt="s1")
    assert salted.scope == route.scope + ":s1"
    assert chat_route([{"role": "user", "content": "Hi"}], key=KEYS[1]).scope != route.scope


def test_a_next_turn_begins_with_the_turn_before_whatever_the_reply():
    first = [{"role": "user", "content": "Tell me a story"}]
    short = first + [{"role": "assistant", "content": "Once."}, {"role": "user", "content": "More"}]
    long = first + [{"role": "assistant", "content": "Once upon a time " * 100}, {"role": "user", "content": "More"}]
    turn1, turn2_short, turn2_long = chat_route(first), chat_route(short), chat_route(long)
    assert turn2_short.text == turn2_long.text  # the reply counts by its role alone
    assert turn2_long.text.startswith(turn1.text)
    assert len(turn1.text) / len(turn2_long.text) >= 0.1  # a share the router routes by (match_rate_threshold)


@pytest.mark.parametrize("method, path, authorization, body", [
    ("GET", "/v1/models", "Bearer key-of-a", b""),  # no prompt
    ("POST", CHAT, "Bearer wrong-key", b'{"messages": [{"role": "user", "content": "Hi"}]}'),  # a 401 to be
    ("POST", CHAT, "Bearer key-of-a", b'{"messages": [{"role": "user", "content": "Hi"}'),  # not JSON
    ("POST", CHAT, "Bearer key-of-a", b'{"messages": []}'),  # a 400 to be
    ("POST", "/v1/embeddings", "Bearer key-of-a", b'{"input": "Hi"}'),  # no such route here
])
def test_requests_without_a_route(method, path, authorization, body):
    assert route_of(method, path, authorization, body, TENANTS) is None


def test_completions_route_by_their_first_prompt():
    def route(prompt):
        return route_of("POST", "/v1/completions", "Bearer key-of-a", json.dumps({"prompt": prompt}).encode(), TENANTS)

    assert route("Once upon").text == "Once upon" and route("Once upon").boundary == ""
    assert route(["Once upon", "Other"]).text == "Once upon"
    ids = route([[5, 6, 7]])
    assert ids.text == "\x02" + "".join(map(chr, [5, 6, 7])) and ids.text != route("\x05\x06\x07").text


def test_a_chat_matches_whole_messages_only():
    route = chat_route([{"role": "user", "content": "What is the capital of France"}])
    other = chat_route([{"role": "user", "content": "What is the capital of Spain"}])
    common = next(i for i, (a, b) in enumerate(zip(route.text, other.text)) if a != b)
    assert common > 20 and other.whole(common) == 0  # they begin alike, but share no whole message
    follow_up = chat_route([{"role": "user", "content": "What is the capital of France"},
                            {"role": "assistant", "content": "Paris"}, {"role": "user", "content": "And Spain?"}])
    assert follow_up.whole(len(route.text)) == len(route.text)


def test_the_longest_prefix_names_its_replicas():
    index = PrefixIndex()
    index.insert("t", "system|Be brief.|user|Hi|", "r1")
    index.insert("t", "system|Be brief.|user|Hello|", "r2")
    both, first = {"r1", "r2"}, "system|Be brief.|user|Hi|"
    assert index.match("t", first + "assistant||user|More|", both) == (len(first), ["r1"])
    matched, holders = index.match("t", "system|Be brief.|user|Howdy|", both)
    assert matched == len("system|Be brief.|user|H") and sorted(holders) == ["r1", "r2"]  # an edge split between
    assert index.match("t", "system|Be brief.|user|Hi|", {"r2"}) == (len("system|Be brief.|user|H"), ["r2"])
    assert index.match("t", "user|Hi|", both) == (0, [])


def test_tenants_never_share_a_prefix():
    index = PrefixIndex()
    index.insert("tenant-a", "user|my secret plan|", "r1")
    assert index.match("tenant-b", "user|my secret plan|", {"r1", "r2"}) == (0, [])
    assert index.match("tenant-a:salt", "user|my secret plan|", {"r1", "r2"}) == (0, [])
    assert index.match("tenant-a", "user|my secret plan|", {"r1", "r2"}) == (len("user|my secret plan|"), ["r1"])


def test_memory_is_bounded_and_the_oldest_is_forgotten():
    index = PrefixIndex(max_chars=100, keep_chars=60)
    for i in range(10):
        index.insert("t", f"conversation {i}: " + "x" * 20, "r1")
        assert index.chars("r1") <= 100
    recent = "conversation 9: " + "x" * 20
    assert index.match("t", recent, {"r1"}) == (len(recent), ["r1"])
    assert index.match("t", "conversation 0: " + "x" * 20, {"r1"})[0] <= len("conversation ")  # forgotten
    index.insert("t", recent, "r2")
    index.remove("r1")
    assert index.chars("r1") == 0 and index.match("t", recent, {"r1", "r2"}) == (len(recent), ["r2"])
    index.remove("r2")
    assert index.match("t", recent, {"r1", "r2"}) == (0, []) and not index._roots  # nothing left behind
