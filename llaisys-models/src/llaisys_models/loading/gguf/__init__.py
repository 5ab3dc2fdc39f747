"""GGUF files (llama.cpp's format, often quantized) run as llaisys models.

    model = llaisys_models.load("qwen2.5-0.5b-instruct-q4_k_m.gguf")   # Q4_K / Q6_K blocks kept as stored
    tokenizer = llaisys_models.loading.gguf.load_tokenizer("qwen2.5-0.5b-instruct-q4_k_m.gguf")

Architectures: the GGUF names of the registry (registry.py); weights stored as F32, F16, BF16, Q8_0,
Q4_0, Q4_1, Q5_0, Q5_1, Q2_K, Q3_K, Q4_K, Q5_K or Q6_K. Q8_0, Q4_0, Q4_1, Q4_K and Q6_K matrices stay in
their blocks (exactly their values, run by ``linear_q`` / ``embedding_q``), Q5_* linears become int8, the
rest is decoded once, at load time, into the compute dtype (gguf/weights.py); ``dequantize=True`` decodes
everything.
"""

from __future__ import annotations

from pathlib import Path

from ..files import GGUF_MAGIC as MAGIC

# The submodules import the ``gguf`` package (~0.15 s): only a GGUF load pays for it.


def load(path, device=None, dtype=None, *, progress: bool | None = None, numerics: str | None = None,
         quantize: str | None = None, dequantize: bool = False, layout=None, group=None):
    """The model in the GGUF file ``path`` on ``device`` (None: the best available), computing in ``dtype``
    (None: the stored float type, or float32 for quantized weights), its ops rounding as ``numerics`` says
    (``llaisys_models.families.numerics``). Quantized matrices stay in their blocks where llaisys has their format and
    the device the kernels (gguf/weights.py); ``dequantize=True`` decodes every tensor into ``dtype`` instead
    (exactly the stored values in float32, as HF transformers reads the file); ``quantize="int8"`` / ``"int4"``
    requantizes the linears' weights (``llaisys_models.loading.quantize``). ``layout`` and ``group``: this rank's part
    of a tensor-parallel model (llaisys_models.parallel; its quantized matrices are decoded, then cut)."""
    from ...errors import ModelLoadError
    from ...families.registry import MODEL_CLASSES
    from ..loader import float_dtype, pick_device
    from ..quantize import resolve as resolve_quantize
    from .config import architecture, model_config
    from .reader import GGUFFile
    from .weights import default_dtype, load_weights, tensor_plan

    quantize = resolve_quantize(quantize)
    if dequantize and quantize is not None:
        raise ModelLoadError(f"dequantize=True decodes the weights into {dtype or 'float32'}, quantize={quantize!r} "
                             f"requantizes them: choose one")
    f = GGUFFile(path)
    arch = architecture(f)
    config = model_config(f)
    top, layers = tensor_plan(f, config)
    cls = MODEL_CLASSES[config.architecture]
    device = pick_device(device, quantize, cls.KERNELS, experts=bool(config.sparse_layers))
    dtype = default_dtype(f, top, layers) if dtype is None else float_dtype(dtype)
    weights = load_weights(f, config, top, layers, dtype, device, arch, progress=progress, quantize=quantize,
                           dequantize=dequantize, layout=layout)
    local = config if layout is None else layout.local_config(config)
    return cls.from_weights(f.path, local, weights, device=device, dtype=dtype, eos_token_ids=config.eos_token_ids,
                            source=f, numerics=numerics, quantize=quantize, group=group)


def load_tokenizer(path):
    """The transformers tokenizer (with chat template) described by the GGUF file's metadata."""
    from .reader import GGUFFile
    from .tokenizer import load_gguf_tokenizer

    return load_gguf_tokenizer(GGUFFile(path))


def hf_from_pretrained_args(path) -> tuple[str, dict]:
    """(directory, kwargs) for transformers' ``from_pretrained`` to read the same GGUF file."""
    path = Path(path)
    return str(path.parent), {"gguf_file": path.name}


__all__ = ["MAGIC", "hf_from_pretrained_args", "load", "load_tokenizer"]
