"""What rank 0 sends the other ranks before each step, through the group's own broadcast (no socket).

A message is int64 words: commands one after the other, each [opcode, its words...]:

    NEW_POOL  pool, num_blocks, block_size, cache a KV pool (each rank holds its own kv heads of it);
                                                  cache: its KV_CACHE_DTYPES index
    GROW      pool, num_blocks                    the pool grew (blocks and their contents stay)
    COPY      pool, dst, src                      a block copied on write (prefix caching, forks)
    DROP      pool                                the pool is gone (and its captured decode steps)
    CLEAR                                         drop the captured decode steps
    STEP      pool, G, T, S, W, R, L, A, tokens [T], positions [T], slots [G*T], block_tables [G*S*W],
              seq_lens [S], query_start [S+1], logit_rows [R] (R = -1: none), logits_of [S] (L = 0: none),
              adapters [T] (each row's LoRA slot; A = 0: none); G: the pool's layer groups (1 but where
              global layers sit beside sliding ones), each with its slots and block tables
    STOP                                          leave the group
    LORA_ENABLE  max_loras, max_rank              the LoRA slots (model.enable_lora)
    LORA_LOAD    uid, n, m, name [ceil(n/8)], path [ceil(m/8)]
                                                  read the adapter (n bytes of UTF-8 name, m bytes of path, packed
                                                  into words) and cut this rank's part of it, then every rank's
                                                  error or none through one all-gather (``exchange_errors``)
    LORA_PLACE   slot, uid                        the adapter is in the slot now (rank 0's LoRASlots.place)
    LORA_FORGET  uid                              the adapter is unloaded
    LORA_MERGE   uid                              the adapter is folded into the base weights (and unloaded)

The block bookkeeping stays on rank 0 (kv_blocks.py): the others only apply what it decided, in order, so
that every rank's pools hold the same blocks; so do LoRA adapters' slots (lora/slots.py): rank 0 picks the slot,
the others put the same adapter (known to every rank by rank 0's uid) there before the step that reads it.

``send`` broadcasts one block of FIRST words (the magic, the length, the message's first words: a decode step of
a few sequences fits), then the rest, if any, in a second broadcast; ``receive`` is its other side. A message
travels as device tensors (the collectives' buffers live on the device).
"""

from __future__ import annotations

import enum
import os
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
    LORA_ENABLE = 8
    LORA_LOAD = 9
    LORA_PLACE = 10
    LORA_FORGET = 11
    LORA_MERGE = 12


MAGIC = 0x4C4C5450  # "LLTP": a header that is not one of rank 0's is a broken group, not a command
FIRST = 1024  # words of the first broadcast (8 KiB): [MAGIC, length, the message's first FIRST - 2 words]
_ARGS = {Op.NEW_POOL: 4, Op.GROW: 2, Op.COPY: 3, Op.DROP: 1, Op.CLEAR: 0, Op.STOP: 0, Op.LORA_ENABLE: 2,
         Op.LORA_PLACE: 2, Op.LORA_FORGET: 1, Op.LORA_MERGE: 1}
ERROR_WORDS = 128  # words per rank of exchange_errors: a length, then up to 1016 bytes of one line


def command(op: Op, *args: int) -> np.ndarray:
    if len(args) != _ARGS[op]:
        raise ValueError(f"{op.name} takes {_ARGS[op]} arguments, got {len(args)}")
    return np.array([op, *args], np.int64)


def step_command(pool: int, host: HostStep) -> np.ndarray:
    g, s, w = host.block_tables.shape
    r = -1 if host.logit_rows is None else len(host.logit_rows)
    parts = [np.array([Op.STEP, pool, g, len(host.tokens), s, w, r, host.logits_of is not None,
                       host.adapters is not None], np.int64),
             host.tokens, host.positions, host.slots.reshape(-1), host.block_tables.reshape(-1), host.seq_lens,
             host.query_start]
    if host.logit_rows is not None:
        parts.append(host.logit_rows)
    if host.logits_of is not None:
        parts.append(np.asarray(host.logits_of, np.int64))
    if host.adapters is not None:
        parts.append(host.adapters)
    return np.concatenate([np.asarray(p, np.int64) for p in parts])


def lora_load_command(uid: int, name: str, path: str) -> np.ndarray:
    """LORA_LOAD: the adapter ``name`` at ``path`` (absolute: every rank reads it), keyed ``uid`` on every rank."""
    name_bytes, path_bytes = name.encode(), os.fsencode(path)
    return np.concatenate([np.array([Op.LORA_LOAD, uid, len(name_bytes), len(path_bytes)], np.int64),
                           _words(name_bytes), _words(path_bytes)])


def _words(data: bytes) -> np.ndarray:
    """``data`` packed into int64 words (zero bytes after it, to a whole word)."""
    return np.frombuffer(data + bytes(-len(data) % 8), np.int64)


def _bytes(words: np.ndarray, n: int) -> bytes:
    return np.ascontiguousarray(words, np.int64).tobytes()[:n]


def exchange_errors(group: llaisys.distributed.Group, error: str | None) -> list[str | None]:
    """Every rank's ``error`` (one line, or None where the rank succeeded), rank r's at [r], through one
    all-gather of the group (every rank calls it; a line is cut at 1016 bytes)."""
    mine = np.zeros(ERROR_WORDS, np.int64)
    if error is not None:
        data = error.encode(errors="replace")[:(ERROR_WORDS - 1) * 8]
        mine[0] = len(data) + 1  # (0: no error)
        words = _words(data)
        mine[1:1 + len(words)] = words
    out = llaisys.empty((group.world_size, ERROR_WORDS), llaisys.int64, group.device)
    group.all_gather(out, llaisys.from_numpy(mine, group.device))
    return [None if row[0] == 0 else _bytes(row[1:], int(row[0]) - 1).decode(errors="replace")
            for row in out.numpy()]


def decode(words: np.ndarray) -> Iterator[tuple[Op, tuple[Any, ...]]]:
    """The commands of a message: (Op, args tuple of ints), (Op.STEP, (pool, HostStep)) or
    (Op.LORA_LOAD, (uid, name, path))."""
    at = 0
    while at < len(words):
        op = Op(int(words[at]))
        if op == Op.LORA_LOAD:
            uid, n, m = (int(v) for v in words[at + 1:at + 4])
            at += 4
            name = _bytes(words[at:at + -(-n // 8)], n).decode()
            at += -(-n // 8)
            path = os.fsdecode(_bytes(words[at:at + -(-m // 8)], m))
            at += -(-m // 8)
            yield op, (uid, name, path)
            continue
        if op != Op.STEP:
            n = _ARGS[op]
            yield op, tuple(int(v) for v in words[at + 1:at + 1 + n])
            at += 1 + n
            continue
        pool, g, t, s, w, r, has_logits_of, has_adapters = (int(v) for v in words[at + 1:at + 9])
        at += 9

        def take(n: int, dtype: type[np.integer[Any]] = np.int64) -> np.ndarray:
            nonlocal at
            out = words[at:at + n].astype(dtype)
            at += n
            return out

        tokens, positions, slots = take(t), take(t), take(g * t).reshape(g, t)
        tables = take(g * s * w, np.int32).reshape(g, s, w)
        seq_lens, query_start = take(s, np.int32), take(s + 1, np.int32)
        rows = take(r) if r >= 0 else None
        logits_of = tuple(int(v) for v in take(s)) if has_logits_of else None
        adapters = take(t) if has_adapters else None
        yield op, (pool, HostStep(tokens, positions, slots, tables, seq_lens, query_start, rows, logits_of, adapters))


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
