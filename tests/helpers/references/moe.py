"""Mixture-of-experts test inputs: distinct experts per row, and a tensor's bits."""

from __future__ import annotations

import torch


def bits(t: torch.Tensor) -> torch.Tensor:
    return t.view(torch.int16 if t.element_size() == 2 else torch.int32)


def random_experts(m: int, k: int, e: int, g: torch.Generator) -> torch.Tensor:
    """k distinct experts per row (as a router picks them), in random order."""
    return torch.stack([torch.randperm(e, generator=g)[:k] for _ in range(m)]) if m else torch.zeros(0, k).long()
