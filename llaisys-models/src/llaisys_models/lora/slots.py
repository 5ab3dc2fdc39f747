"""LoRA adapters on the device: a fixed number of slots per adapted linear, and which adapter each row of a
step reads (Punica / S-LoRA's layout: many adapters, one batch).

Every adapted linear keeps its slots stacked, so one pair of ops serves every adapter of a step:

    a       [S, R, K]   slot s: its adapter's A, zero rows below the adapter's rank (R: max_lora_rank)
    b       [S, R, N]   slot s: B^T, zero rows likewise
    scales  [S]         float32: alpha / r of the adapter's pair (0 where it does not adapt this linear)

    h   = lora_shrink(x, a, adapters, scales)    h[m] = scale[s] * x[m] A_s^T      s = adapters[m]
    out = lora_expand(out, h, b, adapters)      out[m] += h[m] B_s^T             rows with s = -1: untouched

A step's ``adapters`` (int64, one slot per row, -1 for the base model) is made on the host from its sequences'
adapters (``LoRASlots.rows``), which first places every adapter of the step in a slot: a free one, else the one
used longest ago that the step does not need. The scheduler admits no more adapters at once than there are slots
(``max_loras``), so a step always finds room. A step whose rows have no adapter runs no LoRA op at all.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, cast

import numpy as np

import llaisys

from .adapter import LoRAAdapter, LoRAPair

if TYPE_CHECKING:
    from ..engine.step_inputs import Batch


class StepRows:
    """What the adapted linears of one forward read: each row's slot (None: no row has an adapter, and no LoRA op
    runs) and a float32 work buffer for h, grown (never shrunk) to the largest step."""

    def __init__(self, rank: int, device: llaisys.Device, on_grow: Callable[[], None]) -> None:
        self.rank, self.device, self.on_grow = rank, device, on_grow
        self.adapters: llaisys.Tensor | None = None
        self._h: llaisys.Tensor | None = None

    def h(self, rows: int) -> llaisys.Tensor:
        """The work buffer's first ``rows`` rows [rows, R] (the same memory each step: a captured graph reads it)."""
        if self._h is None or self._h.shape[0] < rows:
            self._h = llaisys.empty((max(rows, 256), self.rank), llaisys.float32, self.device)
            self.on_grow()  # graphs captured over the old buffer must not replay
        return self._h.slice(0, 0, rows)


class LoRALinear:
    """One adapted linear's slots (see the module's docstring): ``shape`` [N, K] is the base linear's."""

    def __init__(self, shape: tuple[int, int], slots: int, rank: int, dtype: llaisys.DType, device: llaisys.Device,
                 rows: StepRows) -> None:
        n, k = shape
        self.shape, self.rank, self.dtype, self.rows = (n, k), rank, dtype, rows
        self.a = llaisys.zeros((slots, rank, k), dtype, device)
        self.b = llaisys.zeros((slots, rank, n), dtype, device)
        self.scales = llaisys.zeros((slots,), llaisys.float32, device)
        self._scales = np.zeros(slots, np.float32)

    def place(self, slot: int, pair: LoRAPair | None) -> None:
        """Put ``pair`` in ``slot`` (None: the slot's adapter leaves this linear as it is)."""
        n, k = self.shape
        a = np.zeros((self.rank, k), np.float32)
        b = np.zeros((self.rank, n), np.float32)
        if pair is not None:
            a[:pair.rank] = pair.a
            b[:pair.rank] = pair.b.T
        self.a.slice(0, slot, slot + 1).load(a.astype(self.dtype.numpy))  # (bf16: ml_dtypes, to nearest even)
        self.b.slice(0, slot, slot + 1).load(b.astype(self.dtype.numpy))
        self._scales[slot] = 0.0 if pair is None else pair.scale
        self.scales.load(self._scales)

    def apply(self, out: llaisys.Tensor, x: llaisys.Tensor) -> None:
        adapters = self.rows.adapters
        if adapters is None:
            return
        h = self.rows.h(x.shape[0])
        llaisys.ops.lora_shrink(h, x, self.a, adapters, self.scales)
        llaisys.ops.lora_expand(out, h, self.b, adapters)


@dataclasses.dataclass
class _Slot:
    adapter: LoRAAdapter | None = None
    last_used: int = 0


class LoRASlots:
    """The device side of a model's adapters: ``max_loras`` slots of rank up to ``max_rank`` in every adapted
    linear (``linears``, by (layer, field)), and which adapter each slot holds."""

    def __init__(self, max_loras: int, max_rank: int, dtype: llaisys.DType, device: llaisys.Device,
                 on_grow: Callable[[], None]) -> None:
        self.max_loras, self.max_rank, self.dtype, self.device = max_loras, max_rank, dtype, device
        self.step = StepRows(max_rank, device, on_grow)
        self.linears: dict[tuple[int, str], LoRALinear] = {}
        self.slots = [_Slot() for _ in range(max_loras)]
        self._clock = 0

    def linear(self, key: tuple[int, str], shape: tuple[int, int]) -> LoRALinear:
        """The slots of the linear ``key`` (made, all zero, the first time an adapter adapts it)."""
        if key not in self.linears:
            self.linears[key] = LoRALinear(shape, self.max_loras, self.max_rank, self.dtype, self.device, self.step)
        return self.linears[key]

    def rows(self, batch: Batch) -> np.ndarray | None:
        """Each row's slot for a forward over ``batch`` (int64 [T], -1: the base model), its adapters placed in
        slots first; None where no sequence has an adapter."""
        adapters = [cast("LoRAAdapter | None", kv.adapter) for kv, _ in batch]
        if all(a is None for a in adapters):
            return None
        slot_of = self.place(a for a in adapters if a is not None)
        return np.concatenate([np.full(len(ids), -1 if a is None else slot_of[a.uid], np.int64)
                               for a, (_, ids) in zip(adapters, batch)])

    def place(self, adapters: Iterable[LoRAAdapter]) -> dict[int, int]:
        """Put ``adapters`` in slots (those already in one stay there); their slots by uid."""
        wanted = {a.uid: a for a in adapters}
        if len(wanted) > self.max_loras:
            raise llaisys.LlaisysValueError(f"a step uses {len(wanted)} LoRA adapters but there are {self.max_loras} "
                                            f"slots (max_loras)")
        self._clock += 1
        slot_of = {}
        for i, slot in enumerate(self.slots):
            if slot.adapter is not None and slot.adapter.uid in wanted:
                slot_of[slot.adapter.uid] = i
                slot.last_used = self._clock
        for uid, adapter in wanted.items():
            if uid in slot_of:
                continue
            free = [i for i, s in enumerate(self.slots) if s.adapter is None or s.last_used < self._clock]
            i = min(free, key=lambda j: (self.slots[j].adapter is not None, self.slots[j].last_used))
            self.put(i, adapter)
            slot_of[uid] = i
        return slot_of

    def put(self, slot: int, adapter: LoRAAdapter) -> None:
        """Copy ``adapter``'s pairs into ``slot`` of every adapted linear (zero where it adapts none); the slot now
        holds it. (The other ranks of a tensor-parallel model put adapters where rank 0 placed them.)"""
        for key, linear in self.linears.items():
            linear.place(slot, adapter.pairs.get(key))
        self.slots[slot] = _Slot(adapter, self._clock)

    def forget(self, adapter: LoRAAdapter) -> None:
        """``adapter`` is unloaded: its slot is free (its contents are overwritten by the next adapter placed)."""
        for i, slot in enumerate(self.slots):
            if slot.adapter is adapter:
                self.slots[i] = _Slot()

