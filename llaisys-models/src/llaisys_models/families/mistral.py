"""Mistral: Llama (llama.py) with an explicit head_dim and, when config.json sets one, a sliding window on every
layer (MistralConfig: layer_types is ignored). llama.cpp's converter writes it as "llama", without the window:
its GGUF files read as Llama's."""

from __future__ import annotations

from .config import ConfigRules, every_layer_window
from .family import Family
from .llama import Llama

FAMILY = Family(model=Llama, config=ConfigRules("mistral", every_layer_window), gguf=None)
