"""The logits of a tensor-parallel model, gathered from each rank's rows of the vocabulary (layout.py)."""

from __future__ import annotations

import llaisys


def gather_vocab(local: llaisys.Tensor, vocab: int, group: llaisys.distributed.Group) -> llaisys.Tensor:
    """logits [n, vocab] from every rank's ``local`` [n, V'] (rank r's columns are vocabulary ids
    [r V', (r+1) V'); the last rank's past ``vocab`` are padding); with one rank, ``local`` itself."""
    if group.world_size == 1:
        return local
    n, per = local.shape
    gathered = llaisys.empty((group.world_size, n, per), local.dtype, local.device)
    llaisys.distributed.all_gather(gathered, local, group)
    whole = llaisys.empty((n, group.world_size * per), local.dtype, local.device)
    llaisys.ops.rearrange(whole.view(n, group.world_size, per), gathered.permute(1, 0, 2))
    if group.world_size * per == vocab:
        return whole
    logits = llaisys.empty((n, vocab), local.dtype, local.device)
    llaisys.ops.rearrange(logits, whole.slice(1, 0, vocab))
    return logits
