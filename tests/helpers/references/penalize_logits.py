"""The float64 reference of penalize_logits and its penalty entries."""

import torch


def reference(logits: torch.Tensor, ids, counts, bias, repetition, frequency, presence) -> torch.Tensor:
    """The documented formula in float64: bias, then repetition (prompt + generated), then frequency / presence."""
    out = logits.to(torch.float64).clone()
    for i, token in enumerate(ids):
        p, g = counts[i]
        x = out[token] + (0.0 if bias is None else float(bias[i]))
        if p + g > 0:
            x = x * repetition if x < 0 else x / repetition
        out[token] = x - g * frequency - (presence if g > 0 else 0.0)
    return out


def entries(prompt: list[int], generated: list[int], bias: dict | None = None):
    """(ids, counts [n, 2], bias [n] or None) of a sequence's tokens, as a caller builds them: each distinct
    id once, in increasing order (a token listed several times in the sequence is counted, not repeated)."""
    ids = sorted(set(prompt) | set(generated) | set(bias or {}))
    counts = [(prompt.count(t), generated.count(t)) for t in ids]
    values = None if bias is None else [float(bias.get(t, 0.0)) for t in ids]
    return ids, counts, values
