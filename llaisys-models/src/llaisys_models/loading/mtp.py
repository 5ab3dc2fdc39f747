"""DeepSeek-V3's multi-token-prediction module from its checkpoint (families/deepseek_mtp.py runs it).

The module is layer ``num_hidden_layers`` of the checkpoint (model.layers.61 of DeepSeek-V3): a whole decoder
layer (latent attention, DeepSeekMoE) beside ``enorm``, ``hnorm``, ``eh_proj`` and its own ``embed_tokens`` and
``shared_head`` (norm, head). It loads as a one-layer model of the same family through the decoder's loader: a view
of the checkpoint names the module's tensors as a model's (layer 0, the embedding, the final norm, the lm_head),
so every check, dtype and int8 rule of the main weights holds for it too.
"""

from __future__ import annotations

import dataclasses

import llaisys

from ..errors import ModelLoadError
from ..families import deepseek_mtp
from ..families.config import ModelConfig
from ..families.family import HF_LAYER, HF_TOP, Family
from ..families.weights import Linear, Weights
from .safetensors import Checkpoint, TensorInfo
from .weights import load_weights, materialize, quantized

# the module's own tensors beside its decoder layer (after "model.layers.{L}.")
MTP_NORMS = ("enorm.weight", "hnorm.weight")
MTP_PROJECTION = "eh_proj.weight"  # [hidden, 2 hidden]: (enorm(embedding), hnorm(hidden)) -> hidden
# the module's copies of the model's top-level weights; a checkpoint without them shares the model's
MTP_TOP = {"embed_tokens": "embed_tokens.weight", "norm": "shared_head.norm.weight", "lm_head": "shared_head.head.weight"}


@dataclasses.dataclass
class MTPWeights:
    """The module: a one-layer model's weights (its layer, embedding, shared_head norm and head) and its input
    norms and projection."""
    model: Weights
    enorm: llaisys.Tensor
    hnorm: llaisys.Tensor
    eh_proj: Linear


class _ModuleView:
    """``checkpoint`` as a one-layer model's: layer L's tensors named as layer 0's, the module's embedding and
    shared_head as the model's embedding, final norm and lm_head (the model's own where the module has none)."""

    def __init__(self, checkpoint: Checkpoint, layer: int) -> None:
        self.directory = checkpoint.directory
        prefix, first = HF_LAYER.format(layer), HF_LAYER.format(0)
        self.infos: dict[str, TensorInfo] = {first + name[len(prefix):]: info
                                             for name, info in checkpoint.infos.items() if name.startswith(prefix)}
        for field, name in MTP_TOP.items():
            self.infos[HF_TOP[field]] = checkpoint.infos.get(prefix + name) or checkpoint.info(HF_TOP[field])

    def info(self, name: str) -> TensorInfo:
        info = self.infos.get(name)
        if info is None:
            raise ModelLoadError(f"the multi-token-prediction module in {self.directory} lacks {name!r}")
        return info


def load_mtp(checkpoint: object, config: ModelConfig, family: Family, dtype: llaisys.DType,
             device: llaisys.Device, quantize: str | None) -> MTPWeights:
    """The first multi-token-prediction module of ``config``'s checkpoint on ``device`` (its linears quantized as
    the model's are)."""
    if not isinstance(checkpoint, Checkpoint):
        raise ModelLoadError("speculative='mtp' reads the module from a HuggingFace directory; this model was "
                             "loaded from a GGUF file")
    layer = config.num_hidden_layers
    prefix = HF_LAYER.format(layer)
    if prefix + MTP_PROJECTION not in checkpoint.infos:
        raise ModelLoadError(f"{checkpoint.directory} has no multi-token-prediction module: {prefix + MTP_PROJECTION} "
                             f"is missing (config num_nextn_predict_layers = {config.num_nextn_predict_layers})")
    one_layer = dataclasses.replace(config, num_hidden_layers=1, tie_word_embeddings=False,
                                    sparse_layers=(0,) if config.sparse_layers else ())
    view = _ModuleView(checkpoint, layer)
    weights = load_weights(view, one_layer, family, dtype, device, quantize=quantize)  # type: ignore[arg-type]
    enorm, hnorm = (materialize(checkpoint.info(prefix + name), dtype, device) for name in MTP_NORMS)
    info = checkpoint.info(prefix + MTP_PROJECTION)
    if info.shape != (config.hidden_size, 2 * config.hidden_size):
        raise ModelLoadError(f"tensor {info.name!r} has shape {info.shape}, but config.json implies "
                             f"{(config.hidden_size, 2 * config.hidden_size)}")
    eh_proj = quantized(info, device, quantize=quantize) if quantize else materialize(info, dtype, device)
    return MTPWeights(weights, enorm, hnorm, eh_proj)


deepseek_mtp.set_mtp_reader(load_mtp)
