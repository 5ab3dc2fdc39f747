"""What every rank loads: the same model, options and dtype, each on its own device and with its own part."""

from __future__ import annotations

import dataclasses

import llaisys

from ..families.causal_lm import CausalLM
from ..loading import loader
from .layout import Layout


@dataclasses.dataclass(frozen=True)
class LoadOptions:
    path: str  # a HuggingFace directory or a GGUF file (a Hub id is resolved on rank 0 first)
    device_type: str  # "cpu", "cuda", ...: rank r runs on <type>:<first_index + r> (the CPU: every rank on cpu)
    first_index: int
    dtype: str | None
    numerics: str | None
    quantize: str | None

    def device(self, rank: int) -> str:
        return "cpu" if self.device_type == "cpu" else f"{self.device_type}:{self.first_index + rank}"

    def load(self, layout: Layout, group: llaisys.distributed.Group, progress: bool | None = False,
             device: str | None = None) -> CausalLM:
        """This rank's model: its part of the weights (``layout``), its collectives through ``group``, on
        ``device`` (default: ``self.device(layout.rank)``)."""
        return loader.load(self.path, device or self.device(layout.rank), self.dtype, progress=progress,
                           numerics=self.numerics, quantize=self.quantize, layout=layout, group=group)
