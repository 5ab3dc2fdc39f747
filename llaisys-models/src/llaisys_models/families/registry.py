"""Which model class runs which architecture: one row per family, named as HuggingFace's config.json
(``architectures``) and llama.cpp's GGUF files (``general.architecture``) name it.

A new family is a model file (or a declared variation of a shared decoder) plus one row here.
"""

from __future__ import annotations

from .gemma3 import Gemma3
from .moe import Mixtral, Qwen3Moe
from .qwen2 import Llama, Phi3, Qwen2, Qwen3

#  HF architecture          GGUF architecture  model class   (None: llama.cpp writes the family as another)
FAMILIES = [
    ("Qwen2ForCausalLM",    "qwen2",           Qwen2),
    ("LlamaForCausalLM",    "llama",           Llama),
    ("Qwen3ForCausalLM",    "qwen3",           Qwen3),
    ("MistralForCausalLM",  None,              Llama),  # llama.cpp: "llama"
    ("Phi3ForCausalLM",     "phi3",            Phi3),
    ("MixtralForCausalLM",  None,              Mixtral),  # llama.cpp: "llama" with llama.expert_count (gguf/)
    ("Qwen3MoeForCausalLM", "qwen3moe",        Qwen3Moe),
    ("Gemma3ForCausalLM",   "gemma3",          Gemma3),
]

MODEL_CLASSES = {hf: cls for hf, _, cls in FAMILIES}
