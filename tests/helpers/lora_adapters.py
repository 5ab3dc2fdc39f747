"""PEFT LoRA adapters for the tiny checkpoints (tiny_models.py), and HF PeftModel's greedy references.

An adapter is made with ``peft`` itself (``init_lora_weights=False``: A and B random, so the adapter changes the
output) and saved with ``save_pretrained``, as a user's fine-tune would be. Its reference is HF's ``PeftModel``
over the base checkpoint: greedy tokens and logits, and the same in float64 (the near-tie rule, DESIGN §6).
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import torch

from helpers.tiny_models import TinyModels, greedy_reference

ALL = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


@dataclasses.dataclass(frozen=True)
class AdapterSpec:
    r: int = 8
    alpha: float = 16.0
    targets: tuple[str, ...] = ALL
    rslora: bool = False
    rank_pattern: dict | None = None
    alpha_pattern: dict | None = None
    seed: int = 0
    magnitude: float = 1.0  # A and B scaled so: the adapter moves the logits about as much as the base's spread


ADAPTERS = {
    "all_r8": AdapterSpec(r=8, alpha=16, seed=1),
    "qv_r16_rslora": AdapterSpec(r=16, alpha=32, targets=("q_proj", "v_proj"), rslora=True, seed=2),
    "patterns": AdapterSpec(r=8, alpha=8, targets=("q_proj", "k_proj", "o_proj", "down_proj"),
                            rank_pattern={"o_proj": 4}, alpha_pattern={"down_proj": 24}, seed=3),
}


def make_adapter(base_dir: Path, out_dir: Path, spec: AdapterSpec) -> Path:
    """Train nothing: a PEFT LoRA adapter of ``spec`` over the checkpoint in ``base_dir``, saved to ``out_dir``."""
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    base = AutoModelForCausalLM.from_pretrained(base_dir, dtype=torch.float32)
    config = LoraConfig(r=spec.r, lora_alpha=spec.alpha, target_modules=list(spec.targets), use_rslora=spec.rslora,
                        rank_pattern=spec.rank_pattern or {}, alpha_pattern=spec.alpha_pattern or {},
                        init_lora_weights=False, lora_dropout=0.0, task_type="CAUSAL_LM")
    torch.manual_seed(spec.seed)
    model = get_peft_model(base, config)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "lora_" in name:
                p.mul_(spec.magnitude)
    model.save_pretrained(out_dir)
    return out_dir


class TinyAdapters:
    """Adapters over the tiny checkpoints and their PeftModel references, made on first use."""

    def __init__(self, models: TinyModels, root: Path):
        self.models, self.root = models, root
        self._paths: dict[tuple[str, str], Path] = {}
        self._refs: dict[tuple, object] = {}

    def path(self, base: str, adapter: str) -> Path:
        key = (base, adapter)
        if key not in self._paths:
            self._paths[key] = make_adapter(self.models.path(base), self.root / f"{base}-{adapter}", ADAPTERS[adapter])
        return self._paths[key]

    def peft_model(self, base: str, adapter: str, dtype: torch.dtype):
        from peft import PeftModel
        from transformers import AutoModelForCausalLM

        hf = AutoModelForCausalLM.from_pretrained(self.models.path(base), dtype=dtype).eval()
        return PeftModel.from_pretrained(hf, self.path(base, adapter)).eval()

    def reference(self, base: str, adapter: str, prompt: list[int]):
        """HF PeftModel's greedy tokens and logits after ``prompt`` (and the float64 logits), in the base's dtype."""
        key = (base, adapter, tuple(prompt))
        if key not in self._refs:
            from helpers.tiny_models import ALL_SPECS, TORCH_DTYPES

            dtype = TORCH_DTYPES[ALL_SPECS[base].dtype]
            self._refs[key] = greedy_reference(self.peft_model(base, adapter, dtype),
                                               lambda: self.peft_model(base, adapter, torch.float64), prompt)
        return self._refs[key]


class UnderAdapter:
    """A model seen through one of its adapters, as helpers.parity_rule drives a model (logits, generate)."""

    def __init__(self, model, name: str | None):
        self.model, self.name = model, name

    def logits(self, ids):
        return self.model.logits(ids, lora=self.name)

    def generate(self, ids, n, **kwargs):
        return self.model.generate(ids, n, lora=self.name, **kwargs)
