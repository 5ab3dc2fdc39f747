"""A LoRA adapter as read from its files: for some linears of some layers, the low-rank pair (A, B) and the
scale, so that the adapted linear computes

    y = x W^T + b  +  scale * (x A^T) B^T          A [r, K], B [N, r]   (W [N, K])

PEFT's scale is lora_alpha / r (rsLoRA: lora_alpha / sqrt(r)), llama.cpp's alpha / r. The pairs are kept on the
host in float32, in HF's row order (a GGUF adapter's Q/K rows are put back as the base loader puts the base's);
slots.py places them on the device when a step needs them.
"""

from __future__ import annotations

import dataclasses
import itertools
from pathlib import Path

import numpy as np

from ..errors import ModelLoadError

# The linears an adapter may adapt, as LayerWeights names them, with the name of the module HF gives each
# (PEFT's target_modules and adapter_model.safetensors name them so, after "model.layers.{i}.")
TARGETS = {
    "q_proj": "self_attn.q_proj", "k_proj": "self_attn.k_proj", "v_proj": "self_attn.v_proj",
    "o_proj": "self_attn.o_proj", "gate_proj": "mlp.gate_proj", "up_proj": "mlp.up_proj",
    "down_proj": "mlp.down_proj",
}

_uids = itertools.count(1)


@dataclasses.dataclass(frozen=True)
class LoRAPair:
    """One adapted linear: ``a`` [r, K] and ``b`` [N, r] (float32), and the scale of their product."""

    a: np.ndarray
    b: np.ndarray
    scale: float

    @property
    def rank(self) -> int:
        return self.a.shape[0]


@dataclasses.dataclass(eq=False)
class LoRAAdapter:
    """A loaded adapter: its name, where it was read from, and its pairs by (layer, linear) — the linear as
    LayerWeights names it ("q_proj", ...). ``uid`` tells two loads apart (the prefix cache is keyed by it: a
    prefix computed under one adapter never serves another, nor a reload of the same name)."""

    name: str
    path: Path
    pairs: dict[tuple[int, str], LoRAPair]
    uid: int = dataclasses.field(default_factory=lambda: next(_uids))

    @property
    def rank(self) -> int:
        """The largest rank of its pairs."""
        return max(p.rank for p in self.pairs.values())

    @property
    def targets(self) -> tuple[str, ...]:
        """The linears it adapts (in TARGETS' order)."""
        fields = {field for _, field in self.pairs}
        return tuple(f for f in TARGETS if f in fields)

    @property
    def nbytes(self) -> int:
        return sum(p.a.nbytes + p.b.nbytes for p in self.pairs.values())

    def __repr__(self) -> str:
        return (f"LoRAAdapter({self.name!r}, rank {self.rank}, {len(self.pairs)} linears: "
                f"{', '.join(self.targets)})")


def check_pair(where: str, a: np.ndarray, b: np.ndarray, shape: tuple[int, int]) -> None:
    """``a`` [r, K] and ``b`` [N, r] must fit a base linear of ``shape`` [N, K]: else the adapter was made for
    another model."""
    n, k = shape
    if a.ndim != 2 or b.ndim != 2 or a.shape[0] != b.shape[1] or a.shape[0] < 1:
        raise ModelLoadError(f"{where}: lora_A {a.shape} and lora_B {b.shape} are not a pair [r, K], [N, r]")
    if a.shape[1] != k or b.shape[0] != n:
        raise ModelLoadError(f"{where}: the adapter's pair makes [{b.shape[0]}, {a.shape[1]}] but the base model's "
                             f"linear is [{n}, {k}]: an adapter for another model")
    for name, m in (("lora_A", a), ("lora_B", b)):
        if not np.isfinite(m).all():
            raise ModelLoadError(f"{where}: {name} holds NaN or infinite values")
