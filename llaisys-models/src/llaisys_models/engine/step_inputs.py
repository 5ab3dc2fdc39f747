"""What one forward over several sequences reads besides the weights: token ids, positions, KV slots and
block tables, as device tensors (the paged ops' arguments, backend.h).

A batch is a list of (sequence, new token ids), each sequence with blocks reserved for its new length; its
inputs are made on the host first (``host_step``), then copied to the device. Decode graphs
(decode_graph.py) keep one static set of these buffers per step shape and reload them.
"""

from __future__ import annotations

import dataclasses

import numpy as np

import llaisys

from .kv_blocks import SequenceKV

Batch = list[tuple[SequenceKV, list[int]]]


@dataclasses.dataclass
class StepInputs:
    tokens: llaisys.Tensor        # int64 [T]: the new token ids, sequence after sequence
    positions: llaisys.Tensor     # int64 [T]: their positions in their sequences (rope)
    slots: llaisys.Tensor         # int64 [G, T]: per layer group, cache row (block * block_size + offset) of each token
    block_tables: llaisys.Tensor  # int32 [G, num_seqs, max_blocks]: per layer group (kv_cache.layer_groups; G = 1
    seq_lens: llaisys.Tensor      # int32 [num_seqs]: positions after this forward          but where global layers
    query_start: llaisys.Tensor   # int32 [num_seqs + 1]: first row of each sequence        sit beside sliding ones)
    logit_rows: llaisys.Tensor | None  # int64 [R]: the rows whose logits are wanted (None: every row)
    num_tokens: int
    adapters: llaisys.Tensor | None = None  # int64 [T]: each row's LoRA slot, -1: none (None: no row has one)

    def __post_init__(self) -> None:
        # group g's slots [T] and tables [num_seqs, max_blocks]: views, what the layers of group g read
        groups, t = self.slots.shape
        _, n, width = self.block_tables.shape
        self.group_slots = [self.slots.slice(0, g, g + 1).view(t) for g in range(groups)]
        self.group_tables = [self.block_tables.slice(0, g, g + 1).view(n, width) for g in range(groups)]


STATIC = ("tokens", "positions", "slots", "block_tables", "seq_lens", "query_start")


@dataclasses.dataclass
class HostStep:
    """One forward's inputs on the host: the arrays of StepInputs (``logit_rows`` None: every row), the new
    rows of each sequence and how many of its last rows need logits (``logits_of``, None: every row of the
    batch). What the other ranks of a tensor-parallel group receive for each step (tensor_parallel/)."""
    tokens: np.ndarray        # int64 [T]
    positions: np.ndarray     # int64 [T]
    slots: np.ndarray         # int64 [G, T]: per layer group
    block_tables: np.ndarray  # int32 [G, num_seqs, max_blocks]
    seq_lens: np.ndarray      # int32 [num_seqs]
    query_start: np.ndarray   # int32 [num_seqs + 1]
    logit_rows: np.ndarray | None  # int64 [R]
    logits_of: tuple[int, ...] | None
    adapters: np.ndarray | None = None  # int64 [T]: each row's LoRA slot (lora/slots.py), or None

    @property
    def rows(self) -> tuple[int, ...]:
        """New token rows per sequence."""
        return tuple(int(n) for n in np.diff(self.query_start))


def host_step(batch: Batch, logits_of: list[int] | None = None) -> HostStep:
    """The inputs of one forward that appends ``ids`` to each sequence of ``batch``. ``logits_of[i]``: how many
    of sequence i's last new rows need logits (a bool: its last row or none; None: every row of the batch)."""
    manager = batch[0][0].manager
    bs, groups = manager.block_size, len(batch[0][0].parts)
    lengths = [len(ids) for _, ids in batch]
    total = sum(lengths)
    tokens = np.fromiter((t for _, ids in batch for t in ids), np.int64, total)
    positions = np.empty(total, np.int64)
    slots = np.empty((groups, total), np.int64)
    max_blocks = max(len(part.blocks) for seq, _ in batch for part in seq.parts)
    tables = np.zeros((groups, len(batch), max_blocks), np.int32)
    seq_lens = np.empty(len(batch), np.int32)
    query_start = np.zeros(len(batch) + 1, np.int32)
    row = 0
    for i, ((seq, _), n) in enumerate(zip(batch, lengths)):
        if seq.manager is not manager or len(seq.parts) != groups:
            raise ValueError("every sequence of a forward must belong to the same KV pool")
        start = len(seq)
        pos = np.arange(start, start + n, dtype=np.int64)
        for g, part in enumerate(seq.parts):  # (a block table per layer group: kv_cache.layer_groups)
            if start + n > len(part.blocks) * bs:
                raise RuntimeError(f"sequence needs {start + n} positions but holds blocks for "
                                   f"{len(part.blocks) * bs}; reserve first")
            if start < part.dropped * bs:
                raise RuntimeError(f"sequence writes position {start} but gave back its blocks before "
                                   f"{part.dropped * bs}")
            table = np.asarray(part.blocks, dtype=np.int64)
            slots[g, row:row + n] = table[pos // bs] * bs + pos % bs
            # (blocks a sequence gave back, before its windows: block 0, which the kernels check but never read)
            tables[g, i, part.dropped:len(part.blocks)] = part.blocks[part.dropped:]
        positions[row:row + n] = pos
        seq_lens[i] = start + n
        row += n
        query_start[i + 1] = row
    if logits_of is None:
        rows = None
    else:
        if len(logits_of) != len(batch):
            raise ValueError(f"logits_of has {len(logits_of)} entries for {len(batch)} sequences")
        for want, n in zip(logits_of, lengths):
            if not 0 <= want <= n:
                raise ValueError(f"logits of {int(want)} rows asked of a sequence with {n} new tokens")
        rows = np.array([r for i, want in enumerate(logits_of) for r in range(query_start[i + 1] - want,
                                                                               query_start[i + 1])], np.int64)
    wanted = None if logits_of is None else tuple(int(want) for want in logits_of)
    return HostStep(tokens, positions, slots, tables, seq_lens, query_start, rows, wanted)


def step_inputs(host: HostStep, device) -> StepInputs:
    """The device tensors of a step."""
    tensors = {name: llaisys.from_numpy(getattr(host, name), device) for name in STATIC}
    rows = None if host.logit_rows is None else llaisys.from_numpy(host.logit_rows, device)
    adapters = None if host.adapters is None else llaisys.from_numpy(host.adapters, device)
    return StepInputs(**tensors, logit_rows=rows, num_tokens=len(host.tokens), adapters=adapters)


def static_step_inputs(rows: tuple[int, ...], table_width: int, device, adapters: bool = False,
                       groups: int = 1) -> StepInputs:
    """Buffers for steps that append ``rows[i]`` tokens to sequence i and want the logits of every row (a
    decode step: all ones; a verify step of speculative decoding: 1 + the drafts), with block tables
    ``table_width`` wide for each of ``groups`` layer groups (and, for steps with LoRA adapters, each row's slot),
    filled by ``load_step_inputs``: the fixed inputs of a captured graph."""
    n, t, zeros = len(rows), sum(rows), llaisys.zeros
    return StepInputs(tokens=zeros((t,), llaisys.int64, device), positions=zeros((t,), llaisys.int64, device),
                      slots=zeros((groups, t), llaisys.int64, device),
                      block_tables=zeros((groups, n, table_width), llaisys.int32, device),
                      seq_lens=zeros((n,), llaisys.int32, device), query_start=zeros((n + 1,), llaisys.int32, device),
                      logit_rows=None, num_tokens=t,
                      adapters=zeros((t,), llaisys.int64, device) if adapters else None)


def load_step_inputs(step: StepInputs, host: HostStep) -> None:
    """Copy a step's inputs into the buffers of ``static_step_inputs`` (made for its rows per sequence); the
    block tables are padded with zeros to the buffers' width."""
    width = step.block_tables.shape[2]
    tables = np.zeros((*host.block_tables.shape[:2], width), np.int32)
    tables[:, :, :host.block_tables.shape[2]] = host.block_tables
    for name in STATIC:
        getattr(step, name).load(tables if name == "block_tables" else getattr(host, name))
    if step.adapters is not None:
        assert host.adapters is not None  # (the buffers were made for steps with adapters)
        step.adapters.load(host.adapters)
