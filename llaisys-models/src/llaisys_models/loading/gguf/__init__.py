"""GGUF files (llama.cpp's format, often quantized) run as llaisys models.

    model = llaisys_models.load("qwen2.5-0.5b-instruct-q4_k_m.gguf")   # Q4_K / Q6_K blocks kept as stored
    tokenizer = llaisys_models.loading.gguf.load_tokenizer("qwen2.5-0.5b-instruct-q4_k_m.gguf")

Architectures: the GGUF names of the registry (families/registry.py); weights stored as F32, F16, BF16, Q8_0,
Q4_0, Q4_1, Q5_0, Q5_1, Q2_K, Q3_K, Q4_K, Q5_K or Q6_K. Q8_0, Q4_0, Q4_1, Q4_K and Q6_K matrices stay in
their blocks (exactly their values, run by ``linear_q`` / ``embedding_q``), Q5_* linears become int8, the
rest is decoded once, at load time, into the compute dtype (gguf/weights.py); ``dequantize=True`` decodes
everything.

reader.py      the file: metadata and tensor table, checked, memory-mapped
config.py      its metadata as a ModelConfig (the keys every architecture has; a family's own: its GGUF rules)
weights.py     its tensors as the decoder's weights (named as the family's GGUF rules say)
quants.py      decoding the stored types; blocks.py: llaisys' block formats of the same values
tokenizer.py   the transformers tokenizer its metadata describes
(The model itself is assembled by loading/loader.py, as a HuggingFace directory's is.)
"""

from __future__ import annotations

from pathlib import Path

from ..files import GGUF_MAGIC as MAGIC

# The submodules import the ``gguf`` package (~0.15 s): only a GGUF load pays for it.


def load_tokenizer(path: str | Path) -> object:
    """The transformers tokenizer (with chat template) described by the GGUF file's metadata."""
    from .reader import GGUFFile  # (start-up: the gguf package)
    from .tokenizer import load_gguf_tokenizer

    return load_gguf_tokenizer(GGUFFile(path))


def hf_from_pretrained_args(path: str | Path) -> tuple[str, dict]:
    """(directory, kwargs) for transformers' ``from_pretrained`` to read the same GGUF file."""
    path = Path(path)
    return str(path.parent), {"gguf_file": path.name}


__all__ = ["MAGIC", "hf_from_pretrained_args", "load_tokenizer"]
