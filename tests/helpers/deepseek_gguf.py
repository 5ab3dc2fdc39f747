"""DeepSeek-V2 / V3 GGUF files as llama.cpp's converter writes them (convert_hf_to_gguf.py's DeepseekV2Model,
llama.cpp's conversion/deepseek.py), from a tiny HF checkpoint (tests/models/families/test_deepseek_gguf.py).

Both as the architecture "deepseek2", the keys in the converter's order: the ones every TextModel writes
(head_count_kv 1: MLA as MQA; expert_count, expert_used_count, expert_group_count / expert_group_used_count from
n_group / topk_group, expert_gating_func from scoring_func, the yarn keys), then DeepseekV2Model's
(leading_dense_block_count, vocab_size, attention.q_lora_rank where there is one, attention.kv_lora_rank,
key_length / value_length as the latent's MQA view kv_lora_rank + rope dims / kv_lora_rank, key_length_mla /
value_length_mla the heads' sizes, expert_feed_forward_length, expert_shared_count, expert_weights_scale,
expert_weights_norm only when true, rope.dimension_count, rope.scaling.yarn_log_multiplier = 0.1 x mscale_all_dim).
Tensors under gguf-py's names for the architecture, rows as HF stores them (nothing permuted); each layer's experts
stacked into ffn_{gate,up,down}_exps; e_score_correction_bias as exp_probs_b.bias; kv_b_proj split per head into
attn_k_b ([heads, kv_lora_rank, nope]: W_uk transposed) and attn_v_b ([heads, v_head_dim, kv_lora_rank]). With
``split_kv_b=False``, as converters before llama.cpp's MLA split wrote it: attn_kv_b whole, key_length /
value_length the heads' sizes, no _mla keys, head_count_kv as config.json says.

Types as the converter picks them: vectors and *_norm weights and the router (ffn_gate_inp) F32, every other
matrix ``qtype`` (F32, F16 or Q8_0; Q8_0 falls back to F16 where a row is not whole blocks of 32), or the
stacked experts ``experts_qtype``.

transformers' DeepSeek configs hold no scoring_func, so the converter would write no expert_gating_func for them
(llama.cpp then reads softmax): this writer writes the released checkpoints' (V3's config.json says sigmoid, V2's
softmax) unless ``gating`` says otherwise (None: no key).
"""

from __future__ import annotations

import json

import numpy as np

from helpers.tiny_models import EOS_ID

RELEASED_GATING = {"deepseek_v3": 2, "deepseek_v2": 1}  # llama.cpp's expert_gating_func: 1 softmax, 2 sigmoid
_CONFIG = object()


def write_deepseek_gguf(directory, path, qtype=None, *, experts_qtype=None, split_kv_b: bool = True,
                        gating=_CONFIG, extra: dict | None = None, without: tuple[str, ...] = (),
                        without_tensors: tuple[str, ...] = ()):
    """The HF checkpoint in ``directory`` as a "deepseek2" GGUF file at ``path`` (the module's docstring).
    ``extra``: metadata keys (after "deepseek2.") to add or replace, a value or (value, GGUFValueType); ``without``:
    keys (after "deepseek2.") left out; ``without_tensors``: tensors left out."""
    import gguf
    from gguf import GGMLQuantizationType as Q
    from gguf import GGUFValueType as T
    from safetensors.torch import load_file

    from helpers.gguf_files import gguf_name, quantize

    qtype = Q.F32 if qtype is None else qtype
    c = json.loads((directory / "config.json").read_text())
    state = {name: w.float().numpy() for name, w in load_file(directory / "model.safetensors").items()}
    rope = c.get("rope_parameters") or c.get("rope_scaling") or {}
    heads, dc, dr = c["num_attention_heads"], c["kv_lora_rank"], c["qk_rope_head_dim"]
    dn, dv = c["qk_nope_head_dim"], c["v_head_dim"]
    if gating is _CONFIG:
        gating = {"sigmoid": 2, "softmax": 1}[c["scoring_func"]] if "scoring_func" in c else \
            RELEASED_GATING[c["model_type"]]

    meta: dict[str, tuple] = {}  # key after "deepseek2." -> (value, type), in the converter's order
    # TextModel.set_gguf_parameters
    meta.update({"block_count": (c["num_hidden_layers"], T.UINT32),
                 "context_length": (c["max_position_embeddings"], T.UINT32),
                 "embedding_length": (c["hidden_size"], T.UINT32),
                 "feed_forward_length": (c["intermediate_size"], T.UINT32),
                 "attention.head_count": (heads, T.UINT32),
                 "attention.head_count_kv": (1 if split_kv_b else c.get("num_key_value_heads", heads), T.UINT32)})
    if rope.get("rope_type") == "yarn" and rope.get("factor") is not None:
        meta.update({"rope.scaling.type": ("yarn", T.STRING), "rope.scaling.factor": (rope["factor"], T.FLOAT32),
                     "rope.scaling.original_context_length": (rope["original_max_position_embeddings"], T.UINT32)})
        for key, name in (("extrapolation_factor", "yarn_ext_factor"), ("attention_factor", "yarn_attn_factor"),
                          ("beta_fast", "yarn_beta_fast"), ("beta_slow", "yarn_beta_slow")):
            if rope.get(key) is not None:
                meta[f"rope.scaling.{name}"] = (rope[key], T.FLOAT32)
    meta.update({"rope.freq_base": (rope.get("rope_theta", c.get("rope_theta")), T.FLOAT32),
                 "attention.layer_norm_rms_epsilon": (c.get("rms_norm_eps", 1e-6), T.FLOAT32),
                 "expert_count": (c["n_routed_experts"], T.UINT32),
                 "expert_used_count": (c["num_experts_per_tok"], T.UINT32)})
    if c.get("n_group") is not None:
        meta["expert_group_count"] = (c["n_group"], T.UINT32)
    if c.get("topk_group") is not None:
        meta["expert_group_used_count"] = (c["topk_group"], T.UINT32)
    if gating is not None:
        meta["expert_gating_func"] = (gating, T.UINT32)
    # DeepseekV2Model.set_gguf_parameters
    meta.update({"leading_dense_block_count": (c.get("first_k_dense_replace") or 0, T.UINT32),
                 "vocab_size": (c["vocab_size"], T.UINT32)})
    if c.get("q_lora_rank") is not None:
        meta["attention.q_lora_rank"] = (c["q_lora_rank"], T.UINT32)
    meta["attention.kv_lora_rank"] = (dc, T.UINT32)
    if split_kv_b:
        meta.update({"attention.key_length": (dc + dr, T.UINT32), "attention.value_length": (dc, T.UINT32),
                     "attention.key_length_mla": (dn + dr, T.UINT32), "attention.value_length_mla": (dv, T.UINT32)})
    else:
        meta.update({"attention.key_length": (dn + dr, T.UINT32), "attention.value_length": (dv, T.UINT32)})
    meta.update({"expert_feed_forward_length": (c["moe_intermediate_size"], T.UINT32),
                 "expert_shared_count": (c.get("n_shared_experts") or 0, T.UINT32)})
    if c.get("routed_scaling_factor") is not None:
        meta["expert_weights_scale"] = (c["routed_scaling_factor"], T.FLOAT32)
    if c.get("norm_topk_prob"):
        meta["expert_weights_norm"] = (True, T.BOOL)
    meta["rope.dimension_count"] = (dr, T.UINT32)
    if rope.get("mscale_all_dim") is not None:
        meta["rope.scaling.yarn_log_multiplier"] = (0.1 * rope["mscale_all_dim"], T.FLOAT32)
    for key, value in (extra or {}).items():
        meta[key] = value if isinstance(value, tuple) else (value, {str: T.STRING, float: T.FLOAT32, bool: T.BOOL,
                                                                    int: T.UINT32}[type(value)])
    writer = gguf.GGUFWriter(path, "deepseek2")
    for key, (value, vtype) in meta.items():
        if key not in without:
            writer.add_key_value(f"deepseek2.{key}", value, vtype)
    writer.add_file_type({Q.F32: gguf.LlamaFileType.ALL_F32, Q.F16: gguf.LlamaFileType.MOSTLY_F16,
                          Q.BF16: gguf.LlamaFileType.MOSTLY_BF16, Q.Q8_0: gguf.LlamaFileType.MOSTLY_Q8_0}[qtype])
    writer.add_eos_token_id(EOS_ID)

    # DeepseekV2Model.modify_tensors
    tensors: dict[str, np.ndarray] = {}
    experts = c["n_routed_experts"]
    for name, w in state.items():
        if ".mlp.experts." in name:
            continue
        if name.endswith("e_score_correction_bias"):
            name = name.replace("e_score_correction_bias", "e_score_correction.bias")
        if name.endswith("kv_b_proj.weight") and split_kv_b:
            kv_b = w.reshape(heads, dn + dv, dc)
            tensors[gguf_name(name.replace("kv_b_proj", "k_b_proj"), "deepseek2")] = kv_b[:, :dn].transpose(0, 2, 1)
            tensors[gguf_name(name.replace("kv_b_proj", "v_b_proj"), "deepseek2")] = kv_b[:, dn:]
            continue
        tensors[gguf_name(name, "deepseek2")] = w
    for i in range(c["num_hidden_layers"]):
        p = f"model.layers.{i}.mlp.experts."
        if p + "0.gate_proj.weight" in state:
            for part in ("down_proj", "gate_proj", "up_proj"):
                tensors[gguf_name(f"{p}{part}.weight", "deepseek2")] = np.stack(
                    [state[f"{p}{e}.{part}.weight"] for e in range(experts)])
    rng = np.random.default_rng(0)
    for name, w in tensors.items():
        if name in without_tensors:
            continue
        t = qtype
        if w.ndim <= 1 or name.endswith("_norm.weight") or ".ffn_gate_inp." in name:
            t = Q.F32
        elif experts_qtype is not None and "_exps." in name:
            t = experts_qtype
        try:
            data = quantize(w, t, rng)
        except gguf.QuantError:  # (the converter's fallback: a row of partial blocks)
            t, data = Q.F16, quantize(w, Q.F16, rng)
        writer.add_tensor(name, np.ascontiguousarray(data), raw_dtype=None if t in (Q.F32, Q.F16) else t)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path
