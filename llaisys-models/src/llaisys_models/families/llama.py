"""Llama (Llama 2, Llama 3.x): the Qwen2 decoder (qwen2.py) with the biases ``attention_bias`` / ``mlp_bias`` say
(all four attention biases or none) and no sliding window. llama.cpp's converter permutes its Q/K rows
(and writes Mistral and Mixtral as "llama" too: mistral.py, mixtral.py)."""

from __future__ import annotations

from .config import ConfigRules
from .family import GGUF, Family
from .qwen2 import Qwen2


class Llama(Qwen2):
    """Llama-architecture checkpoints (Llama 2, 3.x, and Mistral: Llama with an explicit head_dim): the same
    decoder, biases as ``attention_bias`` / ``mlp_bias`` say."""


FAMILY = Family(model=Llama, config=ConfigRules("llama"), gguf=GGUF(permuted_qk=True))
