"""The tokenizer a GGUF file describes in its metadata, as a ``transformers`` tokenizer.

A GGUF file carries no tokenizer.json: the vocabulary, merges, token types, special token
ids and chat template sit in ``tokenizer.*`` metadata keys. transformers already knows how to
turn those into a fast tokenizer (the conversion behind ``AutoTokenizer.from_pretrained(...,
gguf_file=...)``); its own GGUF reader needs torch, so the keys are read here and handed to
its converter, which needs only the ``tokenizers`` library.
"""

from __future__ import annotations

import os

from ..errors import ModelLoadError
from .reader import GGUFFile

SPECIAL_TOKENS = {"bos_token": "bos_token_id", "eos_token": "eos_token_id", "unk_token": "unknown_token_id",
                  "pad_token": "padding_token_id"}


def _converter():
    """(GGUF_TOKENIZER_MAPPING, convert_gguf_tokenizer) from wherever this transformers keeps them."""
    try:  # transformers >= 5.x
        from transformers.integrations.gguf.gguf_tokenizer_mapping import GGUF_TOKENIZER_MAPPING, convert_gguf_tokenizer
    except ImportError:
        try:  # transformers 4.x
            from transformers.integrations.ggml import GGUF_TOKENIZER_MAPPING, convert_gguf_tokenizer
        except ImportError as e:
            raise ModelLoadError(f"this transformers cannot build tokenizers from GGUF metadata ({e}); "
                                 f"pip install -U transformers") from None
    return GGUF_TOKENIZER_MAPPING, convert_gguf_tokenizer


def load_gguf_tokenizer(f: GGUFFile):
    """A ``PreTrainedTokenizerFast`` with the file's vocabulary, special tokens and chat template."""
    meta = f.metadata
    missing = [k for k in ("tokenizer.ggml.model", "tokenizer.ggml.tokens") if k not in meta]
    if missing:
        raise ModelLoadError(f"{f.path} has no tokenizer in its metadata ({' and '.join(missing)} missing): "
                             f"pass token ids instead of text, or use a GGUF file converted with its tokenizer")
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")  # no "PyTorch was not found" advisory
    mapping, convert = _converter()
    from transformers import PreTrainedTokenizerFast

    # the converter's own names for the keys (tokenizer.ggml.tokens -> "tokens", ...)
    tokenizer_dict = {name: meta[f"tokenizer.{key}"] for key, name in mapping["tokenizer"].items()
                      if f"tokenizer.{key}" in meta}
    config = {name: meta[f"tokenizer.{key}"] for key, name in mapping["tokenizer_config"].items()
              if f"tokenizer.{key}" in meta and name in ("chat_template", "add_bos_token", "add_eos_token")}
    if tokenizer_dict.get("tokenizer_type") == "llama":
        config.setdefault("add_bos_token", True)  # llama.cpp adds BOS for sentencepiece unless told not to
    tokens = tokenizer_dict["tokens"]
    for name, key in SPECIAL_TOKENS.items():
        token_id = meta.get(f"tokenizer.ggml.{key}")
        if isinstance(token_id, int) and 0 <= token_id < len(tokens):
            config[name] = tokens[token_id]
    architecture = f.architecture or ""
    try:
        backend, extra = convert(architecture, tokenizer_dict)
        return PreTrainedTokenizerFast(tokenizer_object=backend, **{**extra, **config})
    except Exception as e:  # the converter raises assorted errors for vocabularies it cannot read
        raise ModelLoadError(f"cannot build a tokenizer from the metadata of {f.path} "
                             f"(tokenizer.ggml.model = {tokenizer_dict.get('tokenizer_type')!r}): "
                             f"{type(e).__name__}: {e}") from None
