"""GPTQ and AWQ checkpoints made here from tiny float ones, and an unpacker of them independent of llaisys'.

The packers quantize each linear by plain round-to-nearest per group (not GPTQ's or AWQ's algorithm: what the
tests need is their output format) and write the tensors as AutoGPTQ / GPTQModel and AutoAWQ publish them:

- GPTQ: qweight int32 [K * bits / 32, N] (codes packed along K, lowest bits first), qzeros int32 [G, N * bits /
  32] (packed along N), scales float16 [G, N], g_idx int32 [K]; v1 (checkpoint_format "gptq") stores each zero
  minus one, v2 ("gptq_v2") as it is; desc_act: g_idx a random assignment of the columns to groups.
- AWQ GEMM: qweight int32 [K, N / 8] packed along N, nibble i of a word holding output 8c + [0, 2, 4, 6, 1, 3, 5,
  7][i]; qzeros int32 [G, N / 8] likewise; scales float16 [G, N].

The unpackers ``dequant_gptq`` and ``dequant_awq`` are written from llama.cpp's convert_hf_to_gguf.py
``dequant_gptq`` (shift by range(0, 32, bits), mask, + 1 for the v1 format, scales[g_idx] * (weight -
zeros[g_idx]), transposed) and AutoAWQ's ``unpack_awq`` / ``reverse_awq_order`` (AWQ_REVERSE_ORDER = [0, 4, 1, 5,
2, 6, 3, 7]) / ``dequantize_gemm``, one value at a time where that is clearer, and never call llaisys' loader:
the tests check the packers against them, then llaisys' loader against both.
"""

from __future__ import annotations

import dataclasses
import json
import shutil
from pathlib import Path

import numpy as np

AWQ_ORDER = [0, 2, 4, 6, 1, 3, 5, 7]
AWQ_REVERSE_ORDER = [0, 4, 1, 5, 2, 6, 3, 7]
# the linears a Llama-style layer has (HF module names after "model.layers.{i}.")
LINEARS = ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj", "mlp.gate_proj",
           "mlp.up_proj", "mlp.down_proj", "self_attn.qkv_proj", "mlp.gate_up_proj")


@dataclasses.dataclass(frozen=True)
class Quant:
    """How a checkpoint is quantized and written."""

    method: str = "gptq"  # or "awq"
    bits: int = 4
    group_size: int = 32  # -1: one group per row
    sym: bool = False
    v1: bool = True  # GPTQ checkpoint_format "gptq" (zeros minus one) or "gptq_v2"
    desc_act: bool = False  # GPTQ: a random g_idx
    lm_head: bool = False  # GPTQ: quantize the lm_head too
    dynamic: dict | None = None  # GPTQ: the config's dynamic (applied by the packer as GPTQModel would)
    not_converted: tuple[str, ...] = ()  # AWQ modules_to_not_convert
    config_file: bool = False  # write quantize_config.json (GPTQ) / quant_config.json (AWQ) instead of config.json's
    seed: int = 0

    @property
    def name(self) -> str:
        form = "" if self.method == "awq" else "-v1" if self.v1 else "-v2"
        return (f"{self.method}{self.bits}-g{self.group_size}{form}{'-sym' if self.sym else ''}"
                f"{'-act' if self.desc_act else ''}")

    def config(self) -> dict:
        if self.method == "awq":
            if self.config_file:  # AutoAWQ's own file
                return {"w_bit": self.bits, "q_group_size": self.group_size, "zero_point": True, "version": "GEMM"}
            return {"quant_method": "awq", "bits": self.bits, "group_size": self.group_size, "zero_point": True,
                    "version": "gemm", "modules_to_not_convert": list(self.not_converted) or None}
        config = {"bits": self.bits, "group_size": self.group_size, "desc_act": self.desc_act, "sym": self.sym,
                  "damp_percent": 0.01, "true_sequential": True, "lm_head": self.lm_head,
                  "checkpoint_format": "gptq" if self.v1 else "gptq_v2", "quant_method": "gptq"}
        if self.dynamic is not None:
            config["dynamic"] = self.dynamic
        return config

    def module(self, name: str) -> Quant | None:
        """How module ``name`` is quantized (None: kept in float), read as GPTQModel / vLLM / transformers do."""
        import re

        if self.method == "awq":
            return None if name == "lm_head" or any(k in name for k in self.not_converted) else self
        if name == "lm_head" and not self.lm_head:
            return None
        for key, override in (self.dynamic or {}).items():
            if re.match(key.removeprefix("-:").removeprefix("+:"), name):
                return None if key.startswith("-:") else dataclasses.replace(
                    self, **{k: v for k, v in override.items() if k in ("bits", "group_size", "desc_act", "sym")})
        return self


# -- quantizing ---------------------------------------------------------------------------------------------


def rtn(w: np.ndarray, q: Quant, g_idx: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Round-to-nearest of w [N, K] per row and group (the columns g_idx puts in it): (codes uint8 [N, K], zeros
    int64 [N, G], scales float16 [N, G]), zeros in [1, 2^bits - 1] for the v1 format (which stores zero - 1)."""
    maxq = 2 ** q.bits - 1
    n, k = w.shape
    groups = int(g_idx.max()) + 1
    codes = np.zeros((n, k), np.uint8)
    zeros = np.zeros((n, groups), np.int64)
    scales = np.zeros((n, groups), np.float16)
    for g in range(groups):
        cols = np.nonzero(g_idx == g)[0]
        x = w[:, cols].astype(np.float64)
        lo, hi = np.minimum(x.min(1), 0), np.maximum(x.max(1), 0)
        if q.sym:
            hi = np.maximum(-lo, hi)
            lo = -hi
        scale = np.where(hi > lo, (hi - lo) / maxq, 1.0).astype(np.float16)
        scale = np.where(scale == 0, np.float16(1e-3), scale)
        s = scale.astype(np.float64)
        zero = np.full(n, (maxq + 1) // 2) if q.sym else np.rint(-lo / s)
        zero = np.clip(zero, 1 if q.method == "gptq" and q.v1 else 0, maxq).astype(np.int64)
        codes[:, cols] = np.clip(np.rint(x / s[:, None]) + zero[:, None], 0, maxq).astype(np.uint8)
        zeros[:, g], scales[:, g] = zero, scale
    return codes, zeros, scales


def group_index(k: int, q: Quant, rng: np.random.Generator) -> np.ndarray:
    """g_idx [K]: k // group_size, or (desc_act) the groups of a random column order."""
    gs = k if q.group_size == -1 else q.group_size
    if not q.desc_act:
        return (np.arange(k) // gs).astype(np.int32)
    order = rng.permutation(k)  # the act-order: column order[j] is the j-th quantized
    g_idx = np.empty(k, np.int32)
    g_idx[order] = np.arange(k) // gs
    return g_idx


# -- packing -----------------------------------------------------------------------------------------------


def _pack(values: np.ndarray, bits: int, axis: int) -> np.ndarray:
    """Pack the integers ``values`` (2-D) 32/bits to an int32 word along ``axis``, the first lowest."""
    per = 32 // bits
    v = np.moveaxis(values.astype(np.uint32), axis, 0)
    words = np.zeros((v.shape[0] // per, *v.shape[1:]), np.uint32)
    for j in range(per):
        words |= v[j::per] << np.uint32(bits * j)
    return np.ascontiguousarray(np.moveaxis(words, 0, axis)).view(np.int32)


def pack_gptq(codes: np.ndarray, zeros: np.ndarray, scales: np.ndarray, g_idx: np.ndarray, bits: int,
              v1: bool) -> dict[str, np.ndarray]:
    """A GPTQ linear's tensors from codes [N, K], zeros [N, G] (the true zero points) and scales [N, G]."""
    stored = zeros - 1 if v1 else zeros
    assert stored.min() >= 0 and stored.max() < 2 ** bits, "a zero the format cannot store"
    return {"qweight": _pack(codes.T, bits, 0), "qzeros": _pack(stored.T, bits, 1),
            "scales": np.ascontiguousarray(scales.T), "g_idx": g_idx.astype(np.int32)}


def pack_awq(codes: np.ndarray, zeros: np.ndarray, scales: np.ndarray) -> dict[str, np.ndarray]:
    """An AWQ GEMM linear's tensors (4 bits) from codes [N, K], zeros [N, G] and scales [N, G]."""

    def pack(values: np.ndarray) -> np.ndarray:  # [R, N] -> [R, N / 8], as WQLinear_GEMM.from_linear
        r, n = values.shape
        words = np.zeros((r, n // 8), np.uint32)
        for col in range(n // 8):
            for i in range(8):
                words[:, col] |= values[:, col * 8 + AWQ_ORDER[i]].astype(np.uint32) << np.uint32(i * 4)
        return words.view(np.int32)

    return {"qweight": pack(codes.T), "qzeros": pack(zeros.T), "scales": np.ascontiguousarray(scales.T)}


# -- the independent unpackers --------------------------------------------------------------------------------


def dequant_gptq(qweight: np.ndarray, qzeros: np.ndarray, scales: np.ndarray, g_idx: np.ndarray, bits: int,
                 v1: bool) -> np.ndarray:
    """The float64 weight [N, K], as llama.cpp's dequant_gptq computes it."""
    maxq = 2 ** bits - 1
    shifts = np.arange(0, 32, bits, dtype=np.uint32)
    zw = qzeros.view(np.uint32)
    zeros = ((zw[:, :, None] >> shifts[None, None, :]) & maxq).reshape(scales.shape).astype(np.int64)
    ww = qweight.view(np.uint32)
    weight = ((ww[:, None, :] >> shifts[None, :, None]) & maxq).reshape(-1, ww.shape[1]).astype(np.int64)  # [K, N]
    if v1:
        zeros += 1
    return (scales[g_idx].astype(np.float64) * (weight - zeros[g_idx])).T


def dequant_awq(qweight: np.ndarray, qzeros: np.ndarray, scales: np.ndarray, group_size: int) -> np.ndarray:
    """The float64 weight [N, K], as AutoAWQ's dequantize_gemm computes it."""
    shifts = np.arange(0, 32, 4, dtype=np.uint32)

    def unpack(words: np.ndarray) -> np.ndarray:
        values = (words.view(np.uint32)[:, :, None] >> shifts[None, None, :]).reshape(words.shape[0], -1) & 15
        order = np.arange(values.shape[1]).reshape(-1, 8)[:, AWQ_REVERSE_ORDER].reshape(-1)
        return values[:, order].astype(np.int64)

    weight, zeros = unpack(qweight), unpack(qzeros)  # [K, N], [G, N]
    gs = weight.shape[0] if group_size == -1 else group_size
    z = np.repeat(zeros, gs, axis=0)
    s = np.repeat(scales.astype(np.float64), gs, axis=0)
    return ((weight - z) * s).T


def dequant(tensors: dict[str, np.ndarray], q: Quant) -> np.ndarray:
    """float64 [N, K] of one linear's tensors, by the independent unpacker of its format."""
    if q.method == "awq":
        return dequant_awq(tensors["qweight"], tensors["qzeros"], tensors["scales"], q.group_size)
    return dequant_gptq(tensors["qweight"], tensors["qzeros"], tensors["scales"], tensors["g_idx"], q.bits, q.v1)


# -- checkpoints ------------------------------------------------------------------------------------------------


def quantized_module(name: str) -> str | None:
    """The module of a float checkpoint's linear weight, or None for any other tensor."""
    module = name.removesuffix(".weight")
    if name == "lm_head.weight" or (name.endswith(".weight") and module.split(".", 3)[-1] in LINEARS):
        return module
    return None


def write_checkpoints(float_dir: Path, out: Path, reference: Path, q: Quant, dtype=np.float32) -> None:
    """``out``: the float checkpoint ``float_dir`` with its linears quantized as ``q`` says (its other tensors in
    ``dtype``, its scales float16); ``reference``: the same model with each quantized linear's weight replaced by
    its float32 dequantization (``dequant``), for HF transformers to load."""
    from safetensors.numpy import load_file, save_file

    rng = np.random.default_rng(q.seed)
    files = sorted(float_dir.glob("*.safetensors"))
    assert len(files) == 1, "one safetensors file"
    tensors = load_file(files[0])
    packed, floats = {}, {}
    for name, w in tensors.items():
        module = quantized_module(name)
        how = q.module(module) if module is not None else None
        if how is None:
            packed[name] = w.astype(dtype)
            floats[name] = w.astype(np.float32)
            continue
        g_idx = group_index(w.shape[1], how, rng)
        codes, zeros, scales = rtn(w.astype(np.float64), how, g_idx)
        parts = pack_awq(codes, zeros, scales) if how.method == "awq" else pack_gptq(codes, zeros, scales, g_idx,
                                                                                       how.bits, how.v1)
        packed.update({f"{module}.{field}": t for field, t in parts.items()})
        floats[name] = np.ascontiguousarray(dequant(parts, how), np.float32)
    for directory, state in ((out, packed), (reference, floats)):
        directory.mkdir(parents=True, exist_ok=True)
        for f in float_dir.iterdir():
            if f.is_file() and f.suffix != ".safetensors":
                shutil.copy(f, directory / f.name)
        save_file(state, str(directory / "model.safetensors"), metadata={"format": "pt"})
    raw = json.loads((out / "config.json").read_text())
    if q.config_file:
        (out / ("quant_config.json" if q.method == "awq" else "quantize_config.json")).write_text(
            json.dumps(q.config(), indent=2))
    else:
        raw["quantization_config"] = q.config()
    raw["torch_dtype"] = raw["dtype"] = np.dtype(dtype).name
    (out / "config.json").write_text(json.dumps(raw, indent=2))


def random_gptq_checkpoint(directory: Path, *, hidden: int, inter: int, layers: int, heads: int, kv_heads: int,
                           vocab: int, bits: int = 4, group_size: int = 128, seed: int = 0) -> int:
    """A Qwen2 GPTQ (v1, symmetric) checkpoint of random codes and scales in ``directory`` (float16 embeddings,
    norms and biases; tied embeddings), for measuring loads of a real model's size; returns its weights' bytes."""
    from safetensors.numpy import save_file

    rng = np.random.default_rng(seed)
    head_dim = hidden // heads
    per = 32 // bits
    shapes = {"self_attn.q_proj": (hidden, hidden), "self_attn.k_proj": (kv_heads * head_dim, hidden),
              "self_attn.v_proj": (kv_heads * head_dim, hidden), "self_attn.o_proj": (hidden, hidden),
              "mlp.gate_proj": (inter, hidden), "mlp.up_proj": (inter, hidden), "mlp.down_proj": (hidden, inter)}
    zero_word = sum(((1 << (bits - 1)) - 1) << (bits * j) for j in range(per))  # every stored zero 2^(bits-1) - 1
    tensors: dict[str, np.ndarray] = {
        "model.embed_tokens.weight": (rng.standard_normal((vocab, hidden), np.float32) * 0.02).astype(np.float16),
        "model.norm.weight": np.ones(hidden, np.float16)}
    for i in range(layers):
        p = f"model.layers.{i}."
        tensors[p + "input_layernorm.weight"] = np.ones(hidden, np.float16)
        tensors[p + "post_attention_layernorm.weight"] = np.ones(hidden, np.float16)
        for b in ("q_proj", "k_proj", "v_proj"):
            tensors[p + f"self_attn.{b}.bias"] = np.zeros(shapes[f"self_attn.{b}"][0], np.float16)
        for module, (n, k) in shapes.items():
            g = k // group_size
            tensors[p + module + ".qweight"] = rng.integers(-2 ** 31, 2 ** 31, (k // per, n), dtype=np.int32)
            tensors[p + module + ".qzeros"] = np.full((g, n // per), np.uint32(zero_word).view(np.int32), np.int32)
            tensors[p + module + ".scales"] = rng.uniform(1e-3, 1e-2, (g, n)).astype(np.float16)
            tensors[p + module + ".g_idx"] = (np.arange(k) // group_size).astype(np.int32)
    directory.mkdir(parents=True, exist_ok=True)
    save_file(tensors, str(directory / "model.safetensors"), metadata={"format": "pt"})
    config = {"architectures": ["Qwen2ForCausalLM"], "model_type": "qwen2", "hidden_size": hidden,
              "intermediate_size": inter, "num_hidden_layers": layers, "num_attention_heads": heads,
              "num_key_value_heads": kv_heads, "vocab_size": vocab, "max_position_embeddings": 4096,
              "rms_norm_eps": 1e-6, "rope_theta": 1e6, "tie_word_embeddings": True, "eos_token_id": 0,
              "hidden_act": "silu", "torch_dtype": "float16",
              "quantization_config": {"quant_method": "gptq", "bits": bits, "group_size": group_size,
                                      "desc_act": False, "sym": True, "checkpoint_format": "gptq"}}
    (directory / "config.json").write_text(json.dumps(config, indent=2))
    return sum(t.nbytes for t in tensors.values())
