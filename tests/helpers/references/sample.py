"""The reference token of the sample op for a given seed."""

import numpy as np
import torch

MASK64 = (1 << 64) - 1


def splitmix64(x: int) -> int:
    x = (x + 0x9E3779B97F4A7C15) & MASK64
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & MASK64
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & MASK64
    return x ^ (x >> 31)


def reference_token(logits: torch.Tensor, temperature: float, top_k: int, top_p: float, seed: int) -> int:
    """The token the contract draws (backend.h, sample; the CPU kernel's comment): float64 sums of f32 probabilities,
    candidates by logit descending (lower index first among equals; index order when every token stays)."""
    v = logits.to(torch.float32)
    n = v.numel()
    if temperature < np.finfo(np.float32).tiny or top_k == 1:
        return int(torch.argmax(v))
    if (v == float("inf")).any():
        v = torch.where(v == float("inf"), 0.0, float("-inf"))
    top = float(v.max())
    probs = torch.exp((v - top) / np.float32(temperature)).double()  # f32 exp, as the kernels
    k = n if top_k <= 0 or top_k >= n else top_k
    if k == n and top_p >= 1.0:
        order = list(range(n))
    else:
        order = sorted(range(n), key=lambda i: (-float(v[i]), i))[:k]
    p = probs[order]
    kept = len(order)
    if top_p < 1.0:
        cum = torch.cumsum(p, 0)
        kept = int(torch.searchsorted(cum, top_p * float(p.sum()))) + 1
    p = p[:kept]
    u = (splitmix64(seed ^ splitmix64(0)) >> 11) * 2.0 ** -53
    cum = torch.cumsum(p, 0)
    return order[min(int(torch.searchsorted(cum, u * float(cum[-1]), right=True)), kept - 1)]
