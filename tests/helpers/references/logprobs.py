"""The float64 reference of the logprobs op."""

import torch


def reference(logits: torch.Tensor, chosen: int, temperature: float, k: int):
    """(log p(chosen), top-k ids, top-k log p) in float64; order: logit descending, then id ascending."""
    x = logits.to(torch.float64)
    lp = torch.log_softmax(x / temperature if temperature > 0 else x, dim=0)
    order = sorted(range(x.numel()), key=lambda i: (-float(x[i]), i))[:k]
    return float(lp[chosen]), order, lp[order].tolist()
