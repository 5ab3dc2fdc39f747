"""llaisys_models: LLM inference (Qwen2/2.5/3, Llama, Mistral, Phi-3, Gemma 3, OLMo 2, Mixtral, Qwen3-MoE: the
families of ``families/registry.py``) on any llaisys backend.

    import llaisys_models
    model = llaisys_models.load("path/to/hf-model-dir")          # best device, stored dtype
    tokens = model.generate([151646, 3838, 374], max_new_tokens=32)  # greedy == HF transformers
    model = llaisys_models.load("Qwen/Qwen2.5-0.5B-Instruct")     # a Hub id: the HF cache, else a download
    reply = model.chat("What is the capital of France?")          # text in, text out (the chat template)
"""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path
from typing import TYPE_CHECKING

from ._version import __version__
from .engine.generation import GenerationStats
from .engine.grammar import Grammar, GrammarError
from .engine.kv_blocks import BlockManager, SequenceKV
from .engine.kv_cache import KVPool, KVShape, check_kv_cache_dtype
from .engine.sampling import SamplingParams
from .errors import ModelBusyError, ModelLoadError
from .families.causal_lm import CausalLM, Session
from .families.config import ModelConfig
from .families.llama import Llama
from .families.phi3 import Phi3
from .families.qwen2 import Qwen2
from .families.qwen3 import Qwen3
from .families.registry import MODEL_CLASSES
from .loading import gguf, loader
from .loading import lora as _adapter_reader  # noqa: F401  (model.load_lora reads adapters through it)
from .loading.safetensors import Checkpoint, SafetensorsFile
from .text.tokenizer import load_tokenizer

if TYPE_CHECKING:
    import llaisys

if importlib.util.find_spec("torch") is None:
    # llaisys needs transformers only for tokenizers, which work without torch: keep its "PyTorch was
    # not found" advisory off the console (advisories only; real warnings still show)
    os.environ.setdefault("TRANSFORMERS_NO_ADVISORY_WARNINGS", "1")


DEMO_MODEL_DIR = Path(__file__).parent / "demo"


def load(path: str | Path, device: str | llaisys.Device | None = None, dtype: str | llaisys.DType | None = None, *,
         progress: bool | None = None, mmap: bool | None = None, numerics: str | None = None,
         quantize: str | None = None, dequantize: bool = False, tensor_parallel: int | None = None,
         distributed_executor: str | None = None, kv_cache_dtype: str = "auto") -> CausalLM:
    """The model in the HuggingFace directory (or GGUF file) ``path``, its class picked by the architecture
    its config names (``llaisys_models.families.registry``).

    ``device`` None picks the best available device; ``dtype`` None keeps the stored dtype.
    ``mmap`` True maps the safetensors files (zero copy on CPU, instant load: but a file truncated or
    rewritten while the model is loaded then crashes the process with SIGBUS); False reads them into
    memory; None (the default) reads them on the CPU (into huge pages: decoding streams them ~10% faster
    than through the mapping's 4 KiB pages) and maps them for other devices (copied there once) and for
    ``quantize="int8"`` (quantized from the mapping a chunk at a time, into memory).
    ``numerics`` "exact" (default) or "hf": where f16 / bf16 ops round (see ``llaisys_models.families.numerics``;
    None reads ``$LLAISYS_NUMERICS``).
    ``quantize`` None keeps the linears' weights as stored; "int8" quantizes them at load time (symmetric int8
    per group of 32 inputs with bfloat16 scales; see ``llaisys_models.loading.quantize``): about half of bf16's memory
    and bytes read per token, on devices whose backend has the ``linear_i8`` kernel; "int4" into 4-bit blocks
    (q4_0, the lm_head in int8): about a quarter, where the backend has ``linear_q``.
    A GGUF file (llama.cpp's format) is read by ``llaisys_models.loading.gguf`` instead: its quantized matrices stay
    in their blocks unless ``dequantize`` is True (decoded into ``dtype``, as HF transformers reads them).
    ``tensor_parallel`` N > 1 splits the model over N ranks, one device each (``device="cuda"``: cuda:0 ..
    cuda:N-1; the CPU: N processes sharing its cores), this process rank 0: the returned model runs the
    engine and drives the others (``llaisys_models.parallel``); ``model.close()`` ends them. (A split
    GGUF file's quantized matrices are decoded: each rank's part is cut from the decoded rows.)
    ``distributed_executor`` "local" (default) starts those ranks as processes of this host; "ray" as Ray actors
    in a placement group, one bundle per rank, on any node of the Ray cluster this process is in (or RAY_ADDRESS
    names, else one started here): GPUs anywhere, CPU ranks on rank 0's host (their collectives are shared
    memory) (``llaisys_models.parallel.ray_ranks``; the ``ray`` extra).
    ``kv_cache_dtype`` "auto" (default) keeps the KV cache in the model's dtype; "int8" or "fp8" (e4m3) stores each
    key and value in one byte with an f16 scale per token and kv head: about twice the tokens in the same memory
    (``model.kv_cache_dtype``; docs/kv-cache-quantization.md measures what it costs).
    """
    check_kv_cache_dtype(kv_cache_dtype)
    if tensor_parallel is None and distributed_executor is None:
        model = loader.load(path, device, dtype, progress=progress, mmap=mmap, numerics=numerics, quantize=quantize,
                            dequantize=dequantize)
    else:
        from .parallel import launch  # (start-up: the ranks' machinery, for tensor_parallel alone)

        model = launch.load(path, device, dtype, tensor_parallel=tensor_parallel,
                            distributed_executor=distributed_executor, progress=progress, mmap=mmap,
                            numerics=numerics, quantize=quantize, dequantize=dequantize)
    try:
        model.kv_cache_dtype = kv_cache_dtype
    except BaseException:
        model.close()  # (the ranks of a tensor-parallel model)
        raise
    return model


__all__ = ["__version__", "BlockManager", "CausalLM", "Checkpoint", "DEMO_MODEL_DIR", "GenerationStats", "Grammar",
           "GrammarError", "KVPool", "KVShape", "Llama", "MODEL_CLASSES", "ModelBusyError", "ModelConfig",
           "ModelLoadError", "Phi3", "Qwen2", "Qwen3", "SafetensorsFile", "SamplingParams", "SequenceKV", "Session",
           "gguf", "load", "load_tokenizer"]
