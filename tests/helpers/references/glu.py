"""The gelu (tanh form) reference of geglu_tanh."""

import math

import torch


def gelu_tanh(gate):
    """torch's F.gelu(approximate="tanh"), gate / 2 * (1 + tanh(z)) with z = sqrt(2 / pi) (gate + 0.044715 gate^3),
    in float64 as gate * sigmoid(2 z): the same function, without 1 + tanh(z)'s cancellation (in float64 it is 0
    from z < -19 on, where the value is still ~1e-16 of the gate)."""
    return gate * torch.sigmoid(2 * math.sqrt(2 / math.pi) * (gate + 0.044715 * gate ** 3))
