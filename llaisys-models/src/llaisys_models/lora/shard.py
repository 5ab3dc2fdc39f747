"""LoRA adapters of a tensor-parallel model: each rank holds its part of every pair, cut along the axis its base
weight is cut (parallel/layout.py), so that the adapted linear's output is the rank's part of the whole one's.

    column-parallel (q/k/v, gate/up: rows of W split)   A [r, K] whole, B's rows of the part:
                                                        (x A^T) B_part^T = the part's rows of the update
    row-parallel (o_proj, down_proj: columns split)     A's columns of the part, B [N, r] whole: each rank's
                                                        (x_part A_part^T) B^T is a partial sum of the update,
                                                        added by the all-reduce the linear already makes
    whole (not split)                                   whole

Replicated kv heads (fewer kv heads than ranks) are the kv head's rows, as the base's are. The cut is
``Layout.part``'s, through the same ``part_reader`` the base weights are cut by. Every rank reads the adapter's
files itself (the checks run on the whole adapter, against the whole model's shapes) and keeps its part: the path
must be readable by every rank.
"""

from __future__ import annotations

import dataclasses
import types
from collections.abc import Callable
from pathlib import Path
from typing import Protocol

import numpy as np

import llaisys

from ..errors import ModelLoadError
from ..families.config import ModelConfig
from ..families.weights import Adapted, Weights
from ..parallel.layout import Layout, Part
from ..parallel.shards import part_reader
from .adapter import TARGETS, LoRAAdapter, LoRAPair

# the ModelConfig fields a Layout reads: the checkpoint's config read again must give the loaded rank's own
_SPLIT_BY = ("num_attention_heads", "num_key_value_heads", "intermediate_size", "head_dim", "num_hidden_layers")


class RankModel(Protocol):
    """What is read here of a rank's model (a CausalLM)."""

    path: Path
    config: ModelConfig  # this rank's own (layout.local_config)
    weights: Weights  # this rank's parts
    group: llaisys.distributed.Group


def layout_of(model: RankModel) -> Layout:
    return Layout(model.group.rank, model.group.world_size)


def whole_config(model: RankModel) -> ModelConfig:
    """The whole model's config (a rank's ``model.config`` is its own part's: layout.local_config), read again
    from the checkpoint the rank loaded."""
    from ..loading.loader import model_config  # (the loader imports the families, which import lora/)

    config = model_config(model.path)
    local = layout_of(model).local_config(config)
    if any(getattr(local, f) != getattr(model.config, f) for f in _SPLIT_BY):
        raise ModelLoadError(f"{model.path}: its config is not the one this tensor-parallel model was loaded from")
    return config


def cut(matrix: np.ndarray, part: Part) -> np.ndarray:
    """``part`` of ``matrix`` (its rows or its columns), contiguous."""
    read, shape = part_reader(lambda start, stop: matrix[start:stop], matrix.shape, part)
    return np.ascontiguousarray(read(0, shape[0]))


def shard_pair(pair: LoRAPair, layout: Layout, config: ModelConfig, field: str) -> LoRAPair:
    """Rank ``layout.rank``'s part of the pair adapting the linear ``field`` (a LayerWeights name) of the whole
    model of ``config``."""
    part = layout.part(field, config)
    if part is None:
        return pair
    assert isinstance(part, Part), (field, part)  # (a linear is never dropped: only row-parallel biases are)
    if part.dim == 0:  # rows of W: rows of B
        return LoRAPair(pair.a, cut(pair.b, part), pair.scale)
    return LoRAPair(cut(pair.a, part), pair.b, pair.scale)  # columns of W: columns of A


def shard_adapter(adapter: LoRAAdapter, layout: Layout, config: ModelConfig) -> LoRAAdapter:
    """``adapter`` (its pairs whole) with rank ``layout.rank``'s part of each pair (name, path and uid kept)."""
    pairs = {(layer, field): shard_pair(pair, layout, config, field) for (layer, field), pair in adapter.pairs.items()}
    return dataclasses.replace(adapter, pairs=pairs)


def whole_shape(layout: Layout, config: ModelConfig, field: str, shape: tuple[int, int]) -> tuple[int, int]:
    """The whole model's [N, K] of linear ``field``, of which this rank holds ``shape``: the split axis reaches
    the last part's end (the parts of every rank, as the layout gives them)."""
    part = layout.part(field, config)
    if not isinstance(part, Part):
        return shape
    parts = [Layout(rank, layout.world).part(field, config) for rank in range(layout.world)]
    end = max(p.stop for p in parts if isinstance(p, Part))
    return (end, shape[1]) if part.dim == 0 else (shape[0], end)


def whole_view(model: RankModel, layout: Layout, config: ModelConfig) -> object:
    """What an adapter reader (loading/lora.py) reads of a model, as the whole model has it: the config, and each
    adapted linear's [N, K] (the reader's checks and GGUF's row order are the whole model's)."""
    layers = []
    for weights in model.weights.layers:
        fields: dict[str, object] = {}
        for field in TARGETS:
            weight = getattr(weights, field)
            if weight is not None:
                base = weight.base if isinstance(weight, Adapted) else weight
                weight = types.SimpleNamespace(shape=whole_shape(layout, config, field, base.shape))
            fields[field] = weight
        layers.append(types.SimpleNamespace(**fields))
    return types.SimpleNamespace(config=config, weights=types.SimpleNamespace(layers=layers))


def read_part(read: Callable[[object, str, Path], LoRAAdapter], model: RankModel, name: str, path: Path,
              uid: int | None = None) -> LoRAAdapter:
    """This rank's part of the adapter ``read`` reads at ``path`` for the whole model (``uid``: rank 0's, on the
    other ranks)."""
    layout = layout_of(model)
    config = whole_config(model)
    adapter = shard_adapter(read(whole_view(model, layout, config), name, path), layout, config)
    return adapter if uid is None else dataclasses.replace(adapter, uid=uid)
