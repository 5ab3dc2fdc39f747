"""Reading a LoRA adapter for a loaded model: a PEFT directory (lora/peft.py) or a llama.cpp GGUF adapter
(lora/gguf.py), checked against the model's own linears and laid out as its family's files are (fused rows,
GGUF's Q/K order)."""

from __future__ import annotations

from pathlib import Path

from ..errors import ModelLoadError
from ..families.registry import FAMILIES
from ..families.weights import Adapted
from ..lora import gguf, peft
from ..lora.adapter import TARGETS, LoRAAdapter
from ..lora.model import set_adapter_reader


def read_adapter(model, name: str, path: Path) -> LoRAAdapter:
    """The adapter at ``path`` for ``model`` (a CausalLM)."""
    shapes = {}
    for i, layer in enumerate(model.weights.layers):
        for field in TARGETS:
            weight = getattr(layer, field)
            if weight is not None:
                shapes[i, field] = (weight.base if isinstance(weight, Adapted) else weight).shape
    family = FAMILIES[model.config.architecture]
    if peft.is_peft_directory(path):
        return peft.read_peft(name, path, shapes, family.fused)
    if path.is_file() and gguf.is_gguf_file(path):
        if family.gguf is None:
            raise ModelLoadError(f"adapter {name!r}: llaisys reads no GGUF file of {model.config.architecture}")
        return gguf.read_gguf_adapter(name, path, shapes, family.gguf, model.config)
    raise ModelLoadError(f"adapter {name!r}: {path} is neither a PEFT adapter directory (with adapter_config.json) "
                         f"nor a GGUF adapter file")


set_adapter_reader(read_adapter)
