"""llaisys_models: Qwen2 (and Llama-architecture) inference on any llaisys backend.

    import llaisys_models
    model = llaisys_models.load("path/to/hf-model-dir")          # best device, stored dtype
    tokens = model.generate([151646, 3838, 374], max_new_tokens=32)  # greedy == HF transformers
"""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path

from . import gguf
from .config import ModelConfig
from .errors import ModelLoadError
from .files import is_gguf, model_directory
from .generation import GenerationStats
from .locking import ModelBusyError
from .paged_kv import KVPool, KVShape, SequenceKV
from .qwen2 import Llama, Qwen2
from .safetensors import Checkpoint, SafetensorsFile
from .tokenizer import load_tokenizer

if importlib.util.find_spec("torch") is None:
    # llaisys needs transformers only for tokenizers, which work without torch: keep its "PyTorch was
    # not found" advisory off the console (advisories only; real warnings still show)
    os.environ.setdefault("TRANSFORMERS_NO_ADVISORY_WARNINGS", "1")

__version__ = "0.1.0"

MODEL_CLASSES = {arch: cls for cls in (Qwen2, Llama) for arch in cls.architectures}
DEMO_MODEL_DIR = Path(__file__).parent / "demo"


def load(path, device=None, dtype=None, *, progress: bool | None = None, mmap: bool | None = None,
         numerics: str | None = None, quantize: str | None = None) -> Qwen2:
    """The model in the HuggingFace directory (or GGUF file) ``path``, its class picked by config.json's
    architectures.

    ``device`` None picks the best available device; ``dtype`` None keeps the stored dtype.
    ``mmap`` True maps the safetensors files (zero copy on CPU, instant load: but a file truncated or
    rewritten while the model is loaded then crashes the process with SIGBUS); False reads them into
    memory; None (the default) reads them on the CPU (into huge pages: decoding streams them ~10% faster
    than through the mapping's 4 KiB pages) and maps them for other devices (copied there once) and for
    ``quantize="int8"`` (quantized from the mapping a chunk at a time, into memory).
    ``numerics`` "exact" (default) or "hf": where f16 / bf16 ops round (see ``llaisys_models.numerics``;
    None reads ``$LLAISYS_NUMERICS``).
    ``quantize`` None keeps the linears' weights in the model dtype; "int8" quantizes them at load time
    (symmetric int8 per group of 32 inputs with bfloat16 scales; see ``llaisys_models.quantize``): about
    half of bf16's memory and bytes read per token, on devices whose backend has the ``linear_i8`` kernel.
    A GGUF file (llama.cpp's format) is read by ``llaisys_models.gguf`` instead.
    """
    if is_gguf(path):  # hook: GGUF files (issue 15)
        return gguf.load(path, device=device, dtype=dtype, progress=progress, numerics=numerics, quantize=quantize)
    path = model_directory(path)
    config = ModelConfig.from_file(path)
    cls = MODEL_CLASSES.get(config.architecture)
    if cls is None:
        raise ModelLoadError(f"{path / 'config.json'}: architecture {config.architecture or '(none)'!r} is not "
                             f"supported; llaisys_models runs {', '.join(sorted(MODEL_CLASSES))}")
    return cls(path, device=device, dtype=dtype, progress=progress, mmap=mmap, numerics=numerics, quantize=quantize)


__all__ = ["Checkpoint", "DEMO_MODEL_DIR", "GenerationStats", "KVPool", "KVShape", "Llama", "MODEL_CLASSES",
           "ModelBusyError", "ModelConfig", "ModelLoadError", "Qwen2", "SafetensorsFile", "SequenceKV", "load",
           "load_tokenizer"]
