"""Per-layer key/value buffers ``[capacity, kv_heads, head_dim]`` filled position by position.

Allocated once for the length a generation asks for and grown in chunks (the old
content copied by ``rearrange``) only when a later request needs more; never per token.
The cache also remembers the token ids it holds, so a caller can keep a shared prefix
(``truncate``) and continue from it.
"""

from __future__ import annotations

import numpy as np

import llaisys

CHUNK = 256  # capacity grows in multiples of this many positions


class KVCache:
    def __init__(self, num_layers: int, kv_heads: int, head_dim: int, dtype: llaisys.DType,
                 device: llaisys.Device, max_positions: int):
        self.num_layers = num_layers
        self.kv_heads = kv_heads
        self.head_dim = head_dim
        self.dtype = dtype
        self.device = device
        self.max_positions = max_positions
        self.capacity = 0
        self.keys: list[llaisys.Tensor] = []
        self.values: list[llaisys.Tensor] = []
        self.positions: llaisys.Tensor | None = None  # int64 [capacity]: 0, 1, 2, ... (rope's pos_ids)
        self.tokens: list[int] = []  # the ids whose keys/values are stored, in order

    def __len__(self) -> int:
        return len(self.tokens)

    def reserve(self, length: int) -> None:
        """Make room for ``length`` positions in total (a no-op when there already is)."""
        if length <= self.capacity:
            return
        capacity = min(max(-(-length // CHUNK) * CHUNK, 2 * self.capacity), self.max_positions)
        capacity = max(capacity, length)
        shape = (capacity, self.kv_heads, self.head_dim)
        keys = [llaisys.empty(shape, self.dtype, self.device) for _ in range(self.num_layers)]
        values = [llaisys.empty(shape, self.dtype, self.device) for _ in range(self.num_layers)]
        used = len(self)
        if used:
            for new, old in zip(keys + values, self.keys + self.values):
                llaisys.ops.rearrange(new.slice(0, 0, used), old.slice(0, 0, used))
        self.positions = llaisys.from_numpy(np.arange(capacity, dtype=np.int64), self.device)
        self.keys, self.values, self.capacity = keys, values, capacity

    def slot(self, layer: int, start: int, end: int) -> tuple[llaisys.Tensor, llaisys.Tensor]:
        """Views of positions [start, end) of one layer's keys and values, to be written."""
        return self.keys[layer].slice(0, start, end), self.values[layer].slice(0, start, end)

    def truncate(self, length: int) -> None:
        """Forget every position from ``length`` on (the buffers stay allocated)."""
        if not 0 <= length <= len(self):
            raise ValueError(f"cannot truncate a cache of {len(self)} tokens to {length}")
        del self.tokens[length:]

    def reset(self) -> None:
        self.tokens.clear()

    def release(self) -> None:
        """Give the buffers back (the next ``reserve`` allocates again)."""
        self.reset()
        self.keys, self.values, self.positions, self.capacity = [], [], None, 0

    @property
    def nbytes(self) -> int:
        return 2 * self.num_layers * self.capacity * self.kv_heads * self.head_dim * self.dtype.itemsize
