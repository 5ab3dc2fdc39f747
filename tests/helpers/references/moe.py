"""Mixture-of-experts test inputs: distinct experts per row, and a tensor's bits."""

from __future__ import annotations

import torch


def bits(t: torch.Tensor) -> torch.Tensor:
    return t.view(torch.int16 if t.element_size() == 2 else torch.int32)


def random_experts(m: int, k: int, e: int, g: torch.Generator) -> torch.Tensor:
    """k distinct experts per row (as a router picks them), in random order."""
    return torch.stack([torch.randperm(e, generator=g)[:k] for _ in range(m)]) if m else torch.zeros(0, k).long()


def grouped_router_reference(logits: torch.Tensor, k: int, bias: torch.Tensor | None = None, scoring: str = "softmax",
                             n_group: int = 1, topk_group: int = 1, group_top: int = 1, normalize: bool = False,
                             route_scale: float = 1.0) -> tuple[torch.Tensor, torch.Tensor]:
    """moe_router_grouped (DeepSeek-V2 / V3) in float64: (experts int64 [M, k], weights float64 [M, k]).

    s = softmax or sigmoid of a row of logits [M, E], c = s + bias (NaN as -inf). With n_group > 1 the experts are
    n_group consecutive groups; a group scores the sum of its group_top largest c, and only the topk_group best
    groups (equal scores: the lower group) keep their experts. The experts are the k largest c (equal c: the
    lower id); the weights their s, over (their sum + 1e-20) when normalizing, times route_scale."""
    x = logits.to(torch.float64)
    m, e = x.shape
    s = torch.softmax(x, -1) if scoring == "softmax" else torch.sigmoid(x)
    c = s if bias is None else s + bias.to(torch.float64)
    c = c.masked_fill(torch.isnan(c), float("-inf"))
    if topk_group < n_group:
        per = e // n_group
        groups = torch.sort(c.view(m, n_group, per), -1, descending=True).values[..., :group_top].sum(-1)
        kept = torch.sort(groups, dim=-1, descending=True, stable=True).indices[:, :topk_group]
        mask = torch.zeros((m, n_group), dtype=torch.bool).scatter_(1, kept, True)
        c = c.masked_fill(~mask.repeat_interleave(per, 1), float("-inf"))
    experts = torch.sort(c, dim=-1, descending=True, stable=True).indices[:, :k]
    weights = torch.gather(s, 1, experts)
    if normalize:
        weights = weights / (weights.sum(-1, keepdim=True) + 1e-20)
    return experts, weights * route_scale
