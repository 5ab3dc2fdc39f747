"""Sessions: a follow-up turn, or an edited last message, computes only the tokens after the
prefix it shares with what the engine has cached; the reply is still the one from scratch. Responses
report the reused tokens in whole KV blocks (a count to the token would tell a client how far its prompt
matches what others sent)."""

from __future__ import annotations

from helpers.serve_helpers import CHAT_MODEL, chat_ids, generate_text, require_serving

require_serving()

REPLY = 16
BLOCK = 16  # the chat server's KV block size


def whole_blocks(n: int) -> int:
    return n // BLOCK * BLOCK


def prompt_counters(chat_server) -> tuple[float, float]:
    m = chat_server.metrics()
    label = f'{{model="{CHAT_MODEL}"}}'
    return m["llaisys_prompt_tokens_computed_total" + label], m["llaisys_prompt_tokens_reused_total" + label]


def common_prefix(a, b) -> int:
    return next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))


def ask(client, messages):
    r = client.chat.completions.create(model=CHAT_MODEL, messages=messages, max_tokens=REPLY, temperature=0)
    return r.choices[0].message.content, r.usage


def test_follow_up_turn_and_edited_message_reuse_the_cached_prefix(chat_server, chat_reference, tokenizer):
    client = chat_server.client()
    turn1 = [{"role": "system", "content": "You are a session-reuse test."},
             {"role": "user", "content": "First question, about prefix caches?"}]
    reply1, usage1 = ask(client, turn1)
    turn1_ids = chat_ids(tokenizer, turn1)
    reply1_ids = chat_reference.generate(turn1_ids, REPLY)[len(turn1_ids):]
    assert reply1 == tokenizer.decode(reply1_ids)

    # follow-up: the cache holds turn 1's prompt and reply (all but the last reply token, never fed back)
    turn2 = turn1 + [{"role": "assistant", "content": reply1}, {"role": "user", "content": "And a second one?"}]
    turn2_ids = chat_ids(tokenizer, turn2)
    cached = turn1_ids + reply1_ids[:-1]
    reusable = common_prefix(cached, turn2_ids)
    assert reusable >= len(turn1_ids) + len(reply1_ids) - 1  # everything but turn 2's own text is reusable
    computed0, reused0 = prompt_counters(chat_server)
    reply2, usage2 = ask(client, turn2)
    computed1, reused1 = prompt_counters(chat_server)
    assert (reused1 - reused0, computed1 - computed0) == (reusable, len(turn2_ids) - reusable)
    assert usage2.prompt_tokens == len(turn2_ids) and usage2.prompt_tokens_details.cached_tokens == whole_blocks(reusable)
    assert reply2 == generate_text(chat_reference, tokenizer, turn2_ids, REPLY)  # same as from an empty cache

    # the last user message edited: everything before the edit is reused
    edited = turn2[:-1] + [{"role": "user", "content": "And a different second one?"}]
    edited_ids = chat_ids(tokenizer, edited)
    reusable = common_prefix(turn2_ids, edited_ids)
    assert reusable > len(turn1_ids)
    reply3, usage3 = ask(client, edited)
    computed2, reused2 = prompt_counters(chat_server)
    assert (reused2 - reused1, computed2 - computed1) == (reusable, len(edited_ids) - reusable)
    assert usage3.prompt_tokens_details.cached_tokens == whole_blocks(reusable)
    assert reply3 == generate_text(chat_reference, tokenizer, edited_ids, REPLY)
