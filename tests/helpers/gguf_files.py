"""GGUF files written from the tiny random HF checkpoints, the way llama.cpp's converter writes them.

``write_gguf(hf_model, tokenizer_dir, path, qtype)`` stores every matrix as ``qtype`` and the norms
and biases as F32 (as llama.cpp does), the hyper-parameters under llama.cpp's keys, the
tokenizer as ``tokenizer.ggml.*`` metadata, and for the Llama architecture the Q/K rows in
llama.cpp's permuted order. Sliding windows as the converters write them: Phi-3's and Gemma 3's
attention.sliding_window, none for Llama (Mistral) and Qwen2 files. Gemma 3 (convert_hf_to_gguf's
Gemma3Model): norms stored as 1 + w, the sliding layers' rope base as rope.freq_base_swa; its
converter writes no attention.sliding_window_pattern (llama.cpp then takes every 6th layer as global),
so this writer adds the key when the checkpoint's layer_types say otherwise (llama.cpp reads it).

Matrices are quantized by the ``gguf`` package's own quantizers where it has one (F16, BF16,
Q8_0, Q4_0, Q4_1, Q5_0, Q5_1). It has none for the k-quants, so those blocks are random bytes
with their f16 super-block scales set to give the weights the original tensor's spread: parity
only needs llaisys and HF to read the same bytes.
"""

from __future__ import annotations

import functools
import json
import struct
from pathlib import Path

import gguf
import numpy as np
from gguf import GGML_QUANT_SIZES, TokenType
from gguf import GGMLQuantizationType as Q

PLAIN = (Q.F32, Q.F16, Q.BF16, Q.Q8_0, Q.Q4_0, Q.Q4_1, Q.Q5_0, Q.Q5_1)
# k-quants: byte offsets of the f16 super-block scale d and (if any) dmin, and dmin / d for zero mean
K_SCALE_FIELDS = {Q.Q2_K: (80, 82, 1.5), Q.Q3_K: (108, None, 0), Q.Q4_K: (0, 2, 7.5), Q.Q5_K: (0, 2, 15.5),
                  Q.Q6_K: (208, None, 0)}

LAYER_TENSORS = {  # HF name after "model.layers.{i}." -> GGUF name after "blk.{i}."
    "input_layernorm.weight": "attn_norm.weight", "post_attention_layernorm.weight": "ffn_norm.weight",
    "self_attn.q_proj.weight": "attn_q.weight", "self_attn.k_proj.weight": "attn_k.weight",
    "self_attn.v_proj.weight": "attn_v.weight", "self_attn.o_proj.weight": "attn_output.weight",
    "self_attn.q_proj.bias": "attn_q.bias", "self_attn.k_proj.bias": "attn_k.bias",
    "self_attn.v_proj.bias": "attn_v.bias", "self_attn.o_proj.bias": "attn_output.bias",
    "mlp.gate_proj.weight": "ffn_gate.weight", "mlp.up_proj.weight": "ffn_up.weight",
    "mlp.down_proj.weight": "ffn_down.weight",
    "self_attn.q_norm.weight": "attn_q_norm.weight", "self_attn.k_norm.weight": "attn_k_norm.weight",  # Qwen3
    "self_attn.qkv_proj.weight": "attn_qkv.weight", "mlp.gate_up_proj.weight": "ffn_up.weight",  # Phi-3
}
GEMMA_LAYER_TENSORS = {"post_attention_layernorm.weight": "post_attention_norm.weight",
                       "pre_feedforward_layernorm.weight": "ffn_norm.weight",
                       "post_feedforward_layernorm.weight": "post_ffw_norm.weight"}
GGUF_ARCH = {"mistral": "llama", "gemma3_text": "gemma3"}  # (llama.cpp writes Mistral as the Llama architecture)


def gguf_name(hf_name: str, arch: str = "qwen2") -> str:
    """llama.cpp's name of an HF tensor: as its converter maps it (gguf-py's TensorNameMap of ``arch``), else by
    the table above (a dense layer of an architecture llama.cpp runs as all experts: qwen3moe)."""
    mapped = _name_map(arch).get_name(hf_name, try_suffixes=(".weight", ".bias")) if arch in _ARCHS else None
    if mapped is not None:
        return mapped
    if hf_name.startswith("model.layers."):
        i, rest = hf_name[len("model.layers."):].split(".", 1)
        names = {**LAYER_TENSORS, **GEMMA_LAYER_TENSORS} if arch == "gemma3" else LAYER_TENSORS
        return f"blk.{i}.{names[rest]}"
    return {"model.embed_tokens.weight": "token_embd.weight", "model.norm.weight": "output_norm.weight",
            "lm_head.weight": "output.weight"}[hf_name]


_ARCHS = {name: arch for arch, name in gguf.MODEL_ARCH_NAMES.items()}


@functools.cache
def _name_map(arch: str) -> gguf.TensorNameMap:
    return gguf.get_tensor_name_map(_ARCHS[arch], 1 << 10)


def llama_permute(w: np.ndarray, heads: int) -> np.ndarray:
    """llama.cpp's converter's Q/K reordering: within each head, rows (half, j) -> (j, half)."""
    return w.reshape(heads, 2, w.shape[0] // heads // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def random_k_blocks(w: np.ndarray, qtype: Q, rng: np.random.Generator) -> np.ndarray:
    """Random ``qtype`` blocks for a tensor shaped like ``w``, scaled to w's standard deviation."""
    block, type_size = GGML_QUANT_SIZES[qtype]
    d_at, dmin_at, dmin_ratio = K_SCALE_FIELDS[qtype]
    blocks = rng.integers(0, 256, size=(w.size // block, type_size), dtype=np.uint8)

    def set_scales(d: float) -> None:
        blocks[:, d_at:d_at + 2] = np.full((len(blocks), 1), d, np.float16).view(np.uint8)
        if dmin_at is not None:
            blocks[:, dmin_at:dmin_at + 2] = np.full((len(blocks), 1), d * dmin_ratio, np.float16).view(np.uint8)

    set_scales(1.0)
    spread = float(gguf.quants.dequantize(blocks, qtype).std())
    set_scales(float(w.std()) / spread)
    return blocks.reshape(*w.shape[:-1], w.shape[-1] // block * type_size)


def quantize(w: np.ndarray, qtype: Q, rng: np.random.Generator) -> np.ndarray:
    if qtype == Q.F32:
        return w.astype(np.float32)
    if qtype in PLAIN:
        return gguf.quants.quantize(w.astype(np.float32), qtype)
    if qtype in K_SCALE_FIELDS:
        return random_k_blocks(w, qtype, rng)
    block, type_size = GGML_QUANT_SIZES[qtype]  # a type llaisys does not decode: any bytes will do
    return rng.integers(0, 256, size=(*w.shape[:-1], w.shape[-1] // block * type_size), dtype=np.uint8)


def write_tokenizer_metadata(writer: gguf.GGUFWriter, tokenizer_dir: Path, vocab_size: int) -> None:
    """The byte-level test tokenizer (tiny_models.write_tokenizer) as tokenizer.ggml.* keys."""
    data = json.loads((tokenizer_dir / "tokenizer.json").read_text())
    config = json.loads((tokenizer_dir / "tokenizer_config.json").read_text())
    tokens = {i: t for t, i in data["model"]["vocab"].items()}
    types = {i: TokenType.NORMAL for i in tokens}
    for added in data["added_tokens"]:
        tokens[added["id"]] = added["content"]
        types[added["id"]] = TokenType.CONTROL if added["special"] else TokenType.USER_DEFINED
    eos = next(a["id"] for a in data["added_tokens"] if a["content"] == config["eos_token"])
    merges = [" ".join(m) if isinstance(m, list) else m for m in data["model"]["merges"]]
    if not merges:
        # The test tokenizer has none, but transformers' GGUF converter needs a byte-level vocabulary's
        # merges (llama.cpp always writes them): one merge of two NUL bytes, which no test text holds.
        merges, nul = ["Ā Ā"], len(tokens)
        tokens[nul], types[nul] = "ĀĀ", TokenType.NORMAL
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre("qwen2")
    # llama.cpp pads the list to the embedding's rows with unused [PADi] tokens
    writer.add_token_list([tokens.get(i, f"[PAD{i}]") for i in range(vocab_size)])
    writer.add_token_types([types.get(i, TokenType.UNUSED) for i in range(vocab_size)])
    writer.add_token_merges(merges)
    writer.add_eos_token_id(eos)
    writer.add_pad_token_id(eos)
    writer.add_add_bos_token(False)
    chat_template = config.get("chat_template") or _chat_template_file(tokenizer_dir)
    if chat_template:
        writer.add_chat_template(chat_template)


def _chat_template_file(tokenizer_dir: Path) -> str | None:
    path = tokenizer_dir / "chat_template.jinja"
    return path.read_text() if path.is_file() else None


def write_gguf(hf_model, tokenizer_dir: Path | None, path: Path, qtype: Q, seed: int = 0, *, tokenizer: bool = True,
               arch: str | None = None, extra: dict | None = None, types: dict[str, Q] | None = None,
               skip: tuple[str, ...] = ()) -> Path:
    """Write ``hf_model`` (a transformers Qwen2/Llama causal LM) as a GGUF file at ``path``.

    For the error tests: ``arch`` overrides general.architecture, ``extra`` adds metadata keys (see
    ``add_extra``), ``types`` sets the type of single tensors (by GGUF name), ``skip`` leaves tensors out.
    """
    c = hf_model.config
    model_arch = GGUF_ARCH.get(c.model_type, c.model_type)
    head_dim = getattr(c, "head_dim", None) or c.hidden_size // c.num_attention_heads
    writer = gguf.GGUFWriter(path, arch or model_arch)
    writer.add_name(f"tiny random {model_arch}")
    writer.add_context_length(c.max_position_embeddings)
    writer.add_embedding_length(c.hidden_size)
    writer.add_block_count(c.num_hidden_layers)
    writer.add_feed_forward_length(c.intermediate_size)
    writer.add_head_count(c.num_attention_heads)
    writer.add_head_count_kv(c.num_key_value_heads)
    writer.add_key_length(head_dim)
    writer.add_value_length(head_dim)
    writer.add_rope_dimension_count(head_dim)
    rope = c.rope_parameters.get("full_attention", c.rope_parameters)  # (Gemma 3: one per layer type)
    writer.add_rope_freq_base(float(rope["rope_theta"]))
    writer.add_layer_norm_rms_eps(c.rms_norm_eps)
    writer.add_vocab_size(c.vocab_size)
    writer.add_file_type(gguf.LlamaFileType.ALL_F32 if qtype == Q.F32 else gguf.LlamaFileType.GUESSED)
    if tokenizer:
        write_tokenizer_metadata(writer, tokenizer_dir, c.vocab_size)
    rope_freqs = write_rope_scaling(writer, rope, head_dim)
    write_sliding_window(writer, c, model_arch)
    add_extra(writer, extra)  # after the standard keys, so it can replace one

    rng = np.random.default_rng(seed)
    for hf_name, param in hf_model.state_dict().items():
        if hf_name == "lm_head.weight" and c.tie_word_embeddings:
            continue
        w = param.detach().float().numpy()
        name = gguf_name(hf_name, model_arch)
        if name in skip:
            continue
        if model_arch == "gemma3" and name.endswith("norm.weight"):
            w = w + np.float32(1)  # Gemma3Model.modify_tensors: Gemma3RMSNorm multiplies by 1 + w
        if model_arch == "llama" and ".attn_q." in name:
            w = llama_permute(w, c.num_attention_heads)
        elif model_arch == "llama" and ".attn_k." in name:
            w = llama_permute(w, c.num_key_value_heads)
        tensor_type = qtype if w.ndim == 2 else Q.F32  # norms and biases stay F32, as llama.cpp keeps them
        tensor_type = (types or {}).get(name, tensor_type)
        data = quantize(w, tensor_type, rng)
        writer.add_tensor(name, data, raw_shape=data.shape, raw_dtype=tensor_type)
    if rope_freqs is not None:
        writer.add_tensor("rope_freqs.weight", rope_freqs)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def write_sliding_window(writer: gguf.GGUFWriter, c, arch: str) -> None:
    """attention.sliding_window as Phi3MiniModel (0 for none) and Gemma3Model write it; and for Gemma 3 the
    pattern llama.cpp reads, where the layers are not its default (every 6th global)."""
    if arch == "phi3":
        writer.add_sliding_window(c.sliding_window or 0)
    if arch == "gemma3":
        writer.add_sliding_window(c.sliding_window)
        writer.add_rope_freq_base_swa(float(c.rope_parameters["sliding_attention"]["rope_theta"]))
        sliding = [t == "sliding_attention" for t in c.layer_types]
        if sliding != [i % 6 < 5 for i in range(len(sliding))]:
            writer.add_sliding_window_pattern(sliding)


def write_rope_scaling(writer: gguf.GGUFWriter, rope: dict, head_dim: int) -> np.ndarray | None:
    """The config's rope scaling (its rope_parameters) as llama.cpp's converter writes it: linear and YaRN as
    rope.scaling.* keys, llama3 as the tensor rope_freqs.weight (returned) of per-frequency divisors
    (convert_hf_to_gguf.py)."""
    import math

    kind = rope.get("rope_type", "default")
    if kind in ("linear", "yarn"):
        writer.add_rope_scaling_type(gguf.RopeScalingType.LINEAR if kind == "linear" else gguf.RopeScalingType.YARN)
        writer.add_rope_scaling_factor(rope["factor"])
        if kind == "yarn":
            writer.add_rope_scaling_orig_ctx_len(rope["original_max_position_embeddings"])
    if kind != "llama3":
        return None
    base, factor = rope["rope_theta"], rope["factor"]
    low, high, old = rope["low_freq_factor"], rope["high_freq_factor"], rope["original_max_position_embeddings"]
    freqs = 1.0 / (base ** (np.arange(0, head_dim, 2, dtype=np.float32) / head_dim))
    factors = []
    for freq in freqs:
        wavelen = 2 * math.pi / freq
        if wavelen < old / high:
            factors.append(1)
        elif wavelen > old / low:
            factors.append(factor)
        else:
            smooth = (old / wavelen - low) / (high - low)
            factors.append(1 / ((1 - smooth) / factor + smooth))
    return np.array(factors, dtype=np.float32)


def add_extra(writer: gguf.GGUFWriter, extra: dict | None) -> None:
    """Metadata keys: a str, float or int value as STRING, FLOAT32 or UINT32; a tuple ``(value, GGUFValueType)``
    or ``(value, ARRAY, item type)`` as that type. A key already written is replaced (the writer keeps the last)."""
    for key, value in (extra or {}).items():
        if isinstance(value, tuple):
            writer.add_key_value(key, value[0], value[1], sub_type=value[2] if len(value) > 2 else None)
        else:
            {str: writer.add_string, float: writer.add_float32, int: writer.add_uint32}[type(value)](key, value)


def write_tiny_gguf(path: Path, *, layers: int = 2, vocab: int = 64, hidden: int = 64, inter: int = 96,
                    heads: int = 2, kv_heads: int = 1, alignment: int | None = None, extra: dict | None = None,
                    seed: int = 0) -> Path:
    """A small random qwen2 GGUF file (F32 weights, no tokenizer) made with the gguf package alone, no
    transformers or torch: the valid file the malformed-file tests patch."""
    head_dim = hidden // heads
    writer = gguf.GGUFWriter(path, "qwen2")
    if alignment is not None:
        writer.add_custom_alignment(alignment)
    writer.add_context_length(256)
    writer.add_embedding_length(hidden)
    writer.add_block_count(layers)
    writer.add_feed_forward_length(inter)
    writer.add_head_count(heads)
    writer.add_head_count_kv(kv_heads)
    writer.add_rope_freq_base(10000.0)
    writer.add_layer_norm_rms_eps(1e-6)
    writer.add_eos_token_id(vocab - 1)
    add_extra(writer, extra)
    rng = np.random.default_rng(seed)
    shapes = {"token_embd.weight": (vocab, hidden), "output_norm.weight": (hidden,), "output.weight": (vocab, hidden)}
    for i in range(layers):
        q, kv = heads * head_dim, kv_heads * head_dim
        shapes.update({f"blk.{i}.{name}": shape for name, shape in {
            "attn_norm.weight": (hidden,), "ffn_norm.weight": (hidden,),
            "attn_q.weight": (q, hidden), "attn_k.weight": (kv, hidden), "attn_v.weight": (kv, hidden),
            "attn_q.bias": (q,), "attn_k.bias": (kv,), "attn_v.bias": (kv,), "attn_output.weight": (hidden, q),
            "ffn_gate.weight": (inter, hidden), "ffn_up.weight": (inter, hidden), "ffn_down.weight": (hidden, inter),
        }.items()})
    for name, shape in shapes.items():
        scale = 1.0 if len(shape) == 1 else shape[-1] ** -0.5
        writer.add_tensor(name, (rng.standard_normal(shape) * scale).astype(np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


# -- malformed files: byte positions in a valid file, and patches ------------------------------------------

TENSOR_PARTS = ("name length", "name", "dimension count", "dimensions", "type", "offset")


def metadata_at(path: Path, key: str, part: int = 0) -> int:
    """The byte position of part ``part`` of metadata key ``key``'s record (0 the key's length, 1 its bytes,
    2 the value type, 3... the value: a string's length then bytes, an array's item type, count, items)."""
    field = gguf.GGUFReader(path).fields[key]
    return field.offset + sum(int(p.nbytes) for p in field.parts[:part])


def tensor_at(path: Path, name: str, part: str) -> int:
    """The byte position of ``part`` (one of TENSOR_PARTS) of tensor ``name``'s entry in the tensor table."""
    tensor = next(t for t in gguf.GGUFReader(path).tensors if t.name == name)
    return tensor.field.offset + sum(int(p.nbytes) for p in tensor.field.parts[:TENSOR_PARTS.index(part)])


def patched(path: Path, out: Path, at: int, value: bytes) -> Path:
    """A copy of ``path`` at ``out`` with ``value`` written over the bytes at ``at``."""
    data = bytearray(path.read_bytes())
    data[at:at + len(value)] = value
    out.write_bytes(data)
    return out


def kv_record(key: str, vtype: gguf.GGUFValueType, payload: bytes) -> bytes:
    """A metadata record as the file stores it: key length and bytes, value type, then the value's bytes."""
    name = key.encode()
    return struct.pack("<Q", len(name)) + name + struct.pack("<I", vtype) + payload


def with_records(path: Path, out: Path, records: list[bytes], alignment: int = 32) -> Path:
    """A copy of ``path`` at ``out`` with raw metadata ``records`` put before its own, and a filler string
    key after them that keeps the rest of the file (tensor table, data section) where the alignment wants it."""
    raw = b"".join(records)
    filler = kv_record("t.pad", gguf.GGUFValueType.STRING, b"")
    pad = -(len(raw) + len(filler) + 8) % alignment
    raw += kv_record("t.pad", gguf.GGUFValueType.STRING, struct.pack("<Q", pad) + b"-" * pad)
    data = bytearray(path.read_bytes())
    (kv_count,) = struct.unpack_from("<Q", data, 16)
    struct.pack_into("<Q", data, 16, kv_count + len(records) + 1)
    data[24:24] = raw
    out.write_bytes(data)
    return out
