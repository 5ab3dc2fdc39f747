"""The paged KV cache's memory: per layer, keys and values in one pool of fixed-size blocks.

    pool = KVPool(shape, num_blocks, block_size)   # keys[layer], values[layer]: [blocks, block_size, Hkv, d]
    seq = pool.sequence(scope)                     # a block table (kv_blocks.SequenceKV)
    pool.layers[i].write(k, v, step); pool.layers[i].attend(out, q, step, scale, numerics, window)

Where global layers sit beside sliding ones (Gemma 3), the layers are in groups (``layer_groups``), each with a
block table of its own in the step (``step.group_slots`` / ``group_tables``), and a block holds one group's
keys and values: the sliding groups give their blocks back as a sequence grows.

The cache holds the model's dtype, or (``KVShape.cache_dtype`` "int8" / "fp8") one byte per key or value and an
f16 scale per token and kv head (``llaisys.ops.paged_q``): about half the memory, so twice the tokens.
Which block holds what, reference counts and the prefix index are the plain-Python ``BlockManager`` this
class extends (kv_blocks.py); it adds only the tensors, and copies a block's when the manager copies on write.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from typing import Protocol

import llaisys

from .kv_blocks import BlockManager, GroupedSequenceKV


class PoolFollowers(Protocol):
    """Whoever keeps other pools in step with this one: a tensor-parallel model's other ranks (parallel/followers.py
    implements it; the engine knows it only by this shape, so it imports nothing of parallel/)."""

    def grow(self, pool: KVPool, num_blocks: int) -> None: ...

    def copy_block(self, pool: KVPool, dst: int, src: int) -> None: ...


KV_CACHE_DTYPES = ("auto", "int8", "fp8")  # "auto": the model's dtype; else llaisys.ops.KV_FORMATS


def add_argument(parser) -> None:
    """``--kv-cache-dtype auto|int8|fp8`` on a CLI command that loads a model."""
    parser.add_argument("--kv-cache-dtype", default="auto", choices=KV_CACHE_DTYPES,
                        help="how the KV cache stores keys and values: auto (the model's dtype, default), int8 or "
                             "fp8 (e4m3): one byte each and an f16 scale per token and kv head, about twice the "
                             "tokens in the same memory at a small loss of accuracy")


def check_kv_cache_dtype(value) -> str:
    if value not in KV_CACHE_DTYPES:
        raise llaisys.LlaisysValueError(f"kv_cache_dtype must be one of {', '.join(map(repr, KV_CACHE_DTYPES))}, "
                                        f"got {value!r}")
    return value


@dataclasses.dataclass(frozen=True)
class KVShape:
    """What one token's keys and values look like in every layer; ``cache_dtype`` how they are stored."""
    num_layers: int
    kv_heads: int
    head_dim: int
    dtype: llaisys.DType  # the model's: what is written and what attention returns
    device: llaisys.Device
    cache_dtype: str = "auto"
    value_dim: int = 0  # values per kv head where they differ from head_dim (0: head_dim)
    # MLA (DeepSeek): the "keys" are each token's latent c (head_dim values), the "values" its rope key r
    # (value_dim values), attended in the absorbed form (LatentLayerKV)
    latent: bool = False

    def __post_init__(self) -> None:
        if self.latent and self.kv_format is not None:
            raise llaisys.LlaisysValueError(f"kv_cache_dtype={self.cache_dtype!r}: a latent (MLA) cache is kept in "
                                            f"the model's dtype only; choose 'auto'")

    @property
    def values(self) -> int:
        """Values per token and kv head."""
        return self.value_dim or self.head_dim

    @property
    def kv_format(self) -> str | None:
        """The quantized format the cache stores ("int8" / "fp8"), None for the model's dtype."""
        return None if self.cache_dtype == "auto" else self.cache_dtype

    @property
    def bytes_per_token(self) -> int:
        if self.kv_format is None:
            return self.num_layers * self.kv_heads * (self.head_dim + self.values) * self.dtype.itemsize
        return self.num_layers * self.kv_heads * (self.head_dim + self.values + 2 * llaisys.float16.itemsize)


@dataclasses.dataclass(frozen=True)
class LayerGroup:
    """Layers whose keys and values share a block table: model layers ``layers``, each sliding over ``window``
    positions (0: each sees every position)."""
    window: int
    layers: tuple[int, ...]


def layer_groups(windows: Sequence[int]) -> tuple[LayerGroup, ...]:
    """The groups of a model whose layer i slides over ``windows[i]`` positions (0: sees every one): one group
    where every layer has the same window; else each window's layers cut, in order, into runs of g layers, g the
    greatest common divisor of their counts (Gemma 3's 4 global and 22 sliding layers: 2 + 11 groups of 2), so
    that a block (g layers' keys and values of block_size positions) can serve any group, as vLLM's hybrid
    allocator does. The sliding groups give their blocks back (kv_blocks.GroupedSequenceKV)."""
    by_window: dict[int, list[int]] = {}
    for layer, window in enumerate(windows):
        by_window.setdefault(window, []).append(layer)
    g = math.gcd(*(len(layers) for layers in by_window.values()))
    return tuple(LayerGroup(window, tuple(layers[i:i + g])) for window, layers in by_window.items()
                 for i in range(0, len(layers), g))


class LayerKV:
    """One layer's keys and values [blocks, block_size, Hkv, d] in the model's dtype: what its attention writes
    a step's keys into and attends over, through the block table of its layer ``group``."""

    def __init__(self, keys: llaisys.Tensor, values: llaisys.Tensor, group: int = 0):
        self.keys, self.values, self.group = keys, values, group

    def write(self, k: llaisys.Tensor, v: llaisys.Tensor, step) -> None:
        llaisys.ops.paged_kv_write(self.keys, self.values, k, v, step.group_slots[self.group])

    def attend(self, out: llaisys.Tensor, q: llaisys.Tensor, step, scale: float, numerics: str, window: int) -> None:
        llaisys.ops.paged_attention(out, q, self.keys, self.values, step.group_tables[self.group], step.seq_lens,
                                    step.query_start, scale, numerics, window)


class LatentLayerKV(LayerKV):
    """One MLA layer's cache: each token's latent c [blocks, block_size, 1, dc] (``keys``) and rope key r [blocks,
    block_size, 1, dr] (``values``), written as a kv head's keys and values and attended in the absorbed form
    (llaisys.ops.paged_latent_attention: q [T, H, dc + dr] -> out [T, H, dc])."""

    def attend(self, out, q, step, scale: float, numerics: str, window: int) -> None:
        c, r = self.keys, self.values
        llaisys.ops.paged_latent_attention(out, q, c.view(*c.shape[:2], c.shape[3]), r.view(*r.shape[:2], r.shape[3]),
                                           step.group_tables[self.group], step.seq_lens, step.query_start, scale)


class QuantizedLayerKV(LayerKV):
    """One layer's keys and values as bytes [blocks, block_size, Hkv, d] of ``kv_format`` with f16 scales
    [blocks, block_size, Hkv]. Attention over them computes in f32 whatever ``numerics`` says: HF has no such
    cache whose rounding there would be to follow."""

    def __init__(self, keys, values, key_scales, value_scales, kv_format: str, group: int = 0):
        super().__init__(keys, values, group)
        self.key_scales, self.value_scales, self.kv_format = key_scales, value_scales, kv_format

    def write(self, k, v, step) -> None:
        llaisys.ops.paged_kv_write_q(self.keys, self.values, self.key_scales, self.value_scales, k, v,
                                     step.group_slots[self.group], self.kv_format)

    def attend(self, out, q, step, scale, numerics, window) -> None:
        llaisys.ops.paged_attention_q(out, q, self.keys, self.values, self.key_scales, self.value_scales,
                                      step.group_tables[self.group], step.seq_lens, step.query_start, scale,
                                      self.kv_format, window)


class KVPool(BlockManager):
    """Keys and values of ``num_blocks`` blocks of ``block_size`` positions, for every layer; or, given layer
    ``groups`` (layer_groups: global layers beside sliding ones), for g layers (a group's), each group's
    sequence holding blocks of its own (kv_blocks.GroupedSequenceKV)."""

    def __init__(self, shape: KVShape, num_blocks: int, block_size: int = 16, *, prefix_caching: bool = True,
                 groups: tuple[LayerGroup, ...] | None = None):
        super().__init__(num_blocks, block_size, prefix_caching=prefix_caching)
        self.shape = shape
        self.groups = groups or (LayerGroup(0, tuple(range(shape.num_layers))),)
        if sorted(layer for group in self.groups for layer in group.layers) != list(range(shape.num_layers)) or \
                len({len(group.layers) for group in self.groups}) != 1:
            raise llaisys.LlaisysValueError(f"KV pool layer groups must hold each of the {shape.num_layers} layers "
                                            f"once, in groups of one size: got {self.groups}")
        self.keys: list[llaisys.Tensor] = []
        self.values: list[llaisys.Tensor] = []
        self.key_scales: list[llaisys.Tensor] = []  # (a quantized cache's, else empty)
        self.value_scales: list[llaisys.Tensor] = []
        self.layers: list[LayerKV] = []
        self.generation = 0  # bumped whenever the tensors are reallocated (decode graphs point into them)
        # a tensor-parallel model's other ranks, whose pools (their kv heads) follow this one's blocks
        self.followers: PoolFollowers | None = None
        self.follower_id = 0
        self._allocate(num_blocks, kept=0)

    def _allocate(self, num_blocks: int, kept: int) -> None:
        s = self.shape
        rows = (num_blocks, self.block_size, s.kv_heads)
        shapes: dict[str, tuple[tuple[int, ...], llaisys.DType]]
        if s.kv_format is None:
            shapes = {"keys": ((*rows, s.head_dim), s.dtype), "values": ((*rows, s.values), s.dtype)}
        else:
            shapes = {"keys": ((*rows, s.head_dim), llaisys.uint8), "values": ((*rows, s.values), llaisys.uint8),
                      "key_scales": (rows, llaisys.float16), "value_scales": (rows, llaisys.float16)}
        for name, (shape, dtype) in shapes.items():
            old, new = getattr(self, name), []
            for slot in range(self.layers_per_block):
                t = llaisys.empty(shape, dtype, s.device)
                if kept:
                    llaisys.ops.rearrange(t.slice(0, 0, kept), old[slot])
                new.append(t)
            setattr(self, name, new)
        # layer i: the tensors of its place in its group (a block holds one layer of each place), its group's table
        place = {layer: (g, slot) for g, group in enumerate(self.groups) for slot, layer in enumerate(group.layers)}
        self.layers = []
        for layer in range(s.num_layers):
            g, slot = place[layer]
            if s.latent:
                self.layers.append(LatentLayerKV(self.keys[slot], self.values[slot], g))
            elif s.kv_format is None:
                self.layers.append(LayerKV(self.keys[slot], self.values[slot], g))
            else:
                self.layers.append(QuantizedLayerKV(self.keys[slot], self.values[slot], self.key_scales[slot],
                                                    self.value_scales[slot], s.kv_format, g))
        self.generation += 1

    @property
    def layers_per_block(self) -> int:
        """Layers whose keys and values a block holds: every layer's, or one group's."""
        return len(self.groups[0].layers)

    @property
    def num_groups(self) -> int:
        return len(self.groups)

    @property
    def gives_back(self) -> bool:
        return bool(self.window) or any(group.window for group in self.groups)

    @property
    def capacity_tokens(self) -> int:
        """Positions of one sequence the blocks hold in every group (a sliding group gives blocks back as it
        grows, so a sequence holds fewer, but a group may need them all before it does)."""
        return self.num_blocks * self.block_size // self.num_groups

    def sequence(self, scope: str = "", adapter=None):
        if self.num_groups == 1:
            return super().sequence(scope, adapter)
        return GroupedSequenceKV(self, [group.window for group in self.groups], scope, adapter)

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
        for t in (*self.keys, *self.values, *self.key_scales, *self.value_scales):
            llaisys.ops.rearrange(t.slice(0, dst, dst + 1), t.slice(0, src, src + 1))
        if self.followers is not None:
            self.followers.copy_block(self, dst, src)

    @property
    def bytes_per_block(self) -> int:
        return self.block_size * self.shape.bytes_per_token * self.layers_per_block // self.shape.num_layers

    @property
    def nbytes(self) -> int:
        return self.num_blocks * self.bytes_per_block
