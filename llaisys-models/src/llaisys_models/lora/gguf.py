"""Reading a llama.cpp LoRA adapter: one GGUF file, as llama.cpp's ``convert_lora_to_gguf.py`` writes it from a
PEFT adapter (and ``llama_adapter_lora_init`` in src/llama-adapter.cpp reads it).

Metadata: ``general.type`` "adapter", ``adapter.type`` "lora", ``adapter.lora.alpha`` (float32; absent or 0:
scale 1, as llama.cpp reads it), ``general.architecture`` that of the base model's GGUF files. Tensors: for
each adapted linear of a layer, ``blk.{i}.{name}.lora_a`` [r, K] and ``blk.{i}.{name}.lora_b`` [N, r] (numpy
order; ggml's ne are the other way round), ``{name}`` the base weight's llama.cpp name ("attn_q.weight"),
stored as F32, F16, BF16 or Q8_0 (the converter's --outtype; its Q8_0 files keep a lora_b of fewer than 32
columns in F16), decoded as the base loader decodes them. The scale of each pair is alpha / r, r its own rank
(llama.cpp's: no rsLoRA, no rank or alpha patterns: the converter drops them).

The converter writes the pairs as it writes the base weights: a fused weight's B holds the fused linears' rows
(Phi-3's ``attn_qkv``: split here as the family's GGUF rules split the base), and for the Llama architecture
(the rules' ``permuted_qk``) the rows of Q's and K's B in ggml's rope order, put back in HF's here with the base
loader's own row order (loading/gguf/weights.py). What llaisys cannot apply beside the base weights is refused
with its reason: adapters of the token embedding or the output, of experts, of norms (mergekit-extract-lora's
replaced norms, which llama.cpp skips), and activated LoRA (aLoRA).
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from ..errors import ModelLoadError, shown
from ..families.config import ModelConfig
from ..families.family import GGUF
from ..loading.files import is_gguf
from .adapter import TARGETS, LoRAAdapter, LoRAPair, check_pair

if TYPE_CHECKING:
    from ..loading.gguf.reader import GGUFFile

_TENSOR = re.compile(r"blk\.(\d{1,9})\.(.+\.weight)\.lora_([ab])")
# what llama.cpp names the weights outside the layers that a converted adapter may hold pairs of
_TOP = {"token_embd.weight": "the token embedding", "output.weight": "the output (lm_head)"}
TYPES = ("F32", "F16", "BF16", "Q8_0")  # what the converter writes (--outtype)


def is_gguf_file(path: Path) -> bool:
    """Whether ``path`` is a GGUF file (by its first four bytes, or its .gguf suffix: a corrupt one then gets the
    GGUF reader's error, not "neither a PEFT directory nor a GGUF file")."""
    return path.is_file() and is_gguf(path)


def read_gguf_adapter(name: str, path: Path, shapes: Mapping[tuple[int, str], tuple[int, int]], rules: GGUF,
                      config: ModelConfig) -> LoRAAdapter:
    """The adapter in the GGUF file ``path``, checked against the base model's linears: ``shapes`` gives the
    [N, K] of each (layer, linear) the base has; ``rules`` how llama.cpp writes the base's family (its names,
    fused tensors, permuted Q/K rows), ``config`` the base's configuration (its architecture, head counts)."""
    from ..loading.gguf import quants  # (the gguf package: only a GGUF adapter pays for it)
    from ..loading.gguf.reader import GGUFFile
    from ..loading.gguf.weights import PERMUTED, llama_row_order

    try:
        f = GGUFFile(path)
    except ModelLoadError as e:
        raise ModelLoadError(f"adapter {name!r}: {e}") from None
    _check_metadata(name, f, config)
    alpha = _alpha(name, f)
    # the base weight's llama.cpp name (after "blk.{i}.") -> the linears its rows hold (the fused names last: Phi-3's
    # "ffn_up.weight" holds gate and up)
    fields_of: dict[str, tuple[str, ...]] = {tensor: (field,) for field, tensor in rules.tensors.items()
                                             if field in TARGETS}
    fields_of.update(rules.fused)
    heads = {"q": config.num_attention_heads, "kv": config.num_key_value_heads}

    found: dict[tuple[int, str], dict[str, str]] = {}
    for tensor, info in f.tensors.items():
        match = _TENSOR.fullmatch(tensor)
        if match is None:
            raise ModelLoadError(f"adapter {name!r}: {path}: tensor {shown(tensor)} {_not_a_pair(tensor)}")
        layer, module, half = int(match[1]), match[2], match[3]
        where = f"adapter {name!r}, blk.{layer}.{module}"
        if layer >= config.num_hidden_layers:
            raise ModelLoadError(f"{where}: the base model has {config.num_hidden_layers} layers: an adapter for "
                                 f"another model")
        fields = fields_of.get(module)
        if fields is None or any((layer, field) not in shapes for field in fields):
            raise ModelLoadError(f"{where}: the base model has no such linear (llaisys adapts "
                                 f"{', '.join(TARGETS)}, as llama.cpp names them)")
        if info.type not in quants.SUPPORTED:
            raise ModelLoadError(f"{where}: lora_{half} is stored as {info.type.name}, which llaisys cannot "
                                 f"decode (llama.cpp's converter writes {', '.join(TYPES)})")
        if len(info.shape) != 2:
            raise ModelLoadError(f"{where}: lora_{half} has shape {info.shape}, not a matrix")
        found.setdefault((layer, module), {})[half] = tensor
    if not found:
        raise ModelLoadError(f"adapter {name!r}: {path} holds no LoRA tensors")

    def decoded(tensor: str) -> np.ndarray:
        info = f.tensors[tensor]
        return quants.dequantize(f.raw(tensor), info.type, np.empty(info.shape, np.float32))

    pairs: dict[tuple[int, str], LoRAPair] = {}
    for (layer, module), halves in sorted(found.items()):
        where = f"adapter {name!r}, blk.{layer}.{module}"
        missing = [f"lora_{half}" for half in "ab" if half not in halves]
        if missing:
            raise ModelLoadError(f"{where}: {missing[0]} is missing (the file holds only "
                                 f"{'lora_a' if 'a' in halves else 'lora_b'})")
        fields = fields_of[module]
        rows = [shapes[layer, field][0] for field in fields]
        a, b = decoded(halves["a"]), decoded(halves["b"])
        check_pair(where, a, b, (sum(rows), shapes[layer, fields[0]][1]))
        scale = alpha / b.shape[1] if alpha else 1.0  # llama.cpp: alpha / rank, or 1 where alpha is 0
        for field, b_rows in zip(fields, np.split(b, np.cumsum(rows)[:-1])):
            if rules.permuted_qk and field in PERMUTED:  # the converter's Llama Q/K order, back to HF's
                b_rows = b_rows[llama_row_order(b_rows.shape[0], heads[PERMUTED[field]])]
            pairs[layer, field] = LoRAPair(a, np.ascontiguousarray(b_rows), scale)
    return LoRAAdapter(name, path, pairs)


def _check_metadata(name: str, f: GGUFFile, config: ModelConfig) -> None:
    """An adapter (general.type), of LoRA (adapter.type), for the base model's architecture (general.architecture
    against the names llama.cpp writes the base's family as: families/registry.py), not an aLoRA."""
    from ..families.registry import ROWS

    meta, where = f.metadata, f"adapter {name!r}: {f.path}"
    kind = meta.get("general.type")
    if kind != "adapter":
        found = f"general.type is {shown(kind)}, not 'adapter'" if kind is not None else "it has no general.type"
        model = ": it holds a model's weights (token_embd.weight), to load as a model" \
            if "token_embd.weight" in f.tensors else ""
        raise ModelLoadError(f"{where} is not a llama.cpp adapter ({found}){model}")
    kind = meta.get("adapter.type")
    if kind != "lora":
        found = f"adapter.type is {shown(kind)}" if kind is not None else "it has no adapter.type"
        raise ModelLoadError(f"{where}: {found}; llaisys applies LoRA adapters only")
    names = sorted({row.gguf for row in ROWS if row.architecture == config.architecture and row.gguf is not None})
    arch = meta.get("general.architecture")
    if arch not in names:
        base = " or ".join(repr(n) for n in names) or "none"
        raise ModelLoadError(f"{where}: an adapter for GGUF architecture {shown(arch)}, but the base model "
                             f"({config.architecture}) is {base}: an adapter for another model")
    if "adapter.alora.invocation_tokens" in meta:
        raise ModelLoadError(f"{where}: an activated LoRA (adapter.alora.invocation_tokens) applies only after its "
                             f"invocation tokens, which llaisys does not do")


def _alpha(name: str, f: GGUFFile) -> float:
    """adapter.lora.alpha: a finite number >= 0 (absent: 0, as llama.cpp reads it; 0 means scale 1)."""
    alpha = f.metadata.get("adapter.lora.alpha", 0.0)
    if isinstance(alpha, bool) or not isinstance(alpha, (int, float)) or not math.isfinite(alpha) or alpha < 0:
        raise ModelLoadError(f"adapter {name!r}: {f.path}: adapter.lora.alpha must be a finite number >= 0, got "
                             f"{shown(alpha)}")
    return float(alpha)


def _not_a_pair(tensor: str) -> str:
    """Why a tensor that is not a layer's lora_a / lora_b is refused."""
    for suffix in (".lora_a", ".lora_b"):
        if tensor.endswith(suffix) and tensor[:-len(suffix)] in _TOP:
            return (f"adapts {_TOP[tensor[:-len(suffix)]]}, which llaisys does not adapt (llaisys adapts "
                    f"{', '.join(TARGETS)})")
    if tensor.endswith("norm.weight"):
        return "replaces a norm (mergekit-extract-lora writes them; llama.cpp skips them): not a LoRA pair"
    return f"is not a LoRA pair of a decoder layer's linear (llaisys adapts {', '.join(TARGETS)})"
