"""Mixture-of-experts GGUF files as llama.cpp's converter writes them, from a tiny HF checkpoint (the MoE family
tests, tensor parallelism)."""

from __future__ import annotations

import json

import numpy as np

from helpers.tiny_models import EOS_ID


def write_moe_gguf(directory, path, extra: dict | None = None, experts_qtype=None):
    """The HF checkpoint in ``directory`` as llama.cpp's converter writes it: Mixtral as arch llama with
    llama.expert_count (Q/K rows permuted), Qwen3-MoE as arch qwen3moe with qwen3moe.expert_feed_forward_length
    (q_norm / k_norm as attn_{q,k}_norm); the experts of a layer stacked into ffn_{gate,up,down}_exps (Mixtral's
    w1, w3, w2), the router as ffn_gate_inp (a dense layer's MLP as ffn_{gate,up,down}); every tensor F32 (the
    weights exactly), or the stacked experts in ``experts_qtype`` (a gguf.GGMLQuantizationType: gguf_files.quantize;
    K types random blocks of the weights' spread). ``extra``: metadata keys to add or replace
    (gguf_files.add_extra)."""
    import gguf
    from safetensors.torch import load_file

    from helpers.gguf_files import add_extra, gguf_name, llama_permute, quantize

    c = json.loads((directory / "config.json").read_text())
    state = {name: w.float().numpy() for name, w in load_file(directory / "model.safetensors").items()}
    mixtral = c["model_type"] == "mixtral"
    arch = "llama" if mixtral else "qwen3moe"
    experts = c["num_local_experts"] if "num_local_experts" in c else c["num_experts"]  # (transformers 5 writes both
    moe = "block_sparse_moe" if mixtral else "mlp"                                      # families' as the first)
    parts = (("w1", "gate"), ("w3", "up"), ("w2", "down")) if mixtral else \
        (("gate_proj", "gate"), ("up_proj", "up"), ("down_proj", "down"))
    writer = gguf.GGUFWriter(path, arch)
    head_dim = c.get("head_dim") or c["hidden_size"] // c["num_attention_heads"]
    for add, value in ((writer.add_context_length, c["max_position_embeddings"]),
                       (writer.add_embedding_length, c["hidden_size"]), (writer.add_block_count, c["num_hidden_layers"]),
                       (writer.add_feed_forward_length, c["intermediate_size"]),
                       (writer.add_head_count, c["num_attention_heads"]),
                       (writer.add_head_count_kv, c["num_key_value_heads"]), (writer.add_key_length, head_dim),
                       (writer.add_value_length, head_dim), (writer.add_rope_dimension_count, head_dim),
                       (writer.add_rope_freq_base, float(c["rope_parameters"]["rope_theta"])),
                       (writer.add_layer_norm_rms_eps, c["rms_norm_eps"]), (writer.add_vocab_size, c["vocab_size"]),
                       (writer.add_expert_count, experts),
                       (writer.add_expert_used_count, c["num_experts_per_tok"]), (writer.add_eos_token_id, EOS_ID)):
        add(value)
    if not mixtral:
        writer.add_expert_feed_forward_length(c["moe_intermediate_size"])
    add_extra(writer, extra)
    tensors = {}
    for name, w in state.items():
        if f".{moe}.experts." not in name and not name.endswith(f".{moe}.gate.weight"):  # (a dense layer's mlp too)
            gname = gguf_name(name)
            if mixtral and ".attn_q." in gname:
                w = llama_permute(w, c["num_attention_heads"])
            elif mixtral and ".attn_k." in gname:
                w = llama_permute(w, c["num_key_value_heads"])
            tensors[gname] = w
    for i in range(c["num_hidden_layers"]):
        p = f"model.layers.{i}.{moe}."
        if p + "gate.weight" not in state:
            continue  # a dense layer (mlp_only_layers): ffn_gate / ffn_up / ffn_down, as the converter writes it
        tensors[f"blk.{i}.ffn_gate_inp.weight"] = state[p + "gate.weight"]
        for hf, part in parts:
            tensors[f"blk.{i}.ffn_{part}_exps.weight"] = np.stack(
                [state[f"{p}experts.{e}.{hf}.weight"] for e in range(experts)])
    rng = np.random.default_rng(0)
    for name, w in tensors.items():
        if experts_qtype is not None and "_exps." in name:
            writer.add_tensor(name, quantize(w, experts_qtype, rng), raw_dtype=experts_qtype)
        else:
            writer.add_tensor(name, np.ascontiguousarray(w, np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path
