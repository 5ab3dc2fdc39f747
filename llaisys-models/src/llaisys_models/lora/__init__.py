"""LoRA adapters beside a model's base weights: reading them (peft.py, gguf.py), placing them in device slots
(slots.py) and the model's API (model.py: ``load_lora``, ``generate(..., lora=name)``, ``merge_lora``)."""

from .adapter import LoRAAdapter, LoRAPair
from .model import MAX_LORA_RANK, MAX_LORAS

__all__ = ["LoRAAdapter", "LoRAPair", "MAX_LORAS", "MAX_LORA_RANK"]
