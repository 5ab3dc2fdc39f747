"""GGUF files (llama.cpp's format, often quantized) run as llaisys models.

    model = llaisys_models.load("qwen2.5-0.5b-instruct-q4_k_m.gguf")   # dequantized to bf16 at load
    tokenizer = llaisys_models.gguf.load_tokenizer("qwen2.5-0.5b-instruct-q4_k_m.gguf")

Architectures ``qwen2`` and ``llama``; weights stored as F32, F16, BF16, Q8_0, Q4_0, Q4_1, Q5_0,
Q5_1, Q2_K, Q3_K, Q4_K, Q5_K or Q6_K are decoded once, at load time, into the compute dtype.
"""

from __future__ import annotations

from pathlib import Path

MAGIC = b"GGUF"

# The submodules import the ``gguf`` package (~0.15 s): only a GGUF load pays for it.


def is_gguf(path) -> bool:
    """Whether ``path`` names a GGUF file: by its suffix, or by its first four bytes."""
    path = Path(path)
    if path.suffix.lower() == ".gguf":
        return True
    try:
        with open(path, "rb") as f:
            return f.read(4) == MAGIC
    except OSError:  # a directory, a missing file
        return False


def load(path, device=None, dtype=None, *, progress: bool | None = None, numerics: str | None = None,
         quantize: str | None = None):
    """The model in the GGUF file ``path`` on ``device`` (None: the best available), its weights
    decoded into ``dtype`` (None: the stored float type, or bfloat16 for quantized weights), its ops
    rounding as ``numerics`` says (``llaisys_models.numerics``); ``quantize="int8"`` requantizes the
    linears' weights into llaisys' int8 format instead (``llaisys_models.quantize``)."""
    import llaisys
    from llaisys.dtype import as_dtype

    from ..errors import ModelLoadError
    from ..numerics import resolve as resolve_numerics
    from ..quantize import resolve as resolve_quantize
    from ..qwen2 import Llama, Qwen2, _pick_device
    from .config import architecture, model_config
    from .reader import GGUFFile
    from .weights import default_dtype, load_weights, tensor_plan

    numerics = resolve_numerics(numerics)
    quantize = resolve_quantize(quantize)
    f = GGUFFile(path)
    arch = architecture(f)
    config = model_config(f)
    top, layers = tensor_plan(f, config)
    device = _pick_device(device, quantize)
    if dtype is None:
        dtype = default_dtype(f, top, layers)
    else:
        dtype = as_dtype(dtype)
        if dtype not in (llaisys.float32, llaisys.float16, llaisys.bfloat16):
            raise ModelLoadError(f"dtype must be float32, float16 or bfloat16, got {dtype.name}")
    weights = load_weights(f, config, top, layers, dtype, device, arch, progress=progress, quantize=quantize)
    cls = {"qwen2": Qwen2, "llama": Llama}[arch]
    return cls.from_weights(f.path, config, weights, device=device, dtype=dtype,
                            eos_token_ids=config.eos_token_ids, source=f, numerics=numerics, quantize=quantize)


def load_tokenizer(path):
    """The transformers tokenizer (with chat template) described by the GGUF file's metadata."""
    from .reader import GGUFFile
    from .tokenizer import load_gguf_tokenizer

    return load_gguf_tokenizer(GGUFFile(path))


def hf_from_pretrained_args(path) -> tuple[str, dict]:
    """(directory, kwargs) for transformers' ``from_pretrained`` to read the same GGUF file."""
    path = Path(path)
    return str(path.parent), {"gguf_file": path.name}


__all__ = ["MAGIC", "hf_from_pretrained_args", "is_gguf", "load", "load_tokenizer"]
