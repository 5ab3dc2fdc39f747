"""A GGUF file's hyper-parameters as a ``ModelConfig``.

llama.cpp's converter writes ``config.json`` fields under its own keys, prefixed with the
architecture (``qwen2.block_count``, ...). They are translated back to the ``config.json``
names, so ``ModelConfig.from_dict`` checks them exactly as it checks a HuggingFace
directory; what a GGUF file says through its tensors instead (tied output, biases) is read
from the tensor table. Every size is bounded first (as llama.cpp bounds them), so a hostile
value costs nothing before the tensors are checked against it.

The keys every architecture has (block_count, rope.freq_base, ...) are read here; what a family's keys mean
(Gemma 3's rope.freq_base_swa, the experts of a mixture) is its GGUF rules' (``Family.gguf.config``), and
which family a file is, the registry's row of its general.architecture.
"""

from __future__ import annotations

import dataclasses

import numpy as np
from gguf import LlamaFileType

from ...errors import ModelLoadError, shown
from ...families.config import ModelConfig
from ...families.registry import GGUF_ARCHITECTURES, Row, gguf_row
from ...families.rope_scaling import RopeScaling
from .reader import GGUFFile

# config.json field <- GGUF key (after "{arch}."), and whether the file must have it
HYPERPARAMETERS = {
    "hidden_size": ("embedding_length", True),
    "intermediate_size": ("feed_forward_length", True),
    "num_hidden_layers": ("block_count", True),
    "num_attention_heads": ("attention.head_count", True),
    "num_key_value_heads": ("attention.head_count_kv", False),
    "head_dim": ("attention.key_length", False),
    "rms_norm_eps": ("attention.layer_norm_rms_epsilon", True),
    "rope_theta": ("rope.freq_base", False),
    "max_position_embeddings": ("context_length", True),
}
FLOAT_FIELDS = ("rms_norm_eps", "rope_theta")  # the others are sizes
MAX_LAYERS = 512  # llama.cpp's LLAMA_MAX_LAYERS
MAX_SIZE = 2 ** 32 - 1  # llama.cpp holds every size hyper-parameter in a uint32_t


class Metadata:
    """A GGUF file's metadata as a family's GGUF rules read it (families.family.GGUFMetadata): the keys of its
    general.architecture."""

    def __init__(self, f: GGUFFile, architecture: str) -> None:
        self.file, self.path, self.architecture = f, f.path, architecture

    def get(self, key: str, default: object = None) -> object:
        return self.file.metadata.get(f"{self.architecture}.{key}", default)

    def size(self, key: str) -> int:
        return _size(self.file, f"{self.architecture}.{key}", self.get(key))


def family_row(f: GGUFFile) -> Row:
    """The registry's row of the file's ``general.architecture``, if llaisys runs it (else a ModelLoadError
    naming it)."""
    arch = f.architecture
    row = gguf_row(Metadata(f, arch)) if isinstance(arch, str) else None
    if row is None:
        found = shown(arch) if arch is not None else "no general.architecture"
        raise ModelLoadError(f"{f.path}: GGUF architecture {found} is not supported; llaisys runs "
                             f"{', '.join(GGUF_ARCHITECTURES)}")
    return row


def model_config(f: GGUFFile) -> ModelConfig:
    row = family_row(f)
    family, rules, arch, meta = row.family, row.family.gguf, row.gguf, f.metadata
    assert rules is not None and arch is not None  # (gguf_row's rows have both)
    raw: dict = {"architectures": [row.architecture], "model_type": family.config.model_type, "hidden_act": "silu"}
    for field, (key, required) in HYPERPARAMETERS.items():
        value = meta.get(f"{arch}.{key}")
        if value is None:
            if required:
                raise ModelLoadError(f"{f.path}: metadata key {arch}.{key} ({field}) is missing")
            continue
        limit = MAX_LAYERS if field == "num_hidden_layers" else MAX_SIZE
        raw[field] = value if field in FLOAT_FIELDS else _size(f, f"{arch}.{key}", value, limit)
    _check_attention_and_rope(f, arch, raw, rules.latent_attention)
    rules.config(Metadata(f, arch), raw)

    embed = f.tensors.get("token_embd.weight")
    if embed is None:
        raise ModelLoadError(f"{f.path}: tensor 'token_embd.weight' is missing")
    raw["vocab_size"] = _size(f, f"{arch}.vocab_size", meta.get(f"{arch}.vocab_size", embed.shape[0]))
    raw["tie_word_embeddings"] = "output.weight" not in f.tensors
    raw["eos_token_id"] = eos_token_ids(f)
    raw["bos_token_id"] = meta.get("tokenizer.ggml.bos_token_id")
    try:
        config = family.read_config(raw, row.architecture)
    except ModelLoadError as e:
        raise ModelLoadError(f"{f.path}: {e}") from None
    if "rope_freqs.weight" in f.tensors:
        config = dataclasses.replace(config, rope_scaling=_freq_factors(f, config.head_dim))
    window, sliding = _sliding_window(f, arch, config.num_hidden_layers, rules.window_pattern)
    config = dataclasses.replace(config, sliding_window=window, sliding_layers=sliding)
    # biases are whatever tensors the file has (the layer-0 set is required of every layer)
    return dataclasses.replace(
        config,
        qkv_bias="blk.0.attn_q.bias" in f.tensors,
        o_bias="blk.0.attn_output.bias" in f.tensors,
        mlp_bias="blk.0.ffn_gate.bias" in f.tensors,
        dtype_name=_file_type(meta.get("general.file_type")),
    )


def _sliding_window(f: GGUFFile, arch: str, layers: int, default_pattern: int) -> tuple[int | None, tuple[int, ...]]:
    """The window of {arch}.attention.sliding_window (0 or absent: none) and the layers it applies to, as
    llama.cpp reads them: {arch}.attention.sliding_window_pattern, a bool per layer or an int n (layer i slides
    unless i % n == n - 1; n = 0: every layer), by default the family's (gemma3: 6, its converter writes no
    pattern) and every layer for the others (Phi-3, and Mistral as "llama": HF windows their every layer;
    llama.cpp turns Phi-3's window off, see docs/design/loading.md)."""
    meta = f.metadata
    key = f"{arch}.attention.sliding_window"
    window = meta.get(key, 0)
    if window == 0:
        return None, ()
    window = _size(f, key, window)
    key = f"{arch}.attention.sliding_window_pattern"
    pattern = meta.get(key, default_pattern)
    if isinstance(pattern, list):
        if len(pattern) != layers or not all(isinstance(p, bool) for p in pattern):
            raise ModelLoadError(f"{f.path}: metadata key {key} must hold one true/false per layer ({layers}), got "
                                 f"{shown(pattern)}")
        return window, tuple(i for i, sliding in enumerate(pattern) if sliding)
    if isinstance(pattern, bool) or not isinstance(pattern, int) or pattern < 0:
        raise ModelLoadError(f"{f.path}: metadata key {key} must be a layer count or a list of true/false, got "
                             f"{shown(pattern)}")
    return window, tuple(i for i in range(layers) if pattern == 0 or i % pattern < pattern - 1)


def _size(f: GGUFFile, key: str, value: object, limit: int = MAX_SIZE) -> int:
    """A size hyper-parameter: an integer in [1, limit]."""
    if isinstance(value, list):
        raise ModelLoadError(f"{f.path}: {key} varies per layer ({shown(value)}), which llaisys does not support")
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= limit:
        raise ModelLoadError(f"{f.path}: metadata key {key} must be an integer in [1, {limit}], got {shown(value)}")
    return value


def _check_attention_and_rope(f: GGUFFile, arch: str, raw: dict, latent: bool = False) -> None:
    """Refuse what the decoder does not compute: a value width other than the key width, a
    partial rotary dimension (neither checked for ``latent`` attention, whose sizes these keys are: the family's
    GGUF rules read them), a rope scaling one table cannot hold; translate the others to config.json's
    rope_scaling (llama3's rope_freqs.weight is read by model_config)."""
    meta = f.metadata
    head_dim = raw.get("head_dim") or raw["hidden_size"] // raw["num_attention_heads"]
    value_dim = meta.get(f"{arch}.attention.value_length", head_dim)
    if value_dim != head_dim and not latent:
        raise ModelLoadError(f"{f.path}: value head size {shown(value_dim)} differs from key head size {head_dim}, "
                             f"which llaisys does not support")
    rope_dims = meta.get(f"{arch}.rope.dimension_count", head_dim)
    if rope_dims != head_dim and not latent:
        raise ModelLoadError(f"{f.path}: rope covers {shown(rope_dims)} of {head_dim} head dimensions; llaisys "
                             f"supports full rotary embeddings only")
    for name in ("rope_factors_long.weight", "rope_factors_short.weight"):
        if name in f.tensors:
            raise ModelLoadError(f"{f.path}: rope scaling of type 'longrope' ({name}) is not supported: its "
                                 f"frequencies change with the sequence length")
    scaling = meta.get(f"{arch}.rope.scaling.type", "none")
    factor = meta.get(f"{arch}.rope.scaling.factor", 1.0)
    if scaling == "none" or factor in (0.0, 1.0) or "rope_freqs.weight" in f.tensors:
        return  # (a llama3 file's table is rope_freqs.weight: model_config reads it)
    if scaling not in ("linear", "yarn"):
        raise ModelLoadError(f"{f.path}: rope scaling of type {shown(scaling)} ({arch}.rope.scaling.type) is not "
                             f"supported (llaisys runs linear, yarn and llama3's rope_freqs.weight)")
    rope = {"rope_type": scaling, "factor": factor}
    if scaling == "yarn":  # config.py checks each value (named as config.json names them)
        rope["original_max_position_embeddings"] = meta.get(f"{arch}.rope.scaling.original_context_length")
        for key in ("beta_fast", "beta_slow"):
            if f"{arch}.rope.scaling.yarn_{key}" in meta:
                rope[key] = meta[f"{arch}.rope.scaling.yarn_{key}"]
    raw["rope_scaling"] = rope


def _freq_factors(f: GGUFFile, head_dim: int) -> RopeScaling:
    """llama3's rope as llama.cpp stores it: rope_freqs.weight, F32 [head_dim / 2], a divisor per frequency."""
    info = f.tensors["rope_freqs.weight"]
    if info.shape != (head_dim // 2,) or info.type.name != "F32":
        raise ModelLoadError(f"{f.path}: tensor 'rope_freqs.weight' is {info.type.name} {info.shape}; llaisys reads "
                             f"rope frequency factors as F32 ({head_dim // 2},)")
    factors = f.raw("rope_freqs.weight").view(np.float32).reshape(-1)
    if not (np.isfinite(factors).all() and (factors > 0).all()):
        raise ModelLoadError(f"{f.path}: tensor 'rope_freqs.weight' holds factors that are not finite and positive")
    return RopeScaling("freq_factors", freq_factors=tuple(float(x) for x in factors))


def eos_token_ids(f: GGUFFile) -> list[int]:
    """The ids that end generation: EOS, and end-of-turn / end-of-message where the file names them
    (llama.cpp stops at all of these)."""
    ids = []
    for key in ("eos_token_id", "eot_token_id", "eom_token_id"):
        value = f.metadata.get(f"tokenizer.ggml.{key}")
        if isinstance(value, int) and not isinstance(value, bool) and value not in ids:
            ids.append(value)
    return ids


def _file_type(value: object) -> str | None:
    """general.file_type as llama.cpp names it ("MOSTLY_Q4_K_M", ...), for information."""
    if value is None:
        return None
    name = next((t.name for t in LlamaFileType if t.value == value), None)  # (as LlamaFileType(value) finds it)
    return name if name is not None else shown(value)
