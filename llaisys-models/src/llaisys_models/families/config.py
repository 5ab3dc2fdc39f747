"""The model's shape and hyper-parameters, read from a HuggingFace ``config.json``.

Writers differ: transformers >= 5 nests ``rope_theta`` under ``rope_parameters``
(sometimes once more per layer type), older files keep ``rope_theta`` (and
``rope_scaling``) at top level; ``head_dim`` and ``num_key_value_heads`` may be
absent; ``eos_token_id`` may be an int, a list or missing. Every form is read here,
and anything the forward pass cannot honour is refused with a message naming it.
"""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path

from ..errors import ModelLoadError, shown
from ..loading.files import read_json_object
from .rope_scaling import SUPPORTED as ROPE_TYPES
from .rope_scaling import RopeScaling

DEFAULT_ROPE_THETA = 10000.0
MAX_LAYERS = 1 << 20  # a bound for corrupt counts (the largest models have ~130 layers)


@dataclasses.dataclass(frozen=True)
class ModelConfig:
    architecture: str
    model_type: str
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    rms_norm_eps: float
    rope_theta: float
    max_position_embeddings: int
    tie_word_embeddings: bool
    eos_token_ids: tuple[int, ...]
    bos_token_id: int | None = None
    qkv_bias: bool = True
    o_bias: bool = False
    mlp_bias: bool = False
    # sliding-window attention: the layers in sliding_layers see only their last sliding_window positions
    # (HF's layer_types "sliding_attention"; None / (): no layer slides)
    sliding_window: int | None = None
    sliding_layers: tuple[int, ...] = ()
    rope_scaling: RopeScaling = RopeScaling()  # rope_scaling.py: the frequency table's variant
    rope_local_theta: float | None = None  # Gemma 3: the plain rope base of the sliding layers (None: rope_theta's)
    qk_norm: bool = False  # Qwen3: an RMSNorm over each head of q and of k, before rope
    fused_projections: bool = False  # Phi-3: q/k/v in one qkv_proj, gate/up in one gate_up_proj (weights.py)
    query_pre_attn_scalar: float | None = None  # Gemma: attention scores times query_pre_attn_scalar^-1/2
    sandwich_norms: bool = False  # Gemma: RMSNorms of the attention's and the MLP's outputs too (weights.py)
    norm_offset: float = 0.0  # Gemma: every RMSNorm multiplies by norm_offset + w (1 + w; weights.py keeps it f32)
    dtype_name: str | None = None  # "bfloat16", ... as the writer declared it (informative)
    # mixture of experts (Mixtral, Qwen3-MoE; 0 experts: a dense model): the layers whose MLP is num_experts
    # experts of moe_intermediate_size of which a router picks num_experts_per_tok per token, their weights
    # renormalised to sum 1 when norm_topk_prob
    num_experts: int = 0
    num_experts_per_tok: int = 0
    moe_intermediate_size: int = 0
    norm_topk_prob: bool = False
    sparse_layers: tuple[int, ...] = ()

    @classmethod
    def from_file(cls, path, supported=None) -> "ModelConfig":
        """The config.json of a directory (or that file); with ``supported`` (architecture names), a config of
        any other architecture is refused as such before its fields are read (GPT-2 has none of Llama's)."""
        path = Path(path)
        if path.is_dir():
            path = path / "config.json"
        if not path.exists():
            ggufs = sorted(p.name for p in path.parent.glob("*.gguf"))
            hint = f"; it holds a GGUF file: pass the file, {path.parent / ggufs[0]}" if len(ggufs) == 1 else (
                f"; it holds GGUF files: pass one of them ({', '.join(ggufs)})" if ggufs else "")
            raise ModelLoadError(f"{path} does not exist: a model directory needs a HuggingFace config.json{hint}")
        raw = read_json_object(path)
        try:
            if supported is not None and (arch := architecture(raw)) not in supported:
                if arch in REFUSED:
                    raise ModelLoadError(f"architecture {arch!r} {REFUSED[arch]}")
                named = repr(arch) if arch else f"(none; model_type {shown(raw.get('model_type'))})"
                raise ModelLoadError(f"architecture {named} is not supported; llaisys_models runs "
                                     f"{', '.join(sorted(supported))}")
            return cls.from_dict(raw)
        except ModelLoadError as e:
            raise ModelLoadError(f"{path}: {e}") from None

    @classmethod
    def from_dict(cls, raw: dict) -> "ModelConfig":
        model_type = raw.get("model_type", "")
        architecture_name = architecture(raw)

        hidden = _int(raw, "hidden_size")
        heads = _int(raw, "num_attention_heads")
        kv_heads = _int(raw, "num_key_value_heads", heads)
        head_dim = raw.get("head_dim")
        if head_dim is None:
            if hidden % heads:
                raise ModelLoadError(f"hidden_size {hidden} is not a multiple of num_attention_heads {heads} "
                                     f"and head_dim is not given")
            head_dim = hidden // heads
        head_dim = _positive("head_dim", head_dim)
        if heads % kv_heads:
            raise ModelLoadError(f"num_attention_heads {heads} is not a multiple of num_key_value_heads {kv_heads}")
        if head_dim % 2:
            raise ModelLoadError(f"head_dim {head_dim} must be even for rotary embeddings")
        gemma = model_type == "gemma3_text"
        rope_theta, rope_scaling = _rope(raw, DEFAULT_GEMMA_ROPE_THETA if gemma else DEFAULT_ROPE_THETA)
        is_qwen2 = model_type == "qwen2" or architecture_name.startswith("Qwen2")
        layers = _int(raw, "num_hidden_layers")
        if layers > MAX_LAYERS:  # (the per-layer lists below would be built before the checkpoint is counted)
            raise ModelLoadError(f"config field 'num_hidden_layers' = {layers} is more than llaisys runs ({MAX_LAYERS})")
        window, sliding_layers = _sliding_window(raw, model_type, layers)
        _check_activation(raw, model_type)
        attention_bias = _bool(raw, "attention_bias")
        return cls(
            architecture=architecture_name,
            model_type=model_type,
            vocab_size=_int(raw, "vocab_size"),
            hidden_size=hidden,
            intermediate_size=_int(raw, "intermediate_size"),
            num_hidden_layers=layers,
            num_attention_heads=heads,
            num_key_value_heads=kv_heads,
            head_dim=head_dim,
            rms_norm_eps=_float(raw, "rms_norm_eps", 1e-6),
            rope_theta=rope_theta,
            rope_scaling=rope_scaling,
            max_position_embeddings=_int(raw, "max_position_embeddings", 131072 if gemma else 32768),
            tie_word_embeddings=_bool(raw, "tie_word_embeddings", gemma),
            eos_token_ids=token_ids(raw.get("eos_token_id"), "eos_token_id"),
            bos_token_id=(token_ids(raw.get("bos_token_id"), "bos_token_id") or (None,))[0],
            # Qwen2 always has q/k/v biases and no o_proj bias; Llama has all four or none.
            qkv_bias=is_qwen2 or attention_bias,
            o_bias=not is_qwen2 and attention_bias,
            mlp_bias=_bool(raw, "mlp_bias"),
            sliding_window=window,
            sliding_layers=sliding_layers,
            qk_norm=model_type in ("qwen3", "qwen3_moe", "gemma3_text"),
            fused_projections=model_type == "phi3",
            **(_gemma3(raw) if gemma else {}),
            dtype_name=next((d for d in (raw.get("dtype"), raw.get("torch_dtype")) if isinstance(d, str)), None),
            **_experts(raw, model_type, layers),
        )

    @property
    def q_size(self) -> int:
        return self.num_attention_heads * self.head_dim

    @property
    def attention_scale(self) -> float:
        """What q . k is multiplied by: 1 / sqrt(head_dim), or Gemma's 1 / sqrt(query_pre_attn_scalar)."""
        return (self.query_pre_attn_scalar or self.head_dim) ** -0.5

    def window(self, layer: int) -> int:
        """Layer ``layer``'s sliding window: it sees its last ``window`` positions (0: all of them)."""
        return self.sliding_window if layer in self.sliding_layers else 0

    @property
    def kv_size(self) -> int:
        return self.num_key_value_heads * self.head_dim


# architectures of a known family that llaisys does not run, and why
REFUSED = {"Gemma3ForConditionalGeneration": "(Gemma 3 with its vision tower) is not supported: llaisys runs Gemma 3's "
                                           "text model, Gemma3ForCausalLM (gemma-3-1b and the text-only checkpoints)"}

_DEFAULT_ARCH = {"qwen2": "Qwen2ForCausalLM", "llama": "LlamaForCausalLM", "qwen3": "Qwen3ForCausalLM",
                 "mistral": "MistralForCausalLM", "phi3": "Phi3ForCausalLM", "gemma3_text": "Gemma3ForCausalLM"}


def architecture(raw: dict) -> str:
    """The class name a config.json names (the first of ``architectures``, else the one its ``model_type``
    implies; "" for neither)."""
    architectures = raw.get("architectures")
    if architectures is None:
        architectures = []
    elif isinstance(architectures, str):
        architectures = [architectures]
    if not isinstance(architectures, list) or not all(isinstance(a, str) for a in architectures):
        raise ModelLoadError(f"config field 'architectures' must be a list of class names, got {shown(architectures)}")
    model_type = raw.get("model_type", "")
    if not isinstance(model_type, str):
        raise ModelLoadError(f"config field 'model_type' must be a string, got {shown(model_type)}")
    return architectures[0] if architectures else _DEFAULT_ARCH.get(model_type, "")


def token_ids(value, name: str) -> tuple[int, ...]:
    """An id, a list of ids or None -> a tuple of ids."""
    if value is None:
        return ()
    values = value if isinstance(value, (list, tuple)) else [value]
    for v in values:
        if isinstance(v, bool) or not isinstance(v, int) or v < 0:
            raise ModelLoadError(f"{name} must be a token id or a list of them, got {shown(value)}")
    return tuple(values)


def _int(raw: dict, key: str, default=None) -> int:
    value = raw.get(key, default)
    if value is None:
        raise ModelLoadError(f"config field {key!r} is missing")
    return _positive(key, value)


def _positive(key: str, value) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise ModelLoadError(f"config field {key!r} must be a positive integer, got {shown(value)}")
    return value


def _float(raw: dict, key: str, default: float) -> float:
    value = raw.get(key, default)
    if not _finite(value) or value < 0:
        raise ModelLoadError(f"config field {key!r} must be a finite non-negative number, got {shown(value)}")
    return float(value)


def _finite(value) -> bool:
    """A JSON number that is finite (JSON files may hold Infinity and NaN; json reads them)."""
    return not isinstance(value, bool) and isinstance(value, (int, float)) and math.isfinite(value)


def _bool(raw: dict, key: str, default: bool = False) -> bool:
    """A true/false field; a string such as "false" is refused rather than read as true."""
    value = raw.get(key, default)
    if value is None:
        return default
    if not isinstance(value, bool):
        raise ModelLoadError(f"config field {key!r} must be true or false, got {shown(value)}")
    return value


def _rope(raw: dict, default_theta: float = DEFAULT_ROPE_THETA) -> tuple[float, RopeScaling]:
    """rope_theta and the rope's scaling, from ``rope_parameters`` (transformers >= 5: one object with the
    type, theta and the type's parameters, or one per layer type: the full-attention layers' here) or the top
    level (older writers: ``rope_theta`` and a ``rope_scaling`` object with ``type`` / ``rope_type``)."""
    params = raw.get("rope_parameters")
    if params is not None and not isinstance(params, dict):
        raise ModelLoadError(f"config field 'rope_parameters' must be an object, got {shown(params)}")
    if isinstance(params, dict) and "rope_theta" not in params and "rope_type" not in params:
        # one set per layer type: {"full_attention": {...}, "sliding_attention": {...}}
        params = params.get("full_attention") or next(iter(params.values()), None)
    if not isinstance(params, dict):
        params = {}
    scaling = raw.get("rope_scaling")
    if scaling is not None and not isinstance(scaling, dict):
        raise ModelLoadError(f"config field 'rope_scaling' must be an object, got {shown(scaling)}")
    source, name = params, "rope_parameters"
    if params.get("rope_type", "default") in (None, "default") and scaling:
        source, name = scaling, "rope_scaling"
    partial = params.get("partial_rotary_factor", raw.get("partial_rotary_factor", 1.0))
    if partial not in (None, 1, 1.0):
        raise ModelLoadError(f"partial_rotary_factor {shown(partial)} is not supported")
    theta = params.get("rope_theta", raw.get("rope_theta", default_theta))
    if not _finite(theta) or theta <= 0:
        raise ModelLoadError(f"config field 'rope_theta' must be a finite positive number, got {shown(theta)}")
    return float(theta), _rope_scaling(source, name, raw)


def _rope_scaling(source: dict, name: str, raw: dict) -> RopeScaling:
    """The rope type named in ``source`` (config field ``name``) with the parameters it reads, each checked."""
    kind = source.get("rope_type", source.get("type", "default"))
    kind = "default" if kind is None else kind
    if kind in ("longrope", "su", "dynamic"):
        raise ModelLoadError(f"rope scaling of type {shown(kind)} ({name}.rope_type) is not supported: its "
                             f"frequencies change with the sequence length (llaisys runs {', '.join(ROPE_TYPES)})")
    if kind not in ROPE_TYPES:
        raise ModelLoadError(f"rope scaling of type {shown(kind)} ({name}.rope_type) is not supported (llaisys runs "
                             f"{', '.join(ROPE_TYPES)})")

    def number(key: str, required: bool = True, positive: bool = True):
        value = source.get(key)
        if value is None:
            if required:
                raise ModelLoadError(f"config field '{name}.{key}' is missing (rope type {kind!r} needs it)")
            return None
        if not _finite(value) or (value <= 0 if positive else value < 0):
            raise ModelLoadError(f"config field '{name}.{key}' must be a finite positive number, got {shown(value)}")
        return float(value)

    def original() -> int:
        value = source.get("original_max_position_embeddings", raw.get("original_max_position_embeddings"))
        if value is None:
            raise ModelLoadError(f"config field '{name}.original_max_position_embeddings' is missing (rope type "
                                 f"{kind!r} needs it)")
        return _positive(f"{name}.original_max_position_embeddings", value)

    if kind == "default":
        return RopeScaling()
    if kind == "linear":
        return RopeScaling("linear", factor=number("factor"))
    if kind == "llama3":
        low, high = number("low_freq_factor"), number("high_freq_factor")
        if high <= low:
            raise ModelLoadError(f"config field '{name}.high_freq_factor' ({high:g}) must exceed "
                                 f"'{name}.low_freq_factor' ({low:g})")
        return RopeScaling("llama3", factor=number("factor"), low_freq_factor=low, high_freq_factor=high,
                           original_max_position_embeddings=original())
    truncate = source.get("truncate", True)
    if not isinstance(truncate, bool):
        raise ModelLoadError(f"config field '{name}.truncate' must be true or false, got {shown(truncate)}")
    return RopeScaling("yarn", factor=number("factor", required=False), original_max_position_embeddings=original(),
                       beta_fast=number("beta_fast", required=False), beta_slow=number("beta_slow", required=False),
                       attention_factor=number("attention_factor", required=False),
                       mscale=number("mscale", required=False, positive=False),
                       mscale_all_dim=number("mscale_all_dim", required=False, positive=False), truncate=truncate)


def _experts(raw: dict, model_type: str, layers: int) -> dict:
    """The mixture-of-experts fields of Mixtral (every layer sparse, weights renormalised) and Qwen3-MoE
    (``decoder_sparse_step``, ``mlp_only_layers``, ``norm_topk_prob``); nothing for a dense family."""
    if model_type not in ("mixtral", "qwen3_moe"):
        return {}
    count = "num_local_experts" if model_type == "mixtral" or "num_experts" not in raw else "num_experts"
    experts, per_token = _int(raw, count), _int(raw, "num_experts_per_tok")
    if per_token > experts:
        raise ModelLoadError(f"config field 'num_experts_per_tok' = {per_token} exceeds {count} = {experts}")
    if model_type == "mixtral":
        return dict(num_experts=experts, num_experts_per_tok=per_token, norm_topk_prob=True,
                    moe_intermediate_size=_int(raw, "intermediate_size"), sparse_layers=tuple(range(layers)))
    step = _int(raw, "decoder_sparse_step", 1)
    dense = raw.get("mlp_only_layers") or []
    if not isinstance(dense, list) or not all(isinstance(i, int) and not isinstance(i, bool) for i in dense):
        raise ModelLoadError(f"config field 'mlp_only_layers' must be a list of layer indices, got {shown(dense)}")
    return dict(num_experts=experts, num_experts_per_tok=per_token, norm_topk_prob=_bool(raw, "norm_topk_prob"),
                moe_intermediate_size=_int(raw, "moe_intermediate_size"),
                sparse_layers=tuple(i for i in range(layers) if i not in dense and (i + 1) % step == 0))


# How each family's HF modeling code picks its sliding-window layers (transformers 5):
#   mistral, mixtral, phi3, qwen3_moe   every layer, when sliding_window is set (qwen3_moe: and use_sliding_window);
#                                       layer_types is ignored (Mistral warns about it)
#   qwen2, qwen3                        layer_types, else the layers from max_window_layers on, when
#                                       use_sliding_window (else there is no window at all)
#   gemma3_text                         layer_types, else every layer but each sliding_window_pattern-th (6)
#   llama                               none
# A layer i that slides sees keys j with i - window < j <= i (masking_utils.sliding_window_overlay).
LAYER_TYPES = ("full_attention", "sliding_attention")
DEFAULT_GEMMA_ROPE_THETA, DEFAULT_GEMMA_LOCAL_THETA = 1_000_000.0, 10_000.0  # Gemma3TextConfig.default_theta


def _sliding_window(raw: dict, model_type: str, layers: int) -> tuple[int | None, tuple[int, ...]]:
    """(window, the layers that slide) as the family's HF code decides them (above); every field checked."""
    window = raw.get("sliding_window", 4096 if model_type == "gemma3_text" else None)
    if model_type in ("mistral", "mixtral", "phi3", "qwen3_moe"):
        if model_type == "qwen3_moe" and not _bool(raw, "use_sliding_window"):
            return None, ()
        return (None, ()) if window is None else (_positive("sliding_window", window), tuple(range(layers)))
    if model_type not in ("qwen2", "qwen3", "gemma3_text"):
        return None, ()
    if model_type != "gemma3_text" and not _bool(raw, "use_sliding_window"):
        window = None  # (Qwen2Config: sliding_window = sliding_window if use_sliding_window else None)
        if raw.get("layer_types") is None:
            return None, ()
    sliding = tuple(i for i, kind in enumerate(_layer_types(raw, model_type, layers, window))
                    if kind == "sliding_attention")
    if sliding and window is None:
        why = "use_sliding_window is false" if model_type != "gemma3_text" else "sliding_window is null"
        raise ModelLoadError(f"config field 'layer_types' makes layer {sliding[0]} a sliding_attention layer, but "
                             f"{why}: there is no window for it")
    return (_positive("sliding_window", window), sliding) if sliding else (None, ())


def _layer_types(raw: dict, model_type: str, layers: int, window) -> list[str]:
    """config.json's layer_types (checked: one known kind per layer), else what the family's config derives."""
    kinds = raw.get("layer_types")
    if kinds is None:
        if model_type == "gemma3_text":
            pattern = _int(raw, "sliding_window_pattern", raw.get("_sliding_window_pattern", 6))
            return ["sliding_attention" if (i + 1) % pattern else "full_attention" for i in range(layers)]
        first = raw.get("max_window_layers", 28)
        if isinstance(first, bool) or not isinstance(first, int):
            raise ModelLoadError(f"config field 'max_window_layers' must be an integer, got {shown(first)}")
        return ["sliding_attention" if window is not None and i >= first else "full_attention" for i in range(layers)]
    if not isinstance(kinds, list) or not all(isinstance(k, str) for k in kinds):
        raise ModelLoadError(f"config field 'layer_types' must be a list of layer kinds, got {shown(kinds)}")
    if len(kinds) != layers:
        raise ModelLoadError(f"config field 'layer_types' names {len(kinds)} layers, but num_hidden_layers is {layers}")
    for i, kind in enumerate(kinds):
        if kind not in LAYER_TYPES:
            raise ModelLoadError(f"config field 'layer_types[{i}]' is {shown(kind)}; llaisys runs "
                                 f"{' and '.join(LAYER_TYPES)} layers")
    return kinds


def _check_activation(raw: dict, model_type: str) -> None:
    """The MLP gate's activation the family's model file computes: SiLU (hidden_act), or for Gemma 3 the tanh
    GELU (hidden_activation)."""
    if model_type == "gemma3_text":
        act = raw.get("hidden_activation", raw.get("hidden_act", "gelu_pytorch_tanh"))
        if act != "gelu_pytorch_tanh":
            raise ModelLoadError(f"config field 'hidden_activation' is {shown(act)}; Gemma 3 runs gelu_pytorch_tanh "
                                 f"(a GeGLU MLP with the tanh GELU)")
        return
    act = raw.get("hidden_act", "silu")
    if act not in ("silu", "swish"):
        raise ModelLoadError(f"hidden_act {shown(act)} is not supported (only silu / SwiGLU MLPs)")


def _gemma3(raw: dict) -> dict:
    """Gemma 3's own fields: the attention scale, the sliding layers' rope base; what it must not set."""
    for key in ("attn_logit_softcapping", "final_logit_softcapping"):
        if raw.get(key) is not None:
            raise ModelLoadError(f"config field {key!r} is {shown(raw[key])}: logit soft-capping (Gemma 2) is not "
                                 f"implemented; Gemma 3 sets it to null")
    if _bool(raw, "use_bidirectional_attention"):
        raise ModelLoadError("config field 'use_bidirectional_attention' is true (an embedding model, EmbeddingGemma): "
                             "llaisys runs causal language models")
    scalar = raw.get("query_pre_attn_scalar", 256)
    if not _finite(scalar) or scalar <= 0:
        raise ModelLoadError(f"config field 'query_pre_attn_scalar' must be a finite positive number, got {shown(scalar)}")
    return dict(query_pre_attn_scalar=float(scalar), rope_local_theta=_local_rope_theta(raw), sandwich_norms=True,
                norm_offset=1.0)


def _local_rope_theta(raw: dict) -> float:
    """The sliding layers' rope base: rope_parameters.sliding_attention (transformers >= 5, a plain rope), else
    rope_local_base_freq (older writers), else 10000."""
    params = raw.get("rope_parameters")
    local = params.get("sliding_attention") if isinstance(params, dict) else None
    if local is not None:
        if not isinstance(local, dict):
            raise ModelLoadError(f"config field 'rope_parameters.sliding_attention' must be an object, got {shown(local)}")
        kind = local.get("rope_type", "default")
        if kind not in (None, "default"):
            raise ModelLoadError(f"rope scaling of type {shown(kind)} (rope_parameters.sliding_attention.rope_type) "
                                 f"is not supported on the sliding layers (Gemma 3 scales the global layers' rope only)")
        theta, name = local.get("rope_theta", DEFAULT_GEMMA_LOCAL_THETA), "rope_parameters.sliding_attention.rope_theta"
    else:
        theta, name = raw.get("rope_local_base_freq", DEFAULT_GEMMA_LOCAL_THETA), "rope_local_base_freq"
    if not _finite(theta) or theta <= 0:
        raise ModelLoadError(f"config field {name!r} must be a finite positive number, got {shown(theta)}")
    return float(theta)
