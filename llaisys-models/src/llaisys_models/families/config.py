"""The model's shape and hyper-parameters (``ModelConfig``), read from a HuggingFace ``config.json``.

Writers differ: transformers >= 5 nests ``rope_theta`` under ``rope_parameters``
(sometimes once more per layer type), older files keep ``rope_theta`` (and
``rope_scaling``) at top level; ``head_dim`` and ``num_key_value_heads`` may be
absent; ``eos_token_id`` may be an int, a list or missing. Every form is read here,
and anything the forward pass cannot honour is refused with a message naming it.

What a family's own configuration class adds (Qwen2's biases, Gemma 3's norms and windows, the experts of a
mixture) is the family's ``ConfigRules``, declared in its file (qwen2.py, gemma3.py, ...) from the readers
below; ``registry.read_config`` finds a config's family by its architecture. ``ModelConfig.from_dict(raw)``
alone reads the fields every decoder has, as Llama's configuration reads them.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Mapping

from ..errors import ModelLoadError, shown
from .rope_scaling import SUPPORTED as ROPE_TYPES
from .rope_scaling import RopeScaling

DEFAULT_ROPE_THETA = 10000.0
MAX_LAYERS = 1 << 20  # a bound for corrupt counts (the largest models have ~130 layers)
LAYER_TYPES = ("full_attention", "sliding_attention")


def check_silu(raw: dict) -> None:
    """The MLP gate's activation of the Llama-style decoder: SiLU (SwiGLU), as config.json's hidden_act says."""
    act = raw.get("hidden_act", "silu")
    if act not in ("silu", "swish"):
        raise ModelLoadError(f"hidden_act {shown(act)} is not supported (only silu / SwiGLU MLPs)")


def _no_fields(raw: dict, layers: int) -> dict:
    return {}


@dataclasses.dataclass(frozen=True)
class ConfigRules:
    """How a family's HF configuration class reads config.json beyond the fields every decoder has."""

    model_type: str  # config.json's model_type (it names the architecture where "architectures" is absent)
    # config.json (and its layer count) -> the ModelConfig fields the family sets: its biases, sliding windows,
    # norms, experts... (over the decoder's defaults: Llama's attention_bias / mlp_bias, no window)
    fields: Callable[[dict, int], dict] = _no_fields
    # the configuration class's defaults where config.json is silent and they differ from Llama's: any of
    # rope_theta, rms_norm_eps, max_position_embeddings, tie_word_embeddings
    defaults: Mapping[str, float | int | bool] = dataclasses.field(default_factory=dict)
    activation: Callable[[dict], None] = check_silu  # refuses an MLP activation the family's forward does not compute


DECODER = ConfigRules("")  # the fields every decoder has, read as Llama's configuration reads them


@dataclasses.dataclass(frozen=True)
class LatentAttention:
    """Multi-head latent attention (DeepSeek-V2 / V3, deepseek.py): q through a low-rank pair (``q_lora_rank``;
    0: one projection), keys and values through one latent of ``kv_lora_rank`` values beside a rope key of
    ``qk_rope_head_dim`` values that every head shares; per head ``qk_nope_head_dim`` + ``qk_rope_head_dim`` query
    / key values and ``v_head_dim`` values. ``rope_interleaved``: the rope dims are pairs (x0, x1), (x2, x3)..."""
    q_lora_rank: int
    kv_lora_rank: int
    qk_nope_head_dim: int
    qk_rope_head_dim: int
    v_head_dim: int
    rope_interleaved: bool = True


@dataclasses.dataclass(frozen=True)
class GroupedRouting:
    """DeepSeek's router (llaisys.ops.moe_router_grouped): ``scoring`` "softmax" (V2) or "sigmoid" (V3, with the
    e_score_correction_bias when ``corrected``), the experts in ``n_group`` groups of which the ``topk_group``
    whose ``group_top`` best scores sum highest are eligible, weights normalised or not, times ``route_scale``."""
    scoring: str
    n_group: int
    topk_group: int
    group_top: int
    route_scale: float
    corrected: bool


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
    qk_norm_all_heads: bool = False  # OLMo 2: ... one RMSNorm over all of q's heads (k's) at once, weights [q_size]
    fused_projections: bool = False  # Phi-3: q/k/v in one qkv_proj, gate/up in one gate_up_proj (its tensors)
    query_pre_attn_scalar: float | None = None  # Gemma: attention scores times query_pre_attn_scalar^-1/2
    sandwich_norms: bool = False  # Gemma, OLMo 2: RMSNorms of the attention's and the MLP's outputs (Gemma: too)
    norm_offset: float = 0.0  # Gemma: every RMSNorm multiplies by norm_offset + w (1 + w, kept in f32)
    # Gemma, OLMo 2: the RMSNorm weights are kept in float32 (the loaders add norm_offset): the norm then computes
    # x * r * w in f32 and rounds once, as HF's Gemma3RMSNorm / Olmo2RMSNorm do
    norms_in_f32: bool = False
    dtype_name: str | None = None  # "bfloat16", ... as the writer declared it (informative)
    # mixture of experts (Mixtral, Qwen3-MoE; 0 experts: a dense model): the layers whose MLP is num_experts
    # experts of moe_intermediate_size of which a router picks num_experts_per_tok per token, their weights
    # renormalised to sum 1 when norm_topk_prob
    num_experts: int = 0
    num_experts_per_tok: int = 0
    moe_intermediate_size: int = 0
    norm_topk_prob: bool = False
    sparse_layers: tuple[int, ...] = ()
    # DeepSeek (deepseek.py): latent attention, its router, and the shared experts' MLP width beside the routed
    # experts (0: none)
    mla: LatentAttention | None = None
    routing: GroupedRouting | None = None
    shared_expert_size: int = 0
    num_nextn_predict_layers: int = 0  # DeepSeek-V3's multi-token-prediction modules (after the layers)

    @classmethod
    def from_dict(cls, raw: dict, rules: ConfigRules = DECODER, architecture: str | None = None) -> ModelConfig:
        """The config of ``raw`` (config.json's object) as the family of ``rules`` reads it (default: the fields
        every decoder has, as Llama's configuration reads them); ``architecture`` (default: the first of
        "architectures", else "") names its class."""
        model_type = raw.get("model_type", "")
        names = architectures(raw)
        architecture = (names[0] if names else "") if architecture is None else architecture
        defaults = rules.defaults

        hidden = integer(raw, "hidden_size")
        heads = integer(raw, "num_attention_heads")
        kv_heads = integer(raw, "num_key_value_heads", heads)
        head_dim = raw.get("head_dim")
        if head_dim is None:
            if hidden % heads:
                raise ModelLoadError(f"hidden_size {hidden} is not a multiple of num_attention_heads {heads} "
                                     f"and head_dim is not given")
            head_dim = hidden // heads
        head_dim = positive("head_dim", head_dim)
        if heads % kv_heads:
            raise ModelLoadError(f"num_attention_heads {heads} is not a multiple of num_key_value_heads {kv_heads}")
        if head_dim % 2:
            raise ModelLoadError(f"head_dim {head_dim} must be even for rotary embeddings")
        rope_theta, rope_scaling = _rope(raw, float(defaults.get("rope_theta", DEFAULT_ROPE_THETA)))
        layers = integer(raw, "num_hidden_layers")
        if layers > MAX_LAYERS:  # (the per-layer lists below would be built before the checkpoint is counted)
            raise ModelLoadError(f"config field 'num_hidden_layers' = {layers} is more than llaisys runs ({MAX_LAYERS})")
        rules.activation(raw)
        attention_bias = flag(raw, "attention_bias")
        fields = dict(
            architecture=architecture,
            model_type=model_type,
            vocab_size=integer(raw, "vocab_size"),
            hidden_size=hidden,
            intermediate_size=integer(raw, "intermediate_size"),
            num_hidden_layers=layers,
            num_attention_heads=heads,
            num_key_value_heads=kv_heads,
            head_dim=head_dim,
            rms_norm_eps=number(raw, "rms_norm_eps", defaults.get("rms_norm_eps", 1e-6)),
            rope_theta=rope_theta,
            rope_scaling=rope_scaling,
            max_position_embeddings=integer(raw, "max_position_embeddings",
                                            defaults.get("max_position_embeddings", 32768)),
            tie_word_embeddings=flag(raw, "tie_word_embeddings", bool(defaults.get("tie_word_embeddings", False))),
            eos_token_ids=token_ids(raw.get("eos_token_id"), "eos_token_id"),
            bos_token_id=(token_ids(raw.get("bos_token_id"), "bos_token_id") or (None,))[0],
            qkv_bias=attention_bias,  # (Llama: all four attention biases or none)
            o_bias=attention_bias,
            mlp_bias=flag(raw, "mlp_bias"),
            dtype_name=next((d for d in (raw.get("dtype"), raw.get("torch_dtype")) if isinstance(d, str)), None),
        )
        fields.update(rules.fields(raw, layers))
        return cls(**fields)

    @property
    def q_size(self) -> int:
        return self.num_attention_heads * self.head_dim

    @property
    def attention_scale(self) -> float:
        """What q . k is multiplied by: 1 / sqrt(head_dim), or Gemma's 1 / sqrt(query_pre_attn_scalar)."""
        return (self.query_pre_attn_scalar or self.head_dim) ** -0.5

    def window(self, layer: int) -> int:
        """Layer ``layer``'s sliding window: it sees its last ``window`` positions (0: all of them)."""
        return self.sliding_window if layer in self.sliding_layers and self.sliding_window else 0

    @property
    def kv_size(self) -> int:
        return self.num_key_value_heads * self.head_dim


def architectures(raw: dict) -> list[str]:
    """The class names config.json's "architectures" lists (checked, as is its model_type: a string)."""
    names = raw.get("architectures")
    if names is None:
        names = []
    elif isinstance(names, str):
        names = [names]
    if not isinstance(names, list) or not all(isinstance(a, str) for a in names):
        raise ModelLoadError(f"config field 'architectures' must be a list of class names, got {shown(names)}")
    model_type = raw.get("model_type", "")
    if not isinstance(model_type, str):
        raise ModelLoadError(f"config field 'model_type' must be a string, got {shown(model_type)}")
    return names


def token_ids(value: object, name: str) -> tuple[int, ...]:
    """An id, a list of ids or None -> a tuple of ids."""
    if value is None:
        return ()
    values = value if isinstance(value, (list, tuple)) else [value]
    for v in values:
        if isinstance(v, bool) or not isinstance(v, int) or v < 0:
            raise ModelLoadError(f"{name} must be a token id or a list of them, got {shown(value)}")
    return tuple(values)


# -- readers of one field (a family's rules read theirs with these) -----------------------------------------

def integer(raw: dict, key: str, default: object = None) -> int:
    """A positive integer field (``default`` where it is absent; missing and no default: an error)."""
    value = raw.get(key, default)
    if value is None:
        raise ModelLoadError(f"config field {key!r} is missing")
    return positive(key, value)


def positive(key: str, value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise ModelLoadError(f"config field {key!r} must be a positive integer, got {shown(value)}")
    return value


def number(raw: dict, key: str, default: object) -> float:
    """A finite non-negative number field."""
    value = raw.get(key, default)
    if not finite(value) or value < 0:
        raise ModelLoadError(f"config field {key!r} must be a finite non-negative number, got {shown(value)}")
    return float(value)


def finite(value: object) -> bool:
    """A JSON number that is finite (JSON files may hold Infinity and NaN; json reads them)."""
    return not isinstance(value, bool) and isinstance(value, (int, float)) and math.isfinite(value)


def flag(raw: dict, key: str, default: bool = False) -> bool:
    """A true/false field; a string such as "false" is refused rather than read as true."""
    value = raw.get(key, default)
    if value is None:
        return default
    if not isinstance(value, bool):
        raise ModelLoadError(f"config field {key!r} must be true or false, got {shown(value)}")
    return value


# -- sliding windows, as families' HF modeling code picks the layers that slide ---------------------------------
# A layer i that slides sees keys j with i - window < j <= i (transformers' masking_utils.sliding_window_overlay).

def every_layer_window(raw: dict, layers: int) -> dict:
    """Every layer slides when config.json sets a sliding_window (Mistral, Mixtral, Phi-3; layer_types is
    ignored, as HF ignores it)."""
    window = raw.get("sliding_window")
    if window is None:
        return {}
    return dict(sliding_window=positive("sliding_window", window), sliding_layers=tuple(range(layers)))


def layer_windows(raw: dict, layers: int, window: object, derived: Callable[[], list[str]], why: str) -> dict:
    """The layers config.json's layer_types make sliding_attention (checked: one known kind per layer), else
    those of ``derived()`` (the family's own rule), each seeing its last ``window`` positions; ``why`` says why
    ``window`` may be None (named when a layer slides without one)."""
    kinds = raw.get("layer_types")
    if kinds is None:
        kinds = derived()
    elif not isinstance(kinds, list) or not all(isinstance(k, str) for k in kinds):
        raise ModelLoadError(f"config field 'layer_types' must be a list of layer kinds, got {shown(kinds)}")
    elif len(kinds) != layers:
        raise ModelLoadError(f"config field 'layer_types' names {len(kinds)} layers, but num_hidden_layers is {layers}")
    for i, kind in enumerate(kinds):
        if kind not in LAYER_TYPES:
            raise ModelLoadError(f"config field 'layer_types[{i}]' is {shown(kind)}; llaisys runs "
                                 f"{' and '.join(LAYER_TYPES)} layers")
    sliding = tuple(i for i, kind in enumerate(kinds) if kind == "sliding_attention")
    if not sliding:
        return {}
    if window is None:
        raise ModelLoadError(f"config field 'layer_types' makes layer {sliding[0]} a sliding_attention layer, but "
                             f"{why}: there is no window for it")
    return dict(sliding_window=positive("sliding_window", window), sliding_layers=sliding)


# -- rope ------------------------------------------------------------------------------------------------------

def _rope(raw: dict, default_theta: float) -> tuple[float, RopeScaling]:
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
    if not finite(theta) or theta <= 0:
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

    def optional(key: str, above_zero: bool = True) -> float | None:
        value = source.get(key)
        if value is None:
            return None
        if not finite(value) or (value <= 0 if above_zero else value < 0):
            raise ModelLoadError(f"config field '{name}.{key}' must be a finite positive number, got {shown(value)}")
        return float(value)

    def parameter(key: str) -> float:
        value = optional(key)
        if value is None:
            raise ModelLoadError(f"config field '{name}.{key}' is missing (rope type {kind!r} needs it)")
        return value

    def original() -> int:
        value = source.get("original_max_position_embeddings", raw.get("original_max_position_embeddings"))
        if value is None:
            raise ModelLoadError(f"config field '{name}.original_max_position_embeddings' is missing (rope type "
                                 f"{kind!r} needs it)")
        return positive(f"{name}.original_max_position_embeddings", value)

    if kind == "default":
        return RopeScaling()
    if kind == "linear":
        return RopeScaling("linear", factor=parameter("factor"))
    if kind == "llama3":
        low, high = parameter("low_freq_factor"), parameter("high_freq_factor")
        if high <= low:
            raise ModelLoadError(f"config field '{name}.high_freq_factor' ({high:g}) must exceed "
                                 f"'{name}.low_freq_factor' ({low:g})")
        return RopeScaling("llama3", factor=parameter("factor"), low_freq_factor=low, high_freq_factor=high,
                           original_max_position_embeddings=original())
    truncate = source.get("truncate", True)
    if not isinstance(truncate, bool):
        raise ModelLoadError(f"config field '{name}.truncate' must be true or false, got {shown(truncate)}")
    return RopeScaling("yarn", factor=optional("factor"), original_max_position_embeddings=original(),
                       beta_fast=optional("beta_fast"), beta_slow=optional("beta_slow"),
                       attention_factor=optional("attention_factor"), mscale=optional("mscale", above_zero=False),
                       mscale_all_dim=optional("mscale_all_dim", above_zero=False), truncate=truncate)
