"""GGUF files written from the tiny random HF checkpoints, the way llama.cpp's converter writes them.

``write_gguf(hf_model, tokenizer_dir, path, qtype)`` stores every matrix as ``qtype`` and the norms
and biases as F32 (as llama.cpp does), the hyper-parameters under llama.cpp's keys, the
tokenizer as ``tokenizer.ggml.*`` metadata, and for the Llama architecture the Q/K rows in
llama.cpp's permuted order.

Matrices are quantized by the ``gguf`` package's own quantizers where it has one (F16, BF16,
Q8_0, Q4_0, Q4_1, Q5_0, Q5_1). It has none for the k-quants, so those blocks are random bytes
with their f16 super-block scales set to give the weights the original tensor's spread: parity
only needs llaisys and HF to read the same bytes.
"""

from __future__ import annotations

import json
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
}


def gguf_name(hf_name: str) -> str:
    if hf_name.startswith("model.layers."):
        i, rest = hf_name[len("model.layers."):].split(".", 1)
        return f"blk.{i}.{LAYER_TENSORS[rest]}"
    return {"model.embed_tokens.weight": "token_embd.weight", "model.norm.weight": "output_norm.weight",
            "lm_head.weight": "output.weight"}[hf_name]


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

    For the error tests: ``arch`` overrides general.architecture, ``extra`` adds metadata keys,
    ``types`` sets the type of single tensors (by GGUF name), ``skip`` leaves tensors out.
    """
    c = hf_model.config
    model_arch = c.model_type
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
    writer.add_rope_freq_base(float(c.rope_parameters["rope_theta"]))
    writer.add_layer_norm_rms_eps(c.rms_norm_eps)
    writer.add_vocab_size(c.vocab_size)
    writer.add_file_type(gguf.LlamaFileType.ALL_F32 if qtype == Q.F32 else gguf.LlamaFileType.GUESSED)
    if tokenizer:
        write_tokenizer_metadata(writer, tokenizer_dir, c.vocab_size)
    for key, value in (extra or {}).items():  # after the standard keys, so it can replace one
        {str: writer.add_string, float: writer.add_float32, int: writer.add_uint32}[type(value)](key, value)

    rng = np.random.default_rng(seed)
    for hf_name, param in hf_model.state_dict().items():
        if hf_name == "lm_head.weight" and c.tie_word_embeddings:
            continue
        w = param.detach().float().numpy()
        name = gguf_name(hf_name)
        if name in skip:
            continue
        if model_arch == "llama" and ".attn_q." in name:
            w = llama_permute(w, c.num_attention_heads)
        elif model_arch == "llama" and ".attn_k." in name:
            w = llama_permute(w, c.num_key_value_heads)
        tensor_type = qtype if w.ndim == 2 else Q.F32  # norms and biases stay F32, as llama.cpp keeps them
        tensor_type = (types or {}).get(name, tensor_type)
        data = quantize(w, tensor_type, rng)
        writer.add_tensor(name, data, raw_shape=data.shape, raw_dtype=tensor_type)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path
