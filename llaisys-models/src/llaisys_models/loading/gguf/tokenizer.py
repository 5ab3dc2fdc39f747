"""The tokenizer a GGUF file describes in its metadata, as a ``transformers`` tokenizer.

A GGUF file carries no tokenizer.json: the vocabulary, merges, token types, special token
ids and chat template sit in ``tokenizer.*`` metadata keys. transformers already knows how to
turn those into a fast tokenizer (the conversion behind ``AutoTokenizer.from_pretrained(...,
gguf_file=...)``); its own GGUF reader needs torch, so the keys are read here and handed to
its converter, which needs only the ``tokenizers`` library.
"""

from __future__ import annotations

import importlib
import os
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from ...errors import ModelLoadError, shown
from .reader import GGUFFile

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerFast

SPECIAL_TOKENS = {"bos_token": "bos_token_id", "eos_token": "eos_token_id", "unk_token": "unknown_token_id",
                  "pad_token": "padding_token_id"}


def _string(v: object) -> bool:
    return isinstance(v, str)


def _flag(v: object) -> bool:
    return isinstance(v, bool)


def _integer(v: object) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _number(v: object) -> bool:
    return _integer(v) or isinstance(v, float)


def _token_id(v: object) -> bool:
    return isinstance(v, int) and not isinstance(v, bool) and v >= 0


# the keys the converter reads, with what each must be: {key: (test, description)}
SCALARS = {
    "tokenizer.ggml.model": (_string, "a string"), "tokenizer.ggml.pre": (_string, "a string"),
    "tokenizer.chat_template": (_string, "a string"),
    "tokenizer.ggml.add_space_prefix": (_flag, "true or false"), "tokenizer.ggml.add_bos_token": (_flag, "true or false"),
    "tokenizer.ggml.add_eos_token": (_flag, "true or false"),
    **{f"tokenizer.ggml.{name}": (_token_id, "a token id") for name in
       ("bos_token_id", "eos_token_id", "unknown_token_id", "padding_token_id")},
}
ARRAYS = {  # {key: (test of every item, description of the items)}
    "tokenizer.ggml.tokens": (_string, "strings"), "tokenizer.ggml.merges": (_string, "strings"),
    "tokenizer.ggml.scores": (_number, "numbers"), "tokenizer.ggml.token_type": (_integer, "integers"),
    "tokenizer.ggml.precompiled_charsmap": (_integer, "integers"),
}
PER_TOKEN = ("tokenizer.ggml.scores", "tokenizer.ggml.token_type")  # one entry per token


def check_tokenizer_metadata(f: GGUFFile) -> None:
    """Every tokenizer key the file has holds what the converter expects, and the per-token arrays are as
    long as the token list: a ModelLoadError naming the file and the key otherwise."""
    meta = f.metadata
    for key, (valid, what) in SCALARS.items():
        if key in meta and not valid(meta[key]):
            raise ModelLoadError(f"{f.path}: metadata key {key} must be {what}, got {shown(meta[key])}")
    for key, (valid, what) in ARRAYS.items():
        value = meta.get(key, [])
        if not isinstance(value, list):
            raise ModelLoadError(f"{f.path}: metadata key {key} must be an array of {what}, got {shown(value)}")
        bad = next((i for i, v in enumerate(value) if not valid(v)), None)
        if bad is not None:
            raise ModelLoadError(f"{f.path}: metadata key {key} must be an array of {what}, but item {bad} is "
                                 f"{shown(value[bad])}")
    for key in PER_TOKEN:
        if key in meta:
            entries, tokens = meta[key], meta["tokenizer.ggml.tokens"]
            assert isinstance(entries, list) and isinstance(tokens, list)  # arrays, as the loop above checked
            if len(entries) != len(tokens):
                raise ModelLoadError(f"{f.path}: metadata key {key} has {len(entries)} entries for {len(tokens)} "
                                     f"tokens")


def _one_line(text: str, limit: int = 200) -> str:
    text = " ".join(text.split())
    return text if len(text) <= limit else text[:limit - 3] + "..."


def _converter() -> tuple[dict[str, dict[str, str]], Callable[[str, dict[str, Any]], tuple[Any, dict[str, Any]]]]:
    """(GGUF_TOKENIZER_MAPPING, convert_gguf_tokenizer) from wherever this transformers keeps them."""
    try:  # transformers >= 5.x
        from transformers.integrations.gguf.gguf_tokenizer_mapping import GGUF_TOKENIZER_MAPPING, convert_gguf_tokenizer
    except ImportError:
        try:  # transformers 4.x (imported by name: type checkers see the 5.x installed, which moved both)
            ggml = importlib.import_module("transformers.integrations.ggml")
            return ggml.GGUF_TOKENIZER_MAPPING, ggml.convert_gguf_tokenizer
        except (ImportError, AttributeError) as e:
            raise ModelLoadError(f"this transformers cannot build tokenizers from GGUF metadata ({e}); "
                                 f"pip install -U transformers") from None
    return GGUF_TOKENIZER_MAPPING, convert_gguf_tokenizer


def load_gguf_tokenizer(f: GGUFFile) -> PreTrainedTokenizerFast:
    """A ``PreTrainedTokenizerFast`` with the file's vocabulary, special tokens and chat template."""
    meta = f.metadata
    missing = [k for k in ("tokenizer.ggml.model", "tokenizer.ggml.tokens") if k not in meta]
    if missing:
        raise ModelLoadError(f"{f.path} has no tokenizer in its metadata ({' and '.join(missing)} missing): "
                             f"pass token ids instead of text, or use a GGUF file converted with its tokenizer")
    check_tokenizer_metadata(f)
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
    assert isinstance(tokens, list)  # tokenizer.ggml.tokens: there, and an array (checked above)
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
                             f"(tokenizer.ggml.model = {shown(tokenizer_dict.get('tokenizer_type'))}): "
                             f"{type(e).__name__}: {_one_line(str(e))}") from None
