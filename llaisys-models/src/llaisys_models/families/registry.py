"""Which family runs which checkpoint: one row per family, named as HuggingFace's config.json
(``architectures``) and llama.cpp's GGUF files (``general.architecture``) name it, pointing at the family's
module (its ``FAMILY``: family.py says what a family declares).

A new family is its module plus one row here (docs/guides/adding-a-family.md).
"""

from __future__ import annotations

import dataclasses
from types import ModuleType

from ..errors import ModelLoadError, shown
from . import deepseek_v2, deepseek_v3, gemma3, llama, mistral, mixtral, olmo2, phi3, qwen2, qwen3, qwen3_moe
from .causal_lm import CausalLM
from .config import ModelConfig, architectures
from .family import Family, GGUFMetadata


@dataclasses.dataclass(frozen=True)
class Row:
    architecture: str  # config.json's "architectures" name
    gguf: str | None  # general.architecture (None: llama.cpp writes the family as another, or not at all)
    module: ModuleType  # the family's file: its FAMILY

    @property
    def family(self) -> Family:
        return self.module.FAMILY


ROWS = [Row(*row) for row in [
    #  HF architecture         GGUF architecture   family module
    ("Qwen2ForCausalLM",       "qwen2",            qwen2),
    ("LlamaForCausalLM",       "llama",            llama),
    ("Qwen3ForCausalLM",       "qwen3",            qwen3),
    ("MistralForCausalLM",     None,               mistral),  # llama.cpp: "llama"
    ("Phi3ForCausalLM",        "phi3",             phi3),
    ("MixtralForCausalLM",     "llama",            mixtral),  # "llama" with llama.expert_count (mixtral.py)
    ("Qwen3MoeForCausalLM",    "qwen3moe",         qwen3_moe),
    ("Gemma3ForCausalLM",      "gemma3",           gemma3),
    ("Olmo2ForCausalLM",       "olmo2",            olmo2),
    ("DeepseekV2ForCausalLM",  "deepseek2",        deepseek_v2),  # "deepseek2" but sigmoid scores (deepseek_v2.py)
    ("DeepseekV3ForCausalLM",  "deepseek2",        deepseek_v3),  # "deepseek2" with expert_gating_func 2 (sigmoid)
]]

FAMILIES: dict[str, Family] = {row.architecture: row.family for row in ROWS}
MODEL_CLASSES: dict[str, type[CausalLM]] = {row.architecture: row.family.model for row in ROWS}
GGUF_ARCHITECTURES = sorted({row.gguf for row in ROWS if row.gguf is not None})
# the architecture config.json means when it lists none: its model_type's family
_BY_MODEL_TYPE = {row.family.config.model_type: row.architecture for row in ROWS}
# architectures of a known family that llaisys does not run, and why
REFUSED = {name: why for row in ROWS for name, why in row.family.refused.items()}


def architecture(raw: dict) -> str:
    """The class name a config.json names (the first of ``architectures``, else the one its ``model_type``
    implies; "" for neither)."""
    names = architectures(raw)
    return names[0] if names else _BY_MODEL_TYPE.get(raw.get("model_type", ""), "")


def read_config(raw: dict) -> ModelConfig:
    """config.json's object as its family reads it; a config of another architecture is refused as such before
    its fields are read (GPT-2 has none of Llama's)."""
    arch = architecture(raw)
    family = FAMILIES.get(arch)
    if family is None:
        if arch in REFUSED:
            raise ModelLoadError(f"architecture {arch!r} {REFUSED[arch]}")
        named = repr(arch) if arch else f"(none; model_type {shown(raw.get('model_type'))})"
        raise ModelLoadError(f"architecture {named} is not supported; llaisys_models runs {', '.join(sorted(FAMILIES))}")
    return family.read_config(raw, arch)


def gguf_row(meta: GGUFMetadata) -> Row | None:
    """The row of a GGUF file's general.architecture (``meta.architecture``): of the families written under that
    name, the one whose GGUF rules claim the file (Mixtral: "llama" with experts), else the one that claims none."""
    rules = {row: row.family.gguf for row in ROWS if row.gguf == meta.architecture}
    claimers = [row for row, gguf in rules.items() if gguf is not None and gguf.claims is not None and gguf.claims(meta)]
    others = [row for row, gguf in rules.items() if gguf is not None and gguf.claims is None]
    return next(iter(claimers or others), None)
