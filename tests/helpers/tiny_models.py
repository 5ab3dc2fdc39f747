"""Tiny random checkpoints of every family made with transformers, and their HF references.

Each checkpoint varies what the forward pass must get right: GQA ratio, head_dim (32/64/128),
layer count, tied embeddings, rope_theta, stored dtype (f32/f16/bf16), sharding, and the
config.json dialect (transformers 5 ``rope_parameters`` vs legacy top-level ``rope_theta``).

Random models have near-tied logits, so the init is scaled up (initializer_range 0.1, random
biases and norm weights, lm_head rows of spread-out norms) to make greedy choices mostly
decisive; the parity test still accepts a rare near-tie, measured against HF's own logits
(DESIGN §6).
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import numpy as np
import torch

TORCH_DTYPES = {"f32": torch.float32, "f16": torch.float16, "bf16": torch.bfloat16}
EOS_ID = 256  # the test tokenizer's <|endoftext|> (ids 0..255 are bytes)
NEW_TOKENS = 40
PROMPT_LENGTHS = (1, 13, 64)


@dataclasses.dataclass(frozen=True)
class Spec:
    arch: str = "qwen2"  # the checkpoint's model_type (gemma3: its text model's, gemma3_text)
    family: str | None = None  # the llaisys class that runs it, where the spec stands for a family (test_families)
    dtype: str = "f32"
    vocab: int = 384
    hidden: int = 128
    inter: int = 256
    layers: int = 2
    heads: int = 4
    kv_heads: int = 2
    head_dim: int | None = None  # None: hidden // heads, and left out of config.json
    tie: bool = False
    rope_theta: float = 10000.0
    max_pos: int = 512
    shard: str | None = None  # max_shard_size for save_pretrained
    legacy_config: bool = False  # rewrite config.json the way transformers 4 wrote it
    seed: int = 0
    # lm_head rows scaled by exp(N(0, spread)): a heavier-tailed logit distribution makes greedy
    # choices decisive (ignored for tied embeddings, where it would also scale the inputs)
    lm_head_spread: float = 0.5
    rope_scaling: dict | None = None  # rope_parameters beyond type "default" ({"rope_type": "llama3", ...})
    # mixture of experts (arch mixtral / qwen3_moe): experts per layer, picked per token, their width
    experts: int = 0
    top_k: int = 0
    moe_inter: int = 0
    norm_topk: bool = False  # qwen3_moe: norm_topk_prob
    dense_layers: tuple[int, ...] = ()  # qwen3_moe: mlp_only_layers
    # sliding-window attention: the window; the layers from max_window_layers on (qwen2: use_sliding_window);
    # gemma3: every layer but each window_pattern-th
    sliding_window: int | None = None
    max_window_layers: int | None = None
    window_pattern: int | None = None
    query_pre_attn_scalar: float | None = None  # gemma3
    local_rope_theta: float = 10000.0  # gemma3: the sliding layers' rope base
    # DeepSeek (arch deepseek_v2 / deepseek_v3): MLA dims, groups, shared experts... as config keyword arguments
    # (a tuple of pairs: the spec stays hashable); V3's e_score_correction_bias drawn from N(0, 0.1)
    config_extra: tuple[tuple[str, object], ...] = ()


SPECS = {
    # GQA 2, head_dim 32, f32, untied, default theta
    "f32_gqa2_hd32": Spec(dtype="f32", hidden=128, heads=4, kv_heads=2, layers=2, seed=1),
    # MHA, head_dim 64, f32, tied embeddings, theta 1e6
    "f32_mha_hd64_tied": Spec(dtype="f32", vocab=512, hidden=128, heads=2, kv_heads=2, layers=3, inter=320,
                              tie=True, rope_theta=1e6, seed=6),
    # MHA, head_dim 64, bf16, 3 layers, theta 1e6
    "bf16_mha_hd64": Spec(dtype="bf16", vocab=512, hidden=128, heads=2, kv_heads=2, layers=3, inter=320,
                          rope_theta=1e6, seed=2),
    # GQA 4, head_dim 128 (q width 512 != hidden 192), bf16, sharded into several files
    "bf16_gqa4_hd128_sharded": Spec(dtype="bf16", vocab=512, hidden=192, heads=4, kv_heads=1, head_dim=128,
                                    layers=2, inter=384, rope_theta=5e5, shard="200KB", seed=3),
    # GQA 3, head_dim 64, f16, 5 layers, legacy config.json (top-level rope_theta, eos list)
    "f16_gqa3_hd64_legacy": Spec(dtype="f16", vocab=320, hidden=192, heads=6, kv_heads=2, head_dim=64, layers=5,
                                 inter=256, rope_theta=20000.0, legacy_config=True, seed=4),
    # Llama architecture: no q/k/v bias; tied embeddings
    "llama_f32_tied": Spec(arch="llama", dtype="f32", vocab=320, hidden=128, heads=4, kv_heads=1, layers=2,
                           tie=True, seed=5),
    # The family table: a checkpoint per family (and variation) that its own decoder runs, in f32 and bf16, with
    # the llaisys class that must run it (a new family is one row: docs/guides/adding-a-family.md). Rope
    # scaling with a boundary (original_max_position_embeddings 32) that the prompts (up to 64 + 40 new tokens)
    # pass.
    **{f"{name}_{dtype}": dataclasses.replace(spec, dtype=dtype) for name, spec in {
        # Qwen3: q/k norms, head_dim 48 (q width 192 != hidden 128), no q/k/v bias
        "qwen3": Spec(arch="qwen3", family="Qwen3", hidden=128, heads=4, kv_heads=2, head_dim=48, inter=256,
                      rope_theta=1e6, seed=7),
        # Mistral: Llama with an explicit head_dim (64, q width 256 != hidden 128), a sliding window of 60 on
        # every layer (which llama.cpp's converter does not write: test_families)
        "mistral": Spec(arch="mistral", family="Llama", hidden=128, heads=4, kv_heads=1, head_dim=64,
                        sliding_window=60, seed=8),
        # Phi-3: fused qkv_proj and gate_up_proj; a sliding window of 24 on every layer
        "phi3": Spec(arch="phi3", family="Phi3", hidden=128, heads=4, kv_heads=2, inter=192, sliding_window=24, seed=9),
        # Llama 3.1: llama3 rope scaling (wavelengths past 32 positions scaled, 8..32 smoothed)
        "llama3": Spec(arch="llama", family="Llama", hidden=128, heads=4, kv_heads=2, rope_theta=5e5, seed=10,
                       rope_scaling={"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                                     "high_freq_factor": 4.0, "original_max_position_embeddings": 32}),
        # Qwen2.5 long context: YaRN (factor 4 over 32 original positions: attention factor 1.139); and
        # use_sliding_window with max_window_layers 1: layer 1 of 2 sees its last 60 positions
        "qwen2_yarn": Spec(arch="qwen2", family="Qwen2", hidden=128, heads=4, kv_heads=2, rope_theta=1e6, seed=11,
                           rope_scaling={"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 32},
                           sliding_window=60, max_window_layers=1),
        # Gemma 3: sliding (window 24, rope base 1e4) and global (1e6) layers alternating, (1 + w) norms around
        # both blocks, GeGLU, q/k norms, embeddings times sqrt(80) (8.9375 in bf16), query_pre_attn_scalar 24
        # != head_dim 32
        "gemma3": Spec(arch="gemma3", family="Gemma3", vocab=320, hidden=80, inter=160, layers=3, heads=4, kv_heads=2,
                       head_dim=32, tie=True, rope_theta=1e6, sliding_window=24, window_pattern=2,
                       query_pre_attn_scalar=24, seed=12),
        # OLMo 2: norms after attention and MLP (none before), q/k normed over all heads (widths 128 and 64)
        "olmo2": Spec(arch="olmo2", family="Olmo2", hidden=128, heads=4, kv_heads=2, rope_theta=5e5, seed=15),
    }.items() for dtype in ("f32", "bf16")},
}
# Mixture-of-experts checkpoints (tests/models/test_moe_families.py)
MOE_SPECS = {
    # Mixtral: 8 experts, top 2, GQA 2
    "mixtral_f32": Spec(arch="mixtral", dtype="f32", hidden=128, inter=96, heads=4, kv_heads=2, layers=2,
                        experts=8, top_k=2, seed=7),
    "mixtral_bf16": Spec(arch="mixtral", dtype="bf16", hidden=128, inter=96, heads=4, kv_heads=2, layers=2,
                         experts=8, top_k=2, seed=8),
    # Qwen3-MoE: q/k norms, head_dim 64 (q width 256 != hidden 128), 16 experts top 4, layer 1 dense
    # (mlp_only_layers), raw top-k weights (norm_topk_prob false)
    "qwen3_moe_f32": Spec(arch="qwen3_moe", dtype="f32", hidden=128, inter=192, heads=4, kv_heads=2, head_dim=64,
                          layers=3, experts=16, top_k=4, moe_inter=64, dense_layers=(1,), seed=9),
    # renormalised weights (norm_topk_prob), every layer sparse, bf16
    "qwen3_moe_bf16": Spec(arch="qwen3_moe", dtype="bf16", hidden=128, inter=192, heads=4, kv_heads=2, head_dim=64,
                           layers=2, experts=8, top_k=2, moe_inter=64, norm_topk=True, seed=10),
}
# DeepSeek checkpoints (tests/models/families/test_deepseek.py)
DEEPSEEK_SPECS = {
    # DeepSeek-V3: q low rank 48, latent 32 + rope key 8 (interleaved pairs), nope 16, v 24 != qk 24; 8 routed
    # experts in 4 groups (2 eligible), top 3 by sigmoid score + correction bias, normalised, x 2.5; 1 shared
    # expert; layer 0 dense
    "deepseek_v3_f32": Spec(arch="deepseek_v3", dtype="f32", hidden=96, inter=160, heads=4, kv_heads=4, layers=3,
                            experts=8, top_k=3, moe_inter=48, seed=11, config_extra=(
                                ("q_lora_rank", 48), ("kv_lora_rank", 32), ("qk_rope_head_dim", 8),
                                ("qk_nope_head_dim", 16), ("v_head_dim", 24), ("n_group", 4), ("topk_group", 2),
                                ("n_shared_experts", 1), ("first_k_dense_replace", 1), ("norm_topk_prob", True),
                                ("routed_scaling_factor", 2.5))),
    # DeepSeek-V2-Lite-like: no q low rank, softmax routing in groups (group_limited_greedy), raw weights x 1.5,
    # 2 shared experts, layer 0 dense
    "deepseek_v2_f32": Spec(arch="deepseek_v2", dtype="f32", hidden=96, inter=160, heads=4, kv_heads=4, layers=3,
                            experts=8, top_k=2, moe_inter=32, seed=12, config_extra=(
                                ("q_lora_rank", None), ("kv_lora_rank", 32), ("qk_rope_head_dim", 16),
                                ("qk_nope_head_dim", 16), ("v_head_dim", 16), ("n_group", 4), ("topk_group", 2),
                                ("topk_method", "group_limited_greedy"), ("n_shared_experts", 2),
                                ("first_k_dense_replace", 1), ("routed_scaling_factor", 1.5))),
}
# (bf16 seed 15: at seeds 13, 14 and 16 near-tied routing choices, which flip whole experts, put one position's
# logits 2-5 from the exact ones where HF's own flips put its 0.2-5.6, past parity_rule's prefill bound; the
# median errors equal HF's, 0.09-0.12)
DEEPSEEK_SPECS["deepseek_v3_bf16"] = dataclasses.replace(DEEPSEEK_SPECS["deepseek_v3_f32"], dtype="bf16", seed=15)
# DeepSeek's YaRN: factor 4 over 32 original positions (the prompts pass them), mscale = mscale_all_dim = 0.707 as
# DeepSeek-V2's config has them: the softmax scale times mscale^2 (a GGUF file holds only mscale_all_dim, as
# yarn_log_multiplier, so llama.cpp's reading of a file assumes they are equal)
DEEPSEEK_SPECS["deepseek_v3_yarn_f32"] = dataclasses.replace(
    DEEPSEEK_SPECS["deepseek_v3_f32"], seed=16, rope_scaling={"rope_type": "yarn", "factor": 4.0, "mscale": 0.707,
                                                              "original_max_position_embeddings": 32,
                                                              "mscale_all_dim": 0.707})
ALL_SPECS = {**SPECS, **MOE_SPECS, **DEEPSEEK_SPECS}


def write_tokenizer(directory: Path) -> None:
    """A byte-level tokenizer: byte b is token b, <|endoftext|> is 256; a simple chat template."""
    from tokenizers import AddedToken, Tokenizer, decoders, pre_tokenizers
    from tokenizers.models import BPE
    from transformers import PreTrainedTokenizerFast
    from transformers.convert_slow_tokenizer import bytes_to_unicode  # GPT-2's byte alphabet

    vocab = {sym: b for b, sym in bytes_to_unicode().items()}
    core = Tokenizer(BPE(vocab=vocab, merges=[], unk_token=None, fuse_unk=False, byte_fallback=False))
    core.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    core.decoder = decoders.ByteLevel()
    core.add_special_tokens([AddedToken("<|endoftext|>", special=True, normalized=False)])
    fast = PreTrainedTokenizerFast(tokenizer_object=core, eos_token="<|endoftext|>", pad_token="<|endoftext|>")
    fast.chat_template = ("{% for m in messages %}<{{ m['role'] }}>{{ m['content'] }}\n{% endfor %}"
                          "{% if add_generation_prompt %}<assistant>{% endif %}")
    fast.save_pretrained(directory)


def make_checkpoint(directory: Path, spec: Spec) -> Path:
    """Create the HF checkpoint of ``spec`` in ``directory`` (weights, config, tokenizer)."""
    from transformers import CONFIG_MAPPING, MODEL_FOR_CAUSAL_LM_MAPPING

    # the model_type's configuration and causal LM classes (Gemma3Config is the multimodal one)
    config_cls = CONFIG_MAPPING[{"gemma3": "gemma3_text"}.get(spec.arch, spec.arch)]
    model_cls = MODEL_FOR_CAUSAL_LM_MAPPING[config_cls]
    extra = {"head_dim": spec.head_dim} if spec.head_dim else {}
    if spec.arch in ("mistral", "phi3", "gemma3") or spec.sliding_window is not None:
        extra["sliding_window"] = spec.sliding_window
    if spec.max_window_layers is not None:
        extra.update(use_sliding_window=True, max_window_layers=spec.max_window_layers)
    if spec.arch == "mixtral":
        extra.update(num_local_experts=spec.experts, num_experts_per_tok=spec.top_k)
    if spec.arch == "qwen3_moe":
        extra.update(num_experts=spec.experts, num_experts_per_tok=spec.top_k, moe_intermediate_size=spec.moe_inter,
                     norm_topk_prob=spec.norm_topk, mlp_only_layers=list(spec.dense_layers), decoder_sparse_step=1)
    if spec.arch.startswith("deepseek"):
        extra.update(n_routed_experts=spec.experts, num_experts_per_tok=spec.top_k,
                     moe_intermediate_size=spec.moe_inter, **dict(spec.config_extra))
    rope = {"rope_type": "default", "rope_theta": spec.rope_theta, **(spec.rope_scaling or {})}
    if spec.arch == "gemma3":
        extra.update(sliding_window_pattern=spec.window_pattern, query_pre_attn_scalar=spec.query_pre_attn_scalar)
        rope = {"full_attention": rope, "sliding_attention": {"rope_type": "default",
                                                              "rope_theta": spec.local_rope_theta}}
    config = config_cls(vocab_size=spec.vocab, hidden_size=spec.hidden, intermediate_size=spec.inter,
                        num_hidden_layers=spec.layers, num_attention_heads=spec.heads,
                        num_key_value_heads=spec.kv_heads, max_position_embeddings=spec.max_pos,
                        tie_word_embeddings=spec.tie, initializer_range=0.1, rms_norm_eps=1e-6,
                        rope_parameters=rope,
                        eos_token_id=EOS_ID, bos_token_id=None, pad_token_id=EOS_ID, **extra)
    torch.manual_seed(spec.seed)
    model = model_cls(config).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("bias"):
                p.normal_(0.0, 0.1)
            elif "norm" in name:  # (Gemma's norms multiply by 1 + w)
                p.uniform_(-0.5, 0.5) if spec.arch == "gemma3" else p.uniform_(0.5, 1.5)
        for name, buffer in model.named_buffers():
            if name.endswith("e_score_correction_bias"):
                buffer.normal_(0.0, 0.1)
        if not spec.tie and spec.lm_head_spread:
            rows = torch.randn(spec.vocab, 1, generator=torch.Generator().manual_seed(spec.seed))
            model.lm_head.weight.mul_(torch.exp(rows * spec.lm_head_spread))
    model = model.to(TORCH_DTYPES[spec.dtype])
    kwargs = {"max_shard_size": spec.shard} if spec.shard else {}
    model.save_pretrained(directory, **kwargs)
    write_tokenizer(directory)
    if spec.legacy_config:
        path = directory / "config.json"
        raw = json.loads(path.read_text())
        raw["rope_theta"] = raw.pop("rope_parameters")["rope_theta"]
        raw["eos_token_id"] = [EOS_ID]
        raw["torch_dtype"] = raw.pop("dtype", None)
        raw.pop("layer_types", None)
        path.write_text(json.dumps(raw, indent=2))
    if spec.shard:
        assert (directory / "model.safetensors.index.json").is_file()
    return directory


def prompt(spec_name: str, length: int, vocab: int) -> list[int]:
    seed = sum(map(ord, spec_name)) * 1000 + length
    return np.random.default_rng(seed).integers(0, min(vocab, 256), size=length).tolist()


@dataclasses.dataclass
class Reference:
    """HF greedy tokens for a prompt and HF's logits along that sequence (float32 and float64)."""

    prompt: list[int]
    tokens: list[int]  # prompt + NEW_TOKENS greedy tokens (EOS suppressed)
    logits: np.ndarray  # [len(tokens) - 1, vocab] from HF in the checkpoint's dtype
    exact_logits: np.ndarray  # the same from HF in float64 (the weights upcast exactly)


class TinyModels:
    """Checkpoints and HF references, made on first use and kept for the session."""

    def __init__(self, root: Path):
        self.root = root
        self._paths: dict[str, Path] = {}
        self._hf: dict[tuple[str, str], object] = {}
        self._refs: dict[tuple[str, int], Reference] = {}

    def path(self, name: str) -> Path:
        if name not in self._paths:
            directory = self.root / name
            directory.mkdir()
            self._paths[name] = make_checkpoint(directory, ALL_SPECS[name])
        return self._paths[name]

    def hf(self, name: str, dtype: str | None = None):
        """The HF model loaded back from the checkpoint directory (as llaisys reads it)."""
        from transformers import AutoModelForCausalLM

        dtype = dtype or ALL_SPECS[name].dtype
        key = (name, dtype)
        if key not in self._hf:
            torch_dtype = torch.float64 if dtype == "f64" else TORCH_DTYPES[dtype]
            # (MoE experts as HF's eager loop: its default grouped_mm has no float64)
            extra = {"experts_implementation": "eager"} if ALL_SPECS[name].experts else {}
            self._hf[key] = AutoModelForCausalLM.from_pretrained(self.path(name), dtype=torch_dtype, **extra).eval()
        return self._hf[key]

    def reference(self, name: str, length: int) -> Reference:
        key = (name, length)
        if key not in self._refs:
            ids = prompt(name, length, ALL_SPECS[name].vocab)
            self._refs[key] = greedy_reference(self.hf(name), lambda: self.hf(name, "f64"), ids)
        return self._refs[key]


def greedy_reference(model, exact_model, ids: list[int]) -> Reference:
    """HF ``model``'s NEW_TOKENS greedy tokens after ``ids``, its logits along them, and the logits of
    ``exact_model()`` (the same weights in float64) along the same tokens."""
    with torch.no_grad():
        x = torch.tensor([ids])
        out = model.generate(x, attention_mask=torch.ones_like(x), max_new_tokens=NEW_TOKENS,
                             min_new_tokens=NEW_TOKENS, do_sample=False, pad_token_id=EOS_ID)
        tokens = out[0].tolist()
        seq = torch.tensor([tokens[:-1]])
        logits = model(seq).logits[0].float().numpy()
        exact = exact_model()(seq).logits[0].numpy()
    return Reference(ids, tokens, logits, exact)
