"""PEFT LoRA adapters written as llama.cpp's ``convert_lora_to_gguf.py`` writes them, with the ``gguf`` package only
(the CI has no llama.cpp tree).

``write_gguf_adapter(peft_dir, path, arch)`` reads ``adapter_config.json`` and ``adapter_model.safetensors`` and
writes, as the converter does:
- metadata, in the converter's order: general.architecture ``arch``, general.type "adapter", adapter.type "lora",
  general.name (the converter derives its own from the directory names), adapter.lora.alpha (float32: lora_alpha;
  the converter ignores rank_pattern, alpha_pattern and use_rslora), general.quantization_version (the model
  card keys it adds from README.md, general.base_model.* and general.tags, are left out: nothing reads them);
- per adapted linear, ``{llama.cpp name of the base weight}.lora_a`` [r, K] and ``.lora_b`` [N, r] (numpy order),
  named by gguf-py's tensor map of ``arch`` (helpers.gguf_files.gguf_name: Phi-3's fused qkv_proj and
  gate_up_proj stay fused, as attn_qkv and ffn_up), lora_b of Q and K in llama.cpp's permuted row order for
  the "llama" architecture (LlamaModel.permute, with the base's head counts: config.json of ``base_dir``, by
  default the adapter's base_model_name_or_path);
- ``qtype`` F32, F16, BF16 or Q8_0 (the converter's --outtype), a matrix that cannot be Q8_0 (a row of fewer
  than 32 values: lora_b of rank < 32) in F16, as the converter falls back.

Checked once against the real converter (llama.cpp's convert_lora_to_gguf.py, gguf-py 0.19.0) on the tiny Llama,
Qwen2 and Phi-3 adapters, --outtype f32, f16, bf16 and q8_0: the same metadata keys, types, values and order
but for general.name and the model card keys above, the same tensor names, order, types and shapes, and
bit-identical tensor data.

For the error tests: ``metadata`` replaces keys (None: leaves one out), ``skip`` leaves tensors out, ``tensors``
replaces or adds tensors (written as F32).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path

import gguf
import numpy as np
from gguf import GGMLQuantizationType as Q
from safetensors.numpy import load_file

from helpers.gguf_files import gguf_name, llama_permute

PREFIX = "base_model.model."


def write_gguf_adapter(peft_dir: Path, path: Path, arch: str, qtype: Q = Q.F32, *, base_dir: Path | None = None,
                       metadata: Mapping[str, object] | None = None, skip: tuple[str, ...] = (),
                       tensors: Mapping[str, np.ndarray] | None = None) -> Path:
    """The PEFT adapter in ``peft_dir`` as a llama.cpp GGUF adapter of architecture ``arch`` at ``path``."""
    peft_dir = Path(peft_dir)
    lparams = json.loads((peft_dir / "adapter_config.json").read_text())
    base_dir = Path(base_dir or lparams["base_model_name_or_path"])
    hparams = json.loads((base_dir / "config.json").read_text())
    pairs: dict[str, dict[str, np.ndarray]] = {}
    for name, w in sorted(load_file(peft_dir / "adapter_model.safetensors").items()):
        half = "a" if name.endswith(".lora_A.weight") else "b"
        hf = name.removeprefix(PREFIX).replace(f".lora_{half.upper()}.weight", ".weight")
        pairs.setdefault(hf, {})[half] = w
    out: dict[str, tuple[np.ndarray, Q]] = {}
    for hf, halves in pairs.items():
        a, b = halves["a"], halves["b"]
        if a.dtype != b.dtype or a.dtype not in (np.float16, np.float32):  # (LoraTorchTensor, prepare_tensors)
            a, b = a.astype(np.float32), b.astype(np.float32)
        name = gguf_name(hf, arch)
        if arch == "llama" and ".attn_q." in name:
            b = llama_permute(b, hparams["num_attention_heads"])
        elif arch == "llama" and ".attn_k." in name:
            b = llama_permute(b, hparams["num_key_value_heads"])
        for half, w in (("a", a), ("b", b)):
            out[f"{name}.lora_{half}"] = _quantize(w, qtype)
    for name in skip:
        del out[name]
    for name, w in (tensors or {}).items():
        out[name] = (w.astype(np.float32), Q.F32)

    keys: dict[str, object] = {
        gguf.Keys.General.TYPE: gguf.GGUFType.ADAPTER, gguf.Keys.Adapter.TYPE: "lora",
        gguf.Keys.General.NAME: f"{base_dir.name} {peft_dir.name}",
        gguf.Keys.Adapter.LORA_ALPHA: float(lparams["lora_alpha"]),
        gguf.Keys.General.QUANTIZATION_VERSION: gguf.GGML_QUANT_VERSION,
    }
    keys.update(metadata or {})
    writer = gguf.GGUFWriter(path, arch)
    for key, value in keys.items():
        if value is None:
            continue
        if isinstance(value, str):
            writer.add_string(key, value)
        elif isinstance(value, float):
            writer.add_float32(key, value)
        elif isinstance(value, int) and not isinstance(value, bool):
            writer.add_uint32(key, value)
        else:
            writer.add_key_value(key, value, gguf.GGUFValueType.get_type(value),
                                 sub_type=gguf.GGUFValueType.UINT32 if isinstance(value, list) else None)
    for name, (data, tensor_type) in out.items():
        writer.add_tensor(name, data, raw_dtype=tensor_type)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def _quantize(w: np.ndarray, qtype: Q) -> tuple[np.ndarray, Q]:
    """``w`` stored as ``qtype`` as the converter stores it (Q8_0 where the rows are whole blocks, else F16)."""
    try:
        return gguf.quants.quantize(w, qtype), qtype
    except gguf.QuantError:
        return gguf.quants.quantize(w, Q.F16), Q.F16
