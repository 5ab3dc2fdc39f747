"""The float64 causal GQA attention (with an optional sliding window) of self_attention and paged_attention."""

from __future__ import annotations

import torch


def reference(q, k, v, scale, window=0):
    """float64 softmax(scale * q k^T + causal mask aligned bottom-right) v, GQA by repeating kv heads; with a
    ``window``, query i (at position p = i + S - L) sees only keys j > p - window (HF's sliding window)."""
    L, H, _ = q.shape
    S, Hkv, _ = k.shape
    G = H // Hkv
    k = k.to(torch.float64).repeat_interleave(G, dim=1)
    v = v.to(torch.float64).repeat_interleave(G, dim=1)
    scores = torch.einsum("lhd,shd->hls", q.to(torch.float64), k) * scale
    position = torch.arange(L)[:, None] + (S - L)
    visible = torch.arange(S)[None, :] <= position
    if window:
        visible &= torch.arange(S)[None, :] > position - window
    scores = scores.masked_fill(~visible, float("-inf"))
    weights = torch.exp(scores - scores.amax(dim=-1, keepdim=True))
    weights = weights / weights.sum(dim=-1, keepdim=True)
    return torch.einsum("hls,shd->lhd", weights, v)
