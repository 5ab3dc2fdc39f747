"""Reading a HuggingFace PEFT LoRA adapter: a directory with ``adapter_config.json`` and
``adapter_model.safetensors`` (what ``PeftModel.save_pretrained`` writes).

The tensors are ``base_model.model.model.layers.{i}.{module}.lora_A.weight`` [r, K] and ``...lora_B.weight``
[N, r]. The scale of each module is alpha / r, or alpha / sqrt(r) with ``use_rslora``, where ``rank_pattern`` and
``alpha_pattern`` override r and lora_alpha for the modules they match (PEFT's rule: the first pattern p with
``re.match(rf"(.*\\.)?({p})$", module name)``). What llaisys cannot apply beside the base weights is refused
with its reason: DoRA, ``modules_to_save``, trained biases, adapters of the embedding or the LM head.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Mapping
from pathlib import Path

import numpy as np

from ..errors import ModelLoadError, shown
from ..loading.files import parse_json
from ..loading.safetensors import SafetensorsFile
from .adapter import TARGETS, LoRAAdapter, LoRAPair, check_pair

CONFIG = "adapter_config.json"
WEIGHTS = "adapter_model.safetensors"
_TENSOR = re.compile(r"base_model\.model\.model\.layers\.(\d+)\.(.+)\.lora_([AB])\.weight")
# config fields that change what an adapter computes in a way llaisys does not apply, and why
_REFUSED = {
    "use_dora": "DoRA (use_dora) rescales each base weight's columns: not applied beside the base weights",
    "modules_to_save": "modules_to_save replaces whole modules with trained copies: that is a model, not an adapter",
    "layer_replication": "layer_replication builds extra layers out of the base model's",
    "fan_in_fan_out": "fan_in_fan_out is for GPT-2's Conv1D weights, which no model here has",
    "use_qalora": "QA-LoRA pools the inputs per quantization group",
}


def is_peft_directory(path: Path) -> bool:
    return path.is_dir() and (path / CONFIG).is_file()


def read_peft(name: str, path: Path, shapes: Mapping[tuple[int, str], tuple[int, int]],
              fused: Mapping[str, tuple[str, ...]]) -> LoRAAdapter:
    """The adapter in the PEFT directory ``path``, checked against the base model's linears: ``shapes`` gives
    the [N, K] of each (layer, linear) the base has; ``fused`` the modules that hold several linears as rows
    (Phi-3's "self_attn.qkv_proj": ("q_proj", "k_proj", "v_proj")), whose B is split into the linears' rows."""
    config = _read_config(path)
    weights = path / WEIGHTS
    if not weights.is_file():
        bin_file = path / "adapter_model.bin"
        why = (f"{bin_file.name} is a pickle, which llaisys does not load: save the adapter with "
               f"safe_serialization=True" if bin_file.exists() else "it is missing")
        raise ModelLoadError(f"adapter {name!r}: cannot read {weights}: {why}")
    file = SafetensorsFile(weights, mapped=False)
    found: dict[tuple[int, str], dict[str, np.ndarray]] = {}
    for tensor, info in file.infos.items():
        match = _TENSOR.fullmatch(tensor)
        if match is None:
            raise ModelLoadError(f"adapter {name!r}: tensor {shown(tensor)} is not a LoRA pair of a decoder layer's "
                                 f"linear (llaisys adapts {', '.join(TARGETS)})")
        layer, module, half = int(match[1]), match[2], match[3]
        if info.dtype is None or info.dtype_name not in ("F32", "F16", "BF16"):
            raise ModelLoadError(f"adapter {name!r}: tensor {tensor} is {info.dtype_name}, not a float type")
        found.setdefault((layer, module), {})[half] = file.array(info).astype(np.float32)
    if not found:
        raise ModelLoadError(f"adapter {name!r}: {weights} holds no LoRA tensors")
    alpha_of, rank_of = _patterns(config)
    pairs: dict[tuple[int, str], LoRAPair] = {}
    layers = 1 + max(layer for layer, _ in shapes)
    for (layer, module), halves in sorted(found.items()):
        where = f"adapter {name!r}, model.layers.{layer}.{module}"
        if set(halves) != {"A", "B"}:
            raise ModelLoadError(f"{where}: lora_A or lora_B is missing")
        if layer >= layers:
            raise ModelLoadError(f"{where}: the base model has {layers} layers: an adapter for another model")
        fields = _fields(module, fused)
        if fields is None or any((layer, f) not in shapes for f in fields):
            raise ModelLoadError(f"{where}: the base model has no such linear (llaisys adapts "
                                 f"{', '.join(TARGETS)})")
        a, b = halves["A"], halves["B"]
        full = f"model.layers.{layer}.{module}"
        r, alpha = rank_of(full), alpha_of(full)
        if a.shape[0] != r:
            raise ModelLoadError(f"{where}: lora_A has rank {a.shape[0]} but adapter_config.json says r = {r}")
        scale = alpha / math.sqrt(r) if config.get("use_rslora") else alpha / r
        rows = [shapes[layer, f][0] for f in fields]
        check_pair(where, a, b, (sum(rows), shapes[layer, fields[0]][1]))
        for field, b_rows in zip(fields, np.split(b, np.cumsum(rows)[:-1])):
            pairs[layer, field] = LoRAPair(a, np.ascontiguousarray(b_rows), scale)
    return LoRAAdapter(name, path, pairs)


def _read_config(path: Path) -> dict:
    config = parse_json((path / CONFIG).read_bytes(), str(path / CONFIG))
    if not isinstance(config, dict):
        raise ModelLoadError(f"{path / CONFIG} is not a JSON object")
    kind = config.get("peft_type", "LORA")
    if kind != "LORA":
        raise ModelLoadError(f"{path} is a {shown(kind)} adapter; llaisys applies LoRA adapters only")
    for field, why in _REFUSED.items():
        if config.get(field):
            raise ModelLoadError(f"{path}: {why} (adapter_config.json sets {field})")
    if config.get("bias", "none") != "none":
        raise ModelLoadError(f"{path}: the adapter trains biases (bias = {shown(config['bias'])}); llaisys applies "
                             f"LoRA pairs only")
    for field in ("r", "lora_alpha"):
        value = config.get(field)
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
            raise ModelLoadError(f"{path / CONFIG}: {field} must be a positive number, got {shown(value)}")
    return config


def _patterns(config: dict) -> tuple[Callable[[str], float], Callable[[str], int]]:
    """alpha and r of a module (its name inside the base model), as PEFT reads rank_pattern / alpha_pattern."""
    def of(patterns: object, default: float, field: str) -> Callable[[str], float]:
        if patterns is None:
            patterns = {}
        if not isinstance(patterns, dict):
            raise ModelLoadError(f"{CONFIG}: {field} must be an object, got {shown(patterns)}")

        def lookup(module: str) -> float:
            for key, value in patterns.items():
                if re.match(rf"(.*\.)?({key})$", module):
                    return value
            return default
        return lookup

    alpha = of(config.get("alpha_pattern"), config["lora_alpha"], "alpha_pattern")
    rank = of(config.get("rank_pattern"), config["r"], "rank_pattern")
    return alpha, lambda module: int(rank(module))


def _fields(module: str, fused: Mapping[str, tuple[str, ...]]) -> tuple[str, ...] | None:
    """The LayerWeights fields a module's output rows make, in order (None: a module llaisys does not adapt)."""
    for field, hf in TARGETS.items():
        if module == hf:
            return (field,)
    return fused.get(module + ".weight")
