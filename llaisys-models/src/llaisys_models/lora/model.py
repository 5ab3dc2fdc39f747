"""What a model (families/causal_lm.CausalLM) offers for LoRA adapters:

    model.load_lora("sql", "path/to/peft-dir")       # or a llama.cpp GGUF adapter file
    model.generate(ids, 32, lora="sql")              # this call under the adapter
    model.generate_batch(prompts, 32, lora=[None, "sql", "chat"])   # the base and two adapters, one batch
    model.unload_lora("sql")
    model.merge_lora("sql")                          # folded into the base weights: full speed, one fine-tune

The adapters stay beside the base weights (slots.py): every adapted linear runs the base matmul, then each row's
adapter through ``lora_shrink`` / ``lora_expand``. ``enable_lora(max_loras, max_lora_rank)`` sizes the slots (the
first ``load_lora`` enables them with the defaults, the rank raised to the adapter's).

On a tensor-parallel model each rank holds its part of every pair (shard.py), and rank 0 tells the others what
to enable, load, unload and merge, and which adapter each slot holds before each step (parallel/messages.py).
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

import llaisys

from ..families.weights import Adapted, Weights
from .adapter import LoRAAdapter
from .slots import LoRASlots

if TYPE_CHECKING:
    from ..families.config import ModelConfig
    from ..parallel.followers import Followers

MAX_LORAS = 4  # vLLM's defaults: adapters in one batch, and their largest rank
MAX_LORA_RANK = 16
MAX_RANK = 512  # what enable_lora accepts

# How a path becomes an adapter of a model: the loader's (loading/lora.py), which knows the families' layouts; it
# hands its reader down when imported, as it does the model reader (causal_lm.set_directory_reader)
_read_adapter: Callable[[object, str, Path], LoRAAdapter] | None = None


def set_adapter_reader(read: Callable[[object, str, Path], LoRAAdapter]) -> None:
    global _read_adapter
    _read_adapter = read


class LoRAMixin:
    """LoRA adapters of a model (see the module's docstring)."""

    lora: LoRASlots | None = None  # the slots, once enabled
    loras: dict[str, LoRAAdapter]  # loaded adapters by name (set up by the model)

    if TYPE_CHECKING:
        config: ModelConfig
        weights: Weights
        dtype: llaisys.DType
        device: llaisys.Device
        group: llaisys.distributed.Group
        followers: Followers | None
        path: Path
        _step_lock: threading.Lock

        def _graphs_stale(self) -> None:
            """Drop the captured decode steps: they read weights or buffers that changed (the lock is held)."""

        def _drop_generator(self) -> None:
            """Drop the model's own KV pool: its cached prefixes were computed with other weights."""

    @property
    def max_loras(self) -> int:
        """How many adapters one forward may mix (0: LoRA not enabled)."""
        return 0 if self.lora is None else self.lora.max_loras

    def enable_lora(self, max_loras: int = MAX_LORAS, max_lora_rank: int = MAX_LORA_RANK) -> None:
        """Make room for ``max_loras`` adapters at once in a forward, of rank up to ``max_lora_rank``."""
        for name, value, top in (("max_loras", max_loras, 64), ("max_lora_rank", max_lora_rank, MAX_RANK)):
            if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= top:
                raise llaisys.LlaisysValueError(f"{name} must be an integer in [1, {top}], got {value!r}")
        if self.lora is not None:
            if (self.lora.max_loras, self.lora.max_rank) == (max_loras, max_lora_rank):
                return
            raise llaisys.LlaisysValueError(f"LoRA is already enabled with max_loras={self.lora.max_loras}, "
                                            f"max_lora_rank={self.lora.max_rank}")
        self.lora = LoRASlots(max_loras, max_lora_rank, self.dtype, self.device, self._graphs_stale)
        if self.followers is not None:  # the other ranks make the same slots (before the next load or step)
            self.followers.enable_lora(self.lora)

    def load_lora(self, name: str, path: str | Path) -> LoRAAdapter:
        """Read the adapter at ``path`` (a PEFT directory or a llama.cpp GGUF adapter) as ``name``."""
        if not isinstance(name, str) or not name or len(name) > 256 or not name.isprintable():
            raise llaisys.LlaisysValueError(f"an adapter name must be 1 to 256 printable characters, got {name!r}")
        if name in self.loras:
            raise llaisys.LlaisysValueError(f"an adapter named {name!r} is already loaded; unload it first")
        adapter = self._read_lora(name, Path(path))
        if self.lora is None:  # sized for the first adapter at least (only once it was read: a failed read leaves
            # the model as it was; on a tensor-parallel model, another rank's failed read below leaves LoRA enabled)
            self.enable_lora(max_lora_rank=min(max(MAX_LORA_RANK, adapter.rank), MAX_RANK))
        assert self.lora is not None
        if adapter.rank > self.lora.max_rank:
            raise llaisys.LlaisysValueError(f"adapter {name!r} has rank {adapter.rank}, over max_lora_rank "
                                            f"{self.lora.max_rank} (enable_lora(max_lora_rank=...) sets it, "
                                            f"before the first adapter)")
        with self._step_lock:  # the weights a forward reads change
            if self.followers is not None:  # every other rank reads its part (its failure raises here)
                self.followers.load_lora(adapter)
            self._add_lora(adapter)
        return adapter

    def _read_lora(self, name: str, path: Path, uid: int | None = None) -> LoRAAdapter:
        """The adapter at ``path``; on a tensor-parallel model, this rank's part of it (``uid``: rank 0's)."""
        if _read_adapter is None:
            raise RuntimeError("no adapter reader: import llaisys_models")
        if self.group.world_size == 1:
            return _read_adapter(self, name, path)
        from .shard import read_part

        # (absolute: the other ranks read the same path, whatever their working directory)
        return read_part(_read_adapter, self, name, Path(os.path.abspath(path)), uid)

    def _add_lora(self, adapter: LoRAAdapter) -> None:
        """Adapt the linears ``adapter`` adapts (their slots made) and keep it by name; the step lock is held."""
        assert self.lora is not None  # (enabled first)
        wrapped = False
        for layer, field in adapter.pairs:
            weights = self.weights.layers[layer]
            base = getattr(weights, field)
            if not isinstance(base, Adapted):
                setattr(weights, field, Adapted(base, self.lora.linear((layer, field), base.shape)))
                wrapped = True
        if wrapped:
            self._graphs_stale()
        self.loras[adapter.name] = adapter

    def unload_lora(self, name: str) -> None:
        """Forget the adapter ``name`` (its slots are free for others). Sequences running under it must be done:
        the serving engine waits for them (serve/engine.py)."""
        adapter = self.lora_adapter(name)
        assert self.lora is not None  # (an adapter is loaded)
        with self._step_lock:
            self.lora.forget(adapter)
            if self.followers is not None:  # (the others forget it before the next step)
                self.followers.forget_lora(adapter)
        del self.loras[name]

    def lora_adapter(self, name: str) -> LoRAAdapter:
        """The loaded adapter ``name`` (an error naming the loaded ones where there is none)."""
        try:
            return self.loras[name]
        except (KeyError, TypeError):
            loaded = ", ".join(repr(n) for n in self.loras) or "none"
            raise llaisys.LlaisysValueError(f"no LoRA adapter named {name!r} is loaded (loaded: {loaded})") from None

    def merge_lora(self, name: str) -> None:
        """Fold the adapter into the base weights (W += scale B A, rounded once to the model dtype) and unload it:
        the model is then the fine-tune, at the base model's speed. Float weights only (a quantized base would be
        re-quantized: not done)."""
        adapter = self.lora_adapter(name)
        merged = {}
        for (layer, field), pair in adapter.pairs.items():
            weight = getattr(self.weights.layers[layer], field)
            base = weight.base if isinstance(weight, Adapted) else weight
            if not isinstance(base, llaisys.Tensor):
                raise llaisys.LlaisysValueError(f"merge_lora: layer {layer}'s {field} is stored quantized "
                                                f"({type(base).__name__}); merging needs float weights")
            w = base.numpy().astype(np.float32) + pair.scale * (pair.b @ pair.a)
            merged[layer, field] = llaisys.from_numpy(w.astype(self.dtype.numpy), self.device)
        with self._step_lock:
            for (layer, field), w in merged.items():
                weight = getattr(self.weights.layers[layer], field)
                setattr(self.weights.layers[layer], field,
                        Adapted(w, weight.lora) if isinstance(weight, Adapted) else w)
            self._graphs_stale()
            if self.followers is not None:  # each rank folds its part into its part (before the next step)
                self.followers.merge_lora(adapter)
        self.unload_lora(name)
        self._drop_generator()  # its cached prefixes were computed with the old weights

    def lora_for(self, name: str | None) -> LoRAAdapter | None:
        """The adapter a call names (None: the base model)."""
        return None if name is None else self.lora_adapter(name)
