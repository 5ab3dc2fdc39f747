"""HF's rope angles and the half-split rotation."""

import numpy as np
import torch


def inv_freq_f32(head_dim: int, theta: float) -> np.ndarray:
    """HF: 1.0 / (theta ** (torch.arange(0, d, 2, dtype=torch.float) / d)), each step rounded to f32."""
    exponent = np.arange(0, head_dim, 2, dtype=np.float32) / np.float32(head_dim)
    power = np.power(np.float64(np.float32(theta)), exponent.astype(np.float64)).astype(np.float32)
    return np.float32(1.0) / power


def rotate(x, angles):
    """x [seq, heads, d] (float64) rotated by angles [seq, d/2] (float64), half-split layout."""
    half = x.shape[-1] // 2
    c, s = angles.cos()[:, None, :], angles.sin()[:, None, :]
    x1, x2 = x[..., :half], x[..., half:]
    return torch.cat((x1 * c - x2 * s, x2 * c + x1 * s), -1)


def hf_angles(pos, head_dim, theta):
    inv = torch.from_numpy(inv_freq_f32(head_dim, theta))
    return (pos.to(torch.float32)[:, None] * inv[None, :]).to(torch.float64)
