"""What rank 0 sends the other ranks before each step, through the group's own broadcast (no socket).

A message is int64 words: commands one after the other, each [opcode, its words...]:

    NEW_POOL  pool, num_blocks, block_size        a KV pool (each rank holds its own kv heads of it)
    GROW      pool, num_blocks                    the pool grew (blocks and their contents stay)
    COPY      pool, dst, src                      a block copied on write (prefix caching, forks)
    DROP      pool                                the pool is gone (and its captured decode steps)
    CLEAR                                         drop the captured decode steps
    STEP      pool, T, S, W, R, L, tokens [T], positions [T], slots [T], block_tables [S*W], seq_lens [S],
              query_start [S+1], logit_rows [R] (R = -1: none), logits_of [S] (L = 0: none)
    STOP                                          leave the group

The block bookkeeping stays on rank 0 (kv_blocks.py): the others only apply what it decided, in order, so
that every rank's pools hold the same blocks. ``send`` broadcasts one block of FIRST words (the magic, the
length, the message's first words: a decode step of a few sequences fits), then the rest, if any, in a second
broadcast; ``receive`` is its other side. A message travels as device tensors (the collectives' buffers live on
the device).
"""

from __future__ import annotations

import enum
from collections.abc import Iterator
from typing import Any

import numpy as np

import llaisys

from ..engine.step_inputs import HostStep


class Op(enum.IntEnum):
    NEW_POOL = 1
    GROW = 2
    COPY = 3
    DROP = 4
    CLEAR = 5
    STEP = 6
    STOP = 7


MAGIC = 0x4C4C5450  # "LLTP": a header that is not one of rank 0's is a broken group, not a command
FIRST = 1024  # words of the first broadcast (8 KiB): [MAGIC, length, the message's first FIRST - 2 words]
_ARGS = {Op.NEW_POOL: 3, Op.GROW: 2, Op.COPY: 3, Op.DROP: 1, Op.CLEAR: 0, Op.STOP: 0}


def command(op: Op, *args: int) -> np.ndarray:
    if len(args) != _ARGS[op]:
        raise ValueError(f"{op.name} takes {_ARGS[op]} arguments, got {len(args)}")
    return np.array([op, *args], np.int64)


def step_command(pool: int, host: HostStep) -> np.ndarray:
    s, w = host.block_tables.shape
    r = -1 if host.logit_rows is None else len(host.logit_rows)
    parts = [np.array([Op.STEP, pool, len(host.tokens), s, w, r, host.logits_of is not None], np.int64),
             host.tokens, host.positions, host.slots, host.block_tables.reshape(-1), host.seq_lens, host.query_start]
    if host.logit_rows is not None:
        parts.append(host.logit_rows)
    if host.logits_of is not None:
        parts.append(np.asarray(host.logits_of, np.int64))
    return np.concatenate([np.asarray(p, np.int64) for p in parts])


def decode(words: np.ndarray) -> Iterator[tuple[Op, tuple[Any, ...]]]:
    """The commands of a message: (Op, args tuple of ints) or (Op.STEP, (pool, HostStep))."""
    at = 0
    while at < len(words):
        op = Op(int(words[at]))
        if op != Op.STEP:
            n = _ARGS[op]
            yield op, tuple(int(v) for v in words[at + 1:at + 1 + n])
            at += 1 + n
            continue
        pool, t, s, w, r, has_logits_of = (int(v) for v in words[at + 1:at + 7])
        at += 7

        def take(n: int, dtype: type[np.integer[Any]] = np.int64) -> np.ndarray:
            nonlocal at
            out = words[at:at + n].astype(dtype)
            at += n
            return out

        tokens, positions, slots = take(t), take(t), take(t)
        tables = take(s * w, np.int32).reshape(s, w)
        seq_lens, query_start = take(s, np.int32), take(s + 1, np.int32)
        rows = take(r) if r >= 0 else None
        logits_of = tuple(int(v) for v in take(s)) if has_logits_of else None
        yield op, (pool, HostStep(tokens, positions, slots, tables, seq_lens, query_start, rows, logits_of))


class Channel:
    """Messages from rank 0 to every other rank of ``group``, through its broadcast."""

    def __init__(self, group: llaisys.distributed.Group):
        self.group = group

    def send(self, words: np.ndarray) -> None:
        first = np.zeros(FIRST, np.int64)
        head = min(len(words), FIRST - 2)
        first[:2], first[2:2 + head] = (MAGIC, len(words)), words[:head]
        self.group.broadcast(llaisys.from_numpy(first, self.group.device), 0)
        if len(words) > head:
            self.group.broadcast(llaisys.from_numpy(np.ascontiguousarray(words[head:], np.int64), self.group.device), 0)

    def receive(self) -> np.ndarray:
        """The next message (waits as long as rank 0 sends none, until the group is aborted)."""
        first = llaisys.empty((FIRST,), llaisys.int64, self.group.device)
        self.group.broadcast(first, 0)
        values = first.numpy()
        magic, length = int(values[0]), int(values[1])
        if magic != MAGIC or length < 0:
            raise llaisys.LlaisysError(f"rank {self.group.rank}: a message from rank 0 with a bad header "
                                       f"({magic:#x}, {length}): the ranks are out of step")
        if length <= FIRST - 2:
            return values[2:2 + length]
        rest = llaisys.empty((length - (FIRST - 2),), llaisys.int64, self.group.device)
        self.group.broadcast(rest, 0)
        return np.concatenate([values[2:], rest.numpy()])
