"""Reading a model directory's files defensively: regular files only, JSON that cannot crash the parser.

A FIFO or device named like a model file would block ``open()`` forever or have side
effects, so nothing is opened before ``stat`` says it is a regular file (and the open
itself cannot block). JSON from a model directory is untrusted: nesting deep enough to
exhaust the recursion limit and integers beyond Python's digit limit become a
``ModelLoadError`` naming the file, like any other malformed content.
"""

from __future__ import annotations

import io
import json
import os
import stat
from pathlib import Path
from typing import Any

from ..errors import ModelLoadError

PathArg = str | os.PathLike[str]  # a file or directory given by the caller: a str or a Path

# The files a HuggingFace tokenizer's vocabulary comes from (one of them must be there: given only
# tokenizer_config.json, transformers quietly builds a tokenizer with an empty vocabulary).
VOCABULARY_FILES = ("tokenizer.json", "tokenizer.model", "vocab.json", "vocab.txt", "spiece.model",
                    "sentencepiece.bpe.model")
# Everything AutoTokenizer may open: each must be a regular file, or the load could block on a FIFO.
TOKENIZER_FILES = (*VOCABULARY_FILES, "merges.txt", "tokenizer_config.json", "special_tokens_map.json",
                   "added_tokens.json", "chat_template.jinja", "chat_template.json")

_KINDS = ((stat.S_ISDIR, "a directory"), (stat.S_ISFIFO, "a FIFO"), (stat.S_ISCHR, "a character device"),
          (stat.S_ISBLK, "a block device"), (stat.S_ISSOCK, "a socket"))


def file_kind(mode: int) -> str:
    """'a FIFO', 'a directory', ... for a stat mode that is not a regular file's."""
    return next((name for test, name in _KINDS if test(mode)), "not a regular file")


def model_directory(path: PathArg) -> Path:
    """``path`` as a model directory, or a ModelLoadError saying what it is instead."""
    path = Path(path)
    if path.is_dir():
        return path
    if path.is_file():
        hint = f"; pass the directory that holds it: {path.parent}" if path.name == "config.json" else ""
        raise ModelLoadError(f"{path} is a file, but a model is loaded from its directory (the folder with "
                             f"config.json and the weights) or from a GGUF file{hint}")
    if path.exists():
        raise ModelLoadError(f"{path} is {file_kind(path.stat().st_mode)}, not a model directory or a GGUF file")
    raise ModelLoadError(f"{path} does not exist: a model is a directory (config.json and the weights) or a GGUF file")


GGUF_MAGIC = b"GGUF"


def is_gguf(path: PathArg) -> bool:
    """Whether ``path`` names a GGUF file: by its suffix, else by its first four bytes, sniffing only regular
    files (a FIFO must not block the look at its first bytes)."""
    path = Path(path)
    if path.suffix.lower() == ".gguf":
        return True
    if not path.is_file():
        return False
    try:
        with open(path, "rb") as f:
            return f.read(4) == GGUF_MAGIC
    except OSError:
        return False


def check_regular(path: PathArg) -> None:
    """Raise a ModelLoadError unless ``path`` exists and is a regular file (symlinks followed)."""
    try:
        mode = os.stat(path).st_mode
    except FileNotFoundError:
        raise ModelLoadError(f"{path} does not exist") from None
    except OSError as e:
        raise ModelLoadError(f"cannot read {path}: {e.strerror}") from None
    if not stat.S_ISREG(mode):
        raise ModelLoadError(f"{path} is {file_kind(mode)}, not a regular file; llaisys reads only regular files")


def open_regular(path: PathArg) -> io.BufferedReader:
    """``open(path, "rb")`` for a regular file; anything else is refused without blocking."""
    check_regular(path)
    try:  # O_NONBLOCK: should the path have become a FIFO since the stat, the open still returns
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    except OSError as e:
        raise ModelLoadError(f"cannot read {path}: {e.strerror}") from None
    mode = os.fstat(fd).st_mode
    if not stat.S_ISREG(mode):
        os.close(fd)
        raise ModelLoadError(f"{path} is {file_kind(mode)}, not a regular file; llaisys reads only regular files")
    os.set_blocking(fd, True)
    return os.fdopen(fd, "rb")


def parse_json(data: bytes | str, where: str) -> Any:
    """``json.loads(data)``, with every way untrusted JSON can fail as a ModelLoadError naming ``where``."""
    try:
        return json.loads(data)
    except UnicodeDecodeError as e:
        raise ModelLoadError(f"{where} is not UTF-8 text: {e.reason} at byte {e.start}") from None
    except RecursionError:
        raise ModelLoadError(f"{where} is not valid JSON: nested too deeply") from None
    except ValueError as e:  # JSONDecodeError, or an integer beyond Python's digit limit
        raise ModelLoadError(f"{where} is not valid JSON: {e}") from None


def read_json(path: PathArg) -> Any:
    """The JSON value in the regular file ``path``."""
    with open_regular(path) as f:
        try:
            data = f.read()
        except OSError as e:
            raise ModelLoadError(f"cannot read {path}: {e.strerror}") from None
    return parse_json(data, str(path))


def read_json_object(path: PathArg) -> dict[str, Any]:
    """The JSON object in ``path`` (a ModelLoadError for any other JSON value)."""
    value = read_json(path)
    if not isinstance(value, dict):
        raise ModelLoadError(f"{path} must hold a JSON object, got {type(value).__name__}")
    return value
