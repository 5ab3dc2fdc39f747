"""The paged KV cache: its bookkeeping (kv_blocks.BlockManager, plain Python, driven here without a device:
block states, reference counts, the prefix index and its scopes) and the keys / values copied on write
(kv_cache.KVPool, on each device)."""

from __future__ import annotations

import random

import numpy as np
import pytest

import llaisys
from llaisys_models.engine.kv_blocks import BlockManager
from llaisys_models.engine.kv_cache import KVPool, KVShape

BS = 4  # positions per block


@pytest.fixture
def pool(device):
    return KVPool(KVShape(num_layers=2, kv_heads=1, head_dim=2, dtype=llaisys.float32, device=device), 12, BS)


class RecordingManager(BlockManager):
    """The bookkeeping alone, no device: the copies it asks for are recorded."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.copies: list[tuple[int, int]] = []

    def copy_block(self, dst: int, src: int) -> None:
        self.copies.append((dst, src))


@pytest.fixture
def blocks():
    return RecordingManager(12, BS)


def filled(pool, tokens, limit=None, scope=""):
    """A sequence holding ``tokens``, reusing what the cache has; the rest 'computed': each position's keys
    and values written as (token id, position) when ``pool`` has tensors."""
    seq = pool.sequence(scope)
    start = seq.adopt_prefix(tokens, len(tokens) if limit is None else limit)
    assert seq.reserve(len(tokens))
    write(pool, seq, tokens[start:], start)
    seq.commit(tokens[start:])
    return seq, start


def write(pool, seq, tokens, start):
    if not tokens or not isinstance(pool, KVPool):
        return
    pos = np.arange(start, start + len(tokens))
    slots = np.asarray(seq.blocks)[pos // BS] * BS + pos % BS
    rows = np.stack([np.asarray(tokens, np.float32), pos.astype(np.float32)], axis=1)[:, None, :]
    kv = llaisys.from_numpy(rows, pool.shape.device)
    for layer in range(pool.shape.num_layers):
        llaisys.ops.paged_kv_write(pool.keys[layer], pool.values[layer], kv, kv,
                                   llaisys.from_numpy(slots.astype(np.int64), pool.shape.device))


def content(pool, seq) -> list[tuple[float, float]]:
    """(token, position) read back from the cache for every position of seq, layer by layer (all agree)."""
    out = []
    for layer in range(pool.shape.num_layers):
        for cache in (pool.keys[layer], pool.values[layer]):
            rows = cache.numpy()[:, :, 0, :]
            out.append([tuple(rows[seq.blocks[p // BS], p % BS]) for p in range(len(seq))])
    assert all(o == out[0] for o in out)
    return out[0]


def expected(tokens):
    return [(float(t), float(p)) for p, t in enumerate(tokens)]


def test_blocks_come_back_and_a_double_release_is_caught(blocks):
    a, b = blocks.allocate(), blocks.allocate()
    assert blocks.check() == {"used": 2, "cached": 0, "free": 10}
    blocks.incref(a)
    blocks.decref(a)
    blocks.decref(a)
    blocks.decref(b)
    assert blocks.check() == {"used": 0, "cached": 0, "free": 12}
    with pytest.raises(RuntimeError, match="released more often than it was taken"):
        blocks.decref(a)


def test_reserve_takes_nothing_when_the_pool_is_short(blocks):
    seq = blocks.sequence()
    assert not seq.reserve(13 * BS)
    assert seq.blocks == [] and blocks.check()["free"] == 12
    assert seq.reserve(12 * BS) and blocks.num_free == 0


def test_a_follow_up_reuses_full_blocks_and_copies_the_partial_one(pool):
    turn1 = list(range(100, 111))  # 2 full blocks + 3 positions
    first, reused = filled(pool, turn1)
    assert reused == 0
    held = list(first.blocks)
    first.release()  # the full blocks and the partial one stay cached
    assert pool.check() == {"used": 0, "cached": 3, "free": 9}

    turn2 = turn1 + [7, 8, 9, 10, 11]
    second, reused = filled(pool, turn2, limit=len(turn2) - 1)
    assert reused == len(turn1)  # everything turn 1 computed
    assert second.blocks[:2] == held[:2]  # shared blocks
    assert second.blocks[2] != held[2]  # the partial block was copied before it got written
    assert content(pool, second) == expected(turn2)
    assert pool.refcount(held[0]) == 1 and pool.refcount(held[2]) == 0  # turn 1's partial block stays cached


def test_an_edit_inside_a_block_reuses_the_positions_before_it(pool):
    original = list(range(200, 213))
    seq, _ = filled(pool, original)
    seq.release()
    edited = original[:6] + [1, 2, 3, 4, 5, 6, 7]  # differs from position 6 on (inside block 1)
    again, reused = filled(pool, edited, limit=len(edited) - 1)
    assert reused == 6
    assert content(pool, again) == expected(edited)


def test_running_sequences_share_a_prompt_and_end_with_one_copy_each_block(blocks):
    system = list(range(50, 58))  # two full blocks
    a, _ = filled(blocks, system + [1, 2])
    b, reused = filled(blocks, system + [3, 4, 5], limit=10)
    assert reused == 8 and a.blocks[:2] == b.blocks[:2]
    assert [blocks.refcount(x) for x in a.blocks[:2]] == [2, 2]
    a.release()
    b.release()
    state = blocks.check()
    assert state["used"] == 0 and state["cached"] == 4  # 2 shared full + 2 partial tails; nothing freed twice


def test_the_same_block_computed_twice_is_kept_once(blocks):
    tokens = list(range(10, 18))
    a, b = blocks.sequence(), blocks.sequence()
    for seq in (a, b):  # both computed before either indexed its blocks (two requests in one step)
        assert seq.reserve(8)
        write(blocks, seq, tokens, 0)
    a.commit(tokens)
    own = list(b.blocks)
    b.commit(tokens)
    assert b.blocks == a.blocks  # b now uses a's blocks, its own went back
    assert all(blocks.refcount(x) == 0 for x in own) and blocks.check()["used"] == 2
    a.release()
    b.release()
    assert blocks.check() == {"used": 0, "cached": 2, "free": 10}


def test_truncating_into_a_shared_block_copies_it(pool):
    tokens = list(range(30, 38))
    a, _ = filled(pool, tokens)
    b, _ = filled(pool, tokens + [99], limit=8)
    b.truncate(6)  # block 1 is shared with a: b must not write into it
    assert b.blocks[0] == a.blocks[0] and b.blocks[1] != a.blocks[1]
    write(pool, b, [77, 78], 6)
    b.commit([77, 78])
    assert content(pool, a) == expected(tokens)
    assert content(pool, b) == expected(tokens[:6] + [77, 78])


def test_cached_blocks_are_evicted_least_recent_first_leaves_before_parents(blocks):
    old_tokens, new_tokens = list(range(0, 9)), list(range(500, 509))
    for tokens in (old_tokens, new_tokens):  # 2 full blocks + 1 partial each
        seq, _ = filled(blocks, tokens)
        seq.release()
    assert blocks.check() == {"used": 0, "cached": 6, "free": 6}

    def reusable(tokens):
        full, _, n = blocks.match(tokens, len(tokens))
        return len(full) * BS + n

    hog = blocks.sequence()
    assert reusable(old_tokens) == 9
    for taken, left in ((7, 8), (8, 4), (9, 0)):  # the free blocks first, then the old conversation, leaf first
        assert hog.reserve(taken * BS)
        assert reusable(old_tokens) == left and reusable(new_tokens) == 9
    assert blocks.check() == {"used": 9, "cached": 3, "free": 0}


def test_random_operations_keep_every_block_in_one_state(blocks):
    rng = random.Random(0)
    live = []
    for _ in range(400):
        op = rng.random()
        if op < 0.45 and len(live) < 6:
            tokens = [rng.choice((1, 2)) for _ in range(rng.randint(1, 14))]  # few symbols: many shared prefixes
            seq = blocks.sequence()
            start = seq.adopt_prefix(tokens, len(tokens) - 1)
            if seq.reserve(len(tokens)):
                seq.commit(tokens[start:])
                live.append(seq)
            else:
                seq.release()
        elif op < 0.8 and live:
            live.pop(rng.randrange(len(live))).release()
        elif live:
            seq = rng.choice(live)
            seq.truncate(rng.randint(0, len(seq)))
        blocks.check()
    for seq in live:
        seq.release()
    assert blocks.check()["used"] == 0


def test_scopes_do_not_see_each_others_blocks(blocks):
    """The prefix index is per scope (a server's tenant): the same tokens cached by "alice" are not found by
    "bob", not even the partial last block, while alice's follow-up finds them."""
    tokens = list(range(300, 311))  # 2 full blocks + 3 positions
    seq, _ = filled(blocks, tokens, scope="alice")
    partial = seq.blocks[2]
    seq.release()
    assert blocks.match(tokens + [1], len(tokens), "bob") == ([], None, 0)
    theirs, reused = filled(blocks, tokens + [1], limit=len(tokens), scope="bob")
    assert reused == 0 and blocks.copies == []
    mine, reused = filled(blocks, tokens + [1], limit=len(tokens), scope="alice")
    assert reused == len(tokens)
    assert blocks.copies == [(mine.blocks[2], partial)]  # alice's partial block, copied before she writes into it
    assert not set(theirs.blocks) & set(mine.blocks)
    blocks.check()
