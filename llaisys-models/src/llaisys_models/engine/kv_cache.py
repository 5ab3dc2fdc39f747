"""The paged KV cache's memory: per layer, keys and values in one pool of fixed-size blocks.

    pool = KVPool(shape, num_blocks, block_size)   # keys[layer], values[layer]: [blocks, block_size, Hkv, d]
    seq = pool.sequence(scope)                     # a block table (kv_blocks.SequenceKV)

Which block holds what, reference counts and the prefix index are the plain-Python ``BlockManager`` this
class extends (kv_blocks.py); it adds only the tensors, and copies a block's when the manager copies on write.
"""

from __future__ import annotations

import dataclasses
from typing import Protocol

import llaisys

from .kv_blocks import BlockManager


class PoolFollowers(Protocol):
    """Whoever keeps other pools in step with this one: a tensor-parallel model's other ranks (parallel/followers.py
    implements it; the engine knows it only by this shape, so it imports nothing of parallel/)."""

    def grow(self, pool: KVPool, num_blocks: int) -> None: ...

    def copy_block(self, pool: KVPool, dst: int, src: int) -> None: ...


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


class KVPool(BlockManager):
    """Keys and values of ``num_blocks`` blocks of ``block_size`` positions, for every layer."""

    def __init__(self, shape: KVShape, num_blocks: int, block_size: int = 16, *, prefix_caching: bool = True):
        super().__init__(num_blocks, block_size, prefix_caching=prefix_caching)
        self.shape = shape
        self.keys: list[llaisys.Tensor] = []
        self.values: list[llaisys.Tensor] = []
        self.generation = 0  # bumped whenever the tensors are reallocated (decode graphs point into them)
        # a tensor-parallel model's other ranks, whose pools (their kv heads) follow this one's blocks
        self.followers: PoolFollowers | None = None
        self.follower_id = 0
        self._allocate(num_blocks, kept=0)

    def _allocate(self, num_blocks: int, kept: int) -> None:
        s = self.shape
        keys: list[llaisys.Tensor] = []
        values: list[llaisys.Tensor] = []
        for layer in range(s.num_layers):
            for new, old in ((keys, self.keys), (values, self.values)):
                t = llaisys.empty((num_blocks, self.block_size, s.kv_heads, s.head_dim), s.dtype, s.device)
                if kept:
                    llaisys.ops.rearrange(t.slice(0, 0, kept), old[layer])
                new.append(t)
        self.keys, self.values = keys, values
        self.generation += 1

    def grow(self, num_blocks: int) -> None:
        """Have ``num_blocks`` blocks in all (more memory; block ids and their content stay)."""
        if num_blocks > self.num_blocks:
            self._allocate(num_blocks, kept=self.num_blocks)
            self.add_blocks(num_blocks)
            if self.followers is not None:
                self.followers.grow(self, num_blocks)

    def reserve_growing(self, seq, length: int) -> None:
        """Blocks for ``length`` positions in ``seq`` (one of this pool's sequences), growing the pool, at least
        doubling it, when too few are free (for a pool with one owner: a session, a draft model's)."""
        if not seq.reserve(length):
            self.grow(max(seq.blocks_for(length) + self.num_blocks - self.num_free, 2 * self.num_blocks))
            seq.reserve(length)

    def copy_block(self, dst: int, src: int) -> None:
        for t in (*self.keys, *self.values):
            llaisys.ops.rearrange(t.slice(0, dst, dst + 1), t.slice(0, src, src + 1))
        if self.followers is not None:
            self.followers.copy_block(self, dst, src)

    @property
    def bytes_per_block(self) -> int:
        return self.block_size * self.shape.bytes_per_token

    @property
    def nbytes(self) -> int:
        return self.num_blocks * self.bytes_per_block
