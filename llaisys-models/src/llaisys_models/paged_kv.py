"""The paged KV cache: per layer, keys and values in one pool of fixed-size blocks; sequences own block tables.

    pool = KVPool(shape, num_blocks, block_size)        # keys[layer], values[layer]: [blocks, block_size, Hkv, d]
    seq = pool.sequence()                               # an empty block table
    seq.adopt_prefix(prompt)                            # reuse cached blocks that hold the prompt's start
    seq.reserve(n)                                      # blocks for n positions (False: the pool is out)
    ... a forward writes positions len(seq) .. n-1 ... seq.commit(new tokens)
    seq.release()                                       # blocks back; cached ones stay findable

Prefix sharing. A full block is indexed by (its parent block, its token ids): the chain of parents makes the
key cover the whole prefix, and a dict lookup compares the token ids themselves, so a match is exact (no
hash collision can share the wrong keys). Sequences that start with the same tokens hold the same blocks
(reference counted). When a sequence ends, its last, partly filled block is kept too (as a child of its
parent), so a follow-up turn or an edited message reuses every token before the first difference: the
best-matching child block is copied into a new block of the sequence (copy on write) and only the rest is
computed. A block is written only by the sequence that owns it alone and has not indexed it.

Freeing. A block whose count drops to 0 goes back to the free list, or — if indexed — to the cached list
(least recently released first), whose blocks are reused only when the free list is empty; taking one
unindexes it and everything indexed below it. Each block is always in exactly one state: in use (count > 0),
cached (count 0, indexed) or free (count 0, not indexed); ``check()`` verifies it.
"""

from __future__ import annotations

import collections
import dataclasses

import numpy as np

import llaisys

ROOT = -1  # the parent of a sequence's first block


@dataclasses.dataclass(frozen=True)
class KVShape:
    """What one token's keys and values look like in every layer."""
    num_layers: int
    kv_heads: int
    head_dim: int
    dtype: llaisys.DType
    device: llaisys.Device

    @property
    def bytes_per_token(self) -> int:
        return 2 * self.num_layers * self.kv_heads * self.head_dim * self.dtype.itemsize


@dataclasses.dataclass
class StepInputs:
    """Device tensors describing one forward over several sequences (what the paged ops read)."""
    tokens: llaisys.Tensor        # int64 [T]: the new token ids, sequence after sequence
    positions: llaisys.Tensor     # int64 [T]: their positions in their sequences (rope)
    slots: llaisys.Tensor         # int64 [T]: cache row (block * block_size + offset) of each new token
    block_tables: llaisys.Tensor  # int32 [num_seqs, max_blocks]
    seq_lens: llaisys.Tensor      # int32 [num_seqs]: positions after this forward
    query_start: llaisys.Tensor   # int32 [num_seqs + 1]: first row of each sequence
    logit_rows: llaisys.Tensor | None  # int64 [R]: the rows whose logits are wanted (None: every row)
    num_tokens: int


class KVPool:
    """Keys and values of ``num_blocks`` blocks of ``block_size`` positions, for every layer."""

    def __init__(self, shape: KVShape, num_blocks: int, block_size: int = 16, *, prefix_caching: bool = True):
        if block_size < 1 or num_blocks < 1:
            raise llaisys.LlaisysValueError(f"a KV pool needs block_size >= 1 and num_blocks >= 1, got "
                                            f"{block_size} and {num_blocks}")
        self.shape = shape
        self.block_size = block_size
        self.prefix_caching = prefix_caching  # may be switched at any time: read at each adopt / commit
        self.num_blocks = 0
        self.keys: list[llaisys.Tensor] = []
        self.values: list[llaisys.Tensor] = []
        self._refs: list[int] = []
        self._free: collections.deque[int] = collections.deque()
        self._cached: collections.OrderedDict[int, None] = collections.OrderedDict()  # LRU first
        self._index: dict[tuple, int] = {}  # (parent, token ids) of a full block -> block
        self._entry: dict[int, tuple[int, tuple[int, ...]]] = {}  # indexed block -> (parent, token ids)
        self._children: dict[int, set[int]] = {}  # indexed parent (or ROOT) -> indexed blocks below it
        self.grow(num_blocks)

    # -- memory ----------------------------------------------------------------------------

    @property
    def bytes_per_block(self) -> int:
        return self.block_size * self.shape.bytes_per_token

    @property
    def nbytes(self) -> int:
        return self.num_blocks * self.bytes_per_block

    @property
    def capacity_tokens(self) -> int:
        return self.num_blocks * self.block_size

    def grow(self, num_blocks: int) -> None:
        """Have ``num_blocks`` blocks in all (more memory; block ids and their content stay)."""
        if num_blocks <= self.num_blocks:
            return
        s = self.shape
        keys, values = [], []
        for layer in range(s.num_layers):
            for new, old in ((keys, self.keys), (values, self.values)):
                t = llaisys.empty((num_blocks, self.block_size, s.kv_heads, s.head_dim), s.dtype, s.device)
                if old:
                    llaisys.ops.rearrange(t.slice(0, 0, self.num_blocks), old[layer])
                new.append(t)
        self._free.extend(range(self.num_blocks, num_blocks))
        self._refs.extend([0] * (num_blocks - self.num_blocks))
        self.keys, self.values, self.num_blocks = keys, values, num_blocks

    def copy_block(self, dst: int, src: int) -> None:
        for t in (*self.keys, *self.values):
            llaisys.ops.rearrange(t.slice(0, dst, dst + 1), t.slice(0, src, src + 1))

    # -- blocks ------------------------------------------------------------------------------

    @property
    def num_free(self) -> int:
        """Blocks a sequence can take now (free, or cached and evictable)."""
        return len(self._free) + len(self._cached)

    def allocate(self) -> int | None:
        """A block for one owner (count 1), or None when every block is in use."""
        if self._free:
            block = self._free.popleft()
        elif self._cached:
            block, _ = self._cached.popitem(last=False)
            self._unindex(block)
        else:
            return None
        self._refs[block] = 1
        return block

    def incref(self, block: int) -> None:
        if self._refs[block] == 0:
            self._cached.pop(block)  # a cached block comes back into use (free blocks are never shared)
        self._refs[block] += 1

    def decref(self, block: int) -> None:
        if self._refs[block] <= 0:
            raise RuntimeError(f"KV block {block} released more often than it was taken")
        self._refs[block] -= 1
        if self._refs[block] == 0:
            if block in self._entry:
                self._cached[block] = None  # most recently released last
            else:
                self._free.append(block)

    def refcount(self, block: int) -> int:
        return self._refs[block]

    # -- the prefix index ---------------------------------------------------------------------

    def _add_entry(self, block: int, parent: int, tokens: tuple[int, ...]) -> None:
        self._entry[block] = (parent, tokens)
        self._children.setdefault(parent, set()).add(block)
        if len(tokens) == self.block_size:
            self._index[(parent, tokens)] = block

    def _unindex(self, block: int) -> None:
        """Forget block's entry and, recursively, the entries below it (their prefix is gone). A block
        below that is still in use stays with its owners, unindexed; cached ones become free."""
        parent, tokens = self._entry.pop(block)
        if self._index.get((parent, tokens)) == block:
            del self._index[(parent, tokens)]
        siblings = self._children.get(parent)
        if siblings is not None:
            siblings.discard(block)
            if not siblings:
                del self._children[parent]
        for child in list(self._children.get(block, ())):
            if self._refs[child] == 0:
                self._cached.pop(child)
                self._free.append(child)
            self._unindex(child)
        self._children.pop(block, None)

    def is_indexed(self, block: int) -> bool:
        return block in self._entry

    def index_full(self, block: int, parent: int, tokens: tuple[int, ...]) -> int:
        """Index a block that just became full; returns the block standing for this content: ``block``, or
        an earlier block with the same parent and tokens (the caller then uses that one)."""
        if parent != ROOT and parent not in self._entry:
            return block  # below an unindexed block: unreachable, keep it private
        existing = self._index.get((parent, tokens))
        if existing is not None:
            return existing
        if block not in self._entry:
            self._add_entry(block, parent, tokens)
        return block

    def index_partial(self, block: int, parent: int, tokens: tuple[int, ...]) -> None:
        """Keep a sequence's last, partly filled block findable after the sequence ends."""
        if tokens and block not in self._entry and (parent == ROOT or parent in self._entry):
            self._add_entry(block, parent, tokens)

    def match(self, tokens: list[int], limit: int) -> tuple[list[int], int | None, int]:
        """Cached blocks holding the longest prefix of ``tokens[:limit]``: (full blocks, a block whose first
        ``n`` positions continue it (to copy), n)."""
        bs, parent, full, start = self.block_size, ROOT, [], 0
        while start + bs <= limit:
            block = self._index.get((parent, tuple(tokens[start:start + bs])))
            if block is None:
                break
            full.append(block)
            parent, start = block, start + bs
        best, best_n = None, 0
        window = tokens[start:min(start + bs, limit)]
        for child in self._children.get(parent, ()):
            n = _common_prefix(self._entry[child][1], window)
            if n > best_n:
                best, best_n = child, n
        return full, best, best_n

    # -- sequences and steps -------------------------------------------------------------------

    def sequence(self) -> SequenceKV:
        return SequenceKV(self)

    def step_inputs(self, batch: list[tuple[SequenceKV, list[int]]], logits_of: list[bool] | None = None) -> StepInputs:
        """Device tensors for one forward that appends ``ids`` to each sequence (blocks already reserved).
        ``logits_of[i]``: whether sequence i's last new row needs logits (None: every row of the batch)."""
        arrays = self._step_arrays(batch, logits_of)
        dev = self.shape.device
        rows = arrays.pop("logit_rows")
        tensors = {name: llaisys.from_numpy(array, dev) for name, array in arrays.items()}
        return StepInputs(**tensors, logit_rows=None if rows is None else llaisys.from_numpy(rows, dev),
                          num_tokens=len(arrays["tokens"]))

    def static_step_inputs(self, num_seqs: int) -> StepInputs:
        """Device buffers for decode steps of ``num_seqs`` sequences (one new token each, logits for each),
        filled by ``load_step_inputs``: the fixed inputs of a captured decode graph. Block tables are as wide
        as the pool, so any sequence of it fits."""
        dev, n = self.shape.device, num_seqs
        return StepInputs(tokens=llaisys.zeros((n,), llaisys.int64, dev),
                          positions=llaisys.zeros((n,), llaisys.int64, dev),
                          slots=llaisys.zeros((n,), llaisys.int64, dev),
                          block_tables=llaisys.zeros((n, self.num_blocks), llaisys.int32, dev),
                          seq_lens=llaisys.zeros((n,), llaisys.int32, dev),
                          query_start=llaisys.zeros((n + 1,), llaisys.int32, dev),
                          logit_rows=None, num_tokens=n)

    def load_step_inputs(self, step: StepInputs, batch: list[tuple[SequenceKV, list[int]]]) -> None:
        """Copy a decode step's inputs into the buffers of ``static_step_inputs``."""
        arrays = self._step_arrays(batch, None, table_width=step.block_tables.shape[1])
        for name in ("tokens", "positions", "slots", "block_tables", "seq_lens", "query_start"):
            getattr(step, name).load(arrays[name])

    def _step_arrays(self, batch, logits_of, table_width: int | None = None) -> dict[str, np.ndarray | None]:
        """The host arrays of ``step_inputs`` (block tables ``table_width`` wide, default the longest)."""
        bs = self.block_size
        lengths = [len(ids) for _, ids in batch]
        total = sum(lengths)
        tokens = np.fromiter((t for _, ids in batch for t in ids), np.int64, total)
        positions = np.empty(total, np.int64)
        slots = np.empty(total, np.int64)
        max_blocks = max(len(seq.blocks) for seq, _ in batch) if table_width is None else table_width
        tables = np.zeros((len(batch), max_blocks), np.int32)
        seq_lens = np.empty(len(batch), np.int32)
        query_start = np.zeros(len(batch) + 1, np.int32)
        row = 0
        for i, ((seq, _), n) in enumerate(zip(batch, lengths)):
            if seq.pool is not self:
                raise ValueError("every sequence of a forward must belong to the same KV pool")
            start = len(seq)
            if start + n > len(seq.blocks) * bs:
                raise RuntimeError(f"sequence needs {start + n} positions but holds blocks for "
                                   f"{len(seq.blocks) * bs}; reserve first")
            pos = np.arange(start, start + n, dtype=np.int64)
            table = np.asarray(seq.blocks, dtype=np.int64)
            positions[row:row + n] = pos
            slots[row:row + n] = table[pos // bs] * bs + pos % bs
            tables[i, :len(seq.blocks)] = seq.blocks
            seq_lens[i] = start + n
            row += n
            query_start[i + 1] = row
        if logits_of is None:
            rows = None
        else:
            rows = np.array([query_start[i + 1] - 1 for i, want in enumerate(logits_of) if want], np.int64)
        return {"tokens": tokens, "positions": positions, "slots": slots, "block_tables": tables,
                "seq_lens": seq_lens, "query_start": query_start, "logit_rows": rows}

    # -- accounting -------------------------------------------------------------------------------

    def check(self) -> dict[str, int]:
        """Verify that every block is in exactly one state; return the counts (used, cached, free)."""
        free, cached = set(self._free), set(self._cached)
        if len(free) != len(self._free):
            raise AssertionError("a block is on the free list twice")
        used = {b for b in range(self.num_blocks) if self._refs[b] > 0}
        if any(r < 0 for r in self._refs):
            raise AssertionError("a negative reference count")
        if free & cached or used & (free | cached) or len(used | free | cached) != self.num_blocks:
            raise AssertionError(f"blocks in two states or none: used {len(used)}, cached {len(cached)}, "
                                 f"free {len(free)} of {self.num_blocks}")
        if any(b in self._entry for b in free) or any(b not in self._entry for b in cached):
            raise AssertionError("the free list holds an indexed block, or the cached list an unindexed one")
        return {"used": len(used), "cached": len(cached), "free": len(free)}

    def stats(self) -> dict[str, int]:
        used = sum(1 for r in self._refs if r > 0)
        return {"blocks": self.num_blocks, "used": used, "cached": len(self._cached), "free": len(self._free)}


class SequenceKV:
    """One sequence in a pool: its block table and the token ids whose keys/values are stored."""

    def __init__(self, pool: KVPool):
        self.pool = pool
        self.blocks: list[int] = []
        self.tokens: list[int] = []

    def __len__(self) -> int:
        return len(self.tokens)

    @property
    def capacity(self) -> int:
        return len(self.blocks) * self.pool.block_size

    def blocks_for(self, length: int) -> int:
        """New blocks needed to hold ``length`` positions."""
        return max(-(-length // self.pool.block_size) - len(self.blocks), 0)

    def reserve(self, length: int) -> bool:
        """Blocks for ``length`` positions in all; False (taking nothing) when the pool has too few."""
        need = self.blocks_for(length)
        if need > self.pool.num_free:
            return False
        self.blocks.extend(self.pool.allocate() for _ in range(need))
        return True

    def adopt_prefix(self, tokens: list[int], limit: int) -> int:
        """Start an empty sequence from the cached blocks that hold the longest prefix of
        ``tokens[:limit]``; returns how many positions were reused (the rest must be computed)."""
        if self.blocks:
            raise RuntimeError("adopt_prefix needs an empty sequence")
        pool = self.pool
        if not pool.prefix_caching or limit <= 0:
            return 0
        full, source, n = pool.match(tokens, limit)
        for block in full:
            pool.incref(block)
        self.blocks = list(full)
        self.tokens = list(tokens[:len(full) * pool.block_size])
        if source is not None:
            pool.incref(source)  # keep it while a block is taken for the copy
            block = pool.allocate()
            if block is not None:
                pool.copy_block(block, source)
                self.blocks.append(block)
                self.tokens.extend(tokens[len(self.tokens):len(self.tokens) + n])
            pool.decref(source)
        return len(self.tokens)

    def commit(self, new_tokens: list[int]) -> None:
        """Record that the keys/values of ``new_tokens`` were written after the stored ones. Blocks that
        became full are indexed for sharing; one whose content another block already holds is swapped
        for that block (the same keys and values), so a sequence always holds its whole chain of parents."""
        pool, bs = self.pool, self.pool.block_size
        start = len(self.tokens)
        self.tokens.extend(new_tokens)
        if not pool.prefix_caching:
            return
        for b in range(start // bs, len(self.tokens) // bs):
            parent = self.blocks[b - 1] if b else ROOT
            block = self.blocks[b]
            standing = pool.index_full(block, parent, tuple(self.tokens[b * bs:(b + 1) * bs]))
            if standing != block:
                pool.incref(standing)
                pool.decref(block)
                self.blocks[b] = standing

    def truncate(self, length: int) -> None:
        """Keep the first ``length`` positions. A kept, partly filled last block that others share or that
        is indexed is replaced by a private copy before anything writes into it."""
        if not 0 <= length <= len(self.tokens):
            raise ValueError(f"cannot truncate a sequence of {len(self.tokens)} tokens to {length}")
        pool, bs = self.pool, self.pool.block_size
        keep = -(-length // bs)
        for block in reversed(self.blocks[keep:]):
            pool.decref(block)
        del self.blocks[keep:], self.tokens[length:]
        if length % bs:
            last = self.blocks[-1]
            if pool.refcount(last) > 1 or pool.is_indexed(last):
                copy = pool.allocate()
                if copy is None:  # no block for the copy: drop the partial block (recomputed later)
                    pool.decref(last)
                    del self.blocks[-1], self.tokens[length - length % bs:]
                else:
                    pool.copy_block(copy, last)
                    pool.decref(last)
                    self.blocks[-1] = copy

    def release(self) -> None:
        """Give every block back. Indexed blocks stay cached; the last, partly filled one is indexed too
        (when prefix caching is on), so the next turn of the conversation finds it."""
        pool, bs = self.pool, self.pool.block_size
        if pool.prefix_caching and len(self.tokens) % bs and len(self.blocks) > len(self.tokens) // bs:
            b = len(self.tokens) // bs
            parent = self.blocks[b - 1] if b else ROOT
            pool.index_partial(self.blocks[b], parent, tuple(self.tokens[b * bs:]))
        for block in reversed(self.blocks):  # the last block first: cached leaves are evicted before parents
            pool.decref(block)
        self.blocks, self.tokens = [], []


def _common_prefix(a, b) -> int:
    n = 0
    for x, y in zip(a, b):
        if x != y:
            break
        n += 1
    return n
