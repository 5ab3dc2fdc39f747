"""Safetensors files read by memory-mapping them: no torch, no safetensors library.

Format: an 8-byte little-endian header length N, N bytes of JSON
(``{name: {"dtype", "shape", "data_offsets": [begin, end]}, "__metadata__": {...}}``),
then the data; offsets are relative to the start of the data. Every entry is checked
against the file size before any tensor is made, so a truncated or corrupt file fails
with a message instead of a wild read.
"""

from __future__ import annotations

import json
import math
import mmap
import struct
from dataclasses import dataclass
from pathlib import Path

import llaisys

from .errors import ModelLoadError

DTYPES = {"F32": llaisys.float32, "F16": llaisys.float16, "BF16": llaisys.bfloat16, "F64": llaisys.float64,
          "I64": llaisys.int64, "I32": llaisys.int32, "I8": llaisys.int8, "U8": llaisys.uint8,
          "BOOL": llaisys.bool_}
MAX_HEADER = 100 << 20  # the safetensors library's own limit


@dataclass(frozen=True)
class TensorInfo:
    name: str
    dtype: llaisys.DType | None  # None: a dtype llaisys has no type for (refused when read)
    dtype_name: str
    shape: tuple[int, ...]
    offset: int  # absolute byte offset in the file
    nbytes: int
    file: "SafetensorsFile"


class SafetensorsFile:
    """One mapped ``.safetensors`` file: ``infos`` from the header, ``tensor(name)`` zero-copy."""

    def __init__(self, path):
        self.path = Path(path)
        try:
            with open(self.path, "rb") as f:
                size = self._size = f.seek(0, 2)
                if size < 8:
                    raise ModelLoadError(f"{self.path} is truncated: {size} bytes, no safetensors header")
                f.seek(0)
                (header_len,) = struct.unpack("<Q", f.read(8))
                if header_len < 2 or header_len > MAX_HEADER or 8 + header_len > size:
                    raise ModelLoadError(f"{self.path} has a corrupt or truncated safetensors header "
                                         f"(header length {header_len}, file size {size})")
                header_bytes = f.read(header_len)
                self._map = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
        except OSError as e:
            raise ModelLoadError(f"cannot read {self.path}: {e}") from None
        try:
            header = json.loads(header_bytes.decode("utf-8"))
        except (UnicodeDecodeError, json.JSONDecodeError) as e:
            raise ModelLoadError(f"{self.path} has a corrupt safetensors header: {e}") from None
        if not isinstance(header, dict):
            raise ModelLoadError(f"{self.path} has a corrupt safetensors header: not a JSON object")
        self.metadata = header.pop("__metadata__", None) or {}
        data_start = 8 + header_len
        data_size = size - data_start
        self.infos: dict[str, TensorInfo] = {}
        for name, entry in header.items():
            self.infos[name] = self._parse(name, entry, data_start, data_size)

    def _parse(self, name, entry, data_start, data_size) -> TensorInfo:
        where = f"{self.path}: tensor {name!r}"
        if not isinstance(entry, dict):
            raise ModelLoadError(f"{where} has a corrupt header entry")
        dtype_name, shape, offsets = entry.get("dtype"), entry.get("shape"), entry.get("data_offsets")
        if not isinstance(dtype_name, str):
            raise ModelLoadError(f"{where} has no dtype")
        if (not isinstance(shape, list)
                or not all(isinstance(s, int) and not isinstance(s, bool) and s >= 0 for s in shape)):
            raise ModelLoadError(f"{where} has an invalid shape {shape!r}")
        if (not isinstance(offsets, list) or len(offsets) != 2
                or not all(isinstance(o, int) and not isinstance(o, bool) for o in offsets)):
            raise ModelLoadError(f"{where} has invalid data_offsets {offsets!r}")
        begin, end = offsets
        if not 0 <= begin <= end or end > data_size:
            raise ModelLoadError(f"{where} lies at bytes [{begin}, {end}) but the file holds {data_size} data "
                                 f"bytes: the file is truncated or corrupt")
        dtype = DTYPES.get(dtype_name)
        if dtype is not None and end - begin != math.prod(shape) * dtype.itemsize:
            raise ModelLoadError(f"{where}: {end - begin} bytes do not hold shape {tuple(shape)} of {dtype_name}")
        return TensorInfo(name, dtype, dtype_name, tuple(shape), data_start + begin, end - begin, self)

    def tensor(self, name: str) -> llaisys.Tensor:
        """A read-only CPU tensor pointing into the mapping (no copy)."""
        info = self.infos[name]
        if info.dtype is None:
            raise ModelLoadError(f"{self.path}: tensor {name!r} has dtype {info.dtype_name}, which llaisys "
                                 f"does not support")
        return llaisys.from_buffer(self._map, info.dtype, info.shape, offset=info.offset)

    @property
    def mapping(self) -> mmap.mmap:
        return self._map

    def release_pages(self, offset: int, nbytes: int) -> None:
        """Drop the pages of [offset, offset + nbytes) from this process's resident set once their
        bytes were copied elsewhere (the file stays in the page cache; a later read faults it back)."""
        advise = getattr(self._map, "madvise", None)
        if advise is None or not hasattr(mmap, "MADV_DONTNEED") or nbytes <= 0:
            return
        start = offset - offset % mmap.PAGESIZE
        end = min(offset + nbytes, len(self._map))
        if end > start:
            advise(mmap.MADV_DONTNEED, start, end - start)

    def __repr__(self) -> str:
        return f"SafetensorsFile({str(self.path)!r}, {len(self.infos)} tensors)"


INDEX_FILE = "model.safetensors.index.json"


class Checkpoint:
    """The tensors of a HuggingFace safetensors directory: one file, or shards named by an index."""

    def __init__(self, directory):
        self.directory = Path(directory)
        index_path = self.directory / INDEX_FILE
        self.files: list[SafetensorsFile] = []
        self.infos: dict[str, TensorInfo] = {}
        if index_path.is_file():
            try:
                index = json.loads(index_path.read_text(encoding="utf-8"))
                weight_map = index["weight_map"]
                if not isinstance(weight_map, dict):
                    raise TypeError("weight_map is not an object")
            except (OSError, UnicodeDecodeError, ValueError, KeyError, TypeError) as e:
                raise ModelLoadError(f"{index_path} is not a valid safetensors index: {e!r}") from None
            shards = {}
            for shard in sorted(set(weight_map.values())):
                shard_path = self.directory / str(shard)
                if not shard_path.is_file():
                    raise ModelLoadError(f"{index_path} names the shard {shard!r}, which does not exist")
                shards[shard] = SafetensorsFile(shard_path)
            self.files = list(shards.values())
            for name, shard in weight_map.items():
                info = shards[shard].infos.get(name)
                if info is None:
                    raise ModelLoadError(f"{index_path} places {name!r} in {shard!r}, but that file lacks it")
                self.infos[name] = info
        else:
            paths = sorted(self.directory.glob("*.safetensors"))
            if not paths:
                raise ModelLoadError(f"no weights in {self.directory}: expected model.safetensors or shards "
                                     f"with {INDEX_FILE}")
            for path in paths:
                f = SafetensorsFile(path)
                self.files.append(f)
                for name, info in f.infos.items():
                    if name in self.infos:
                        raise ModelLoadError(f"tensor {name!r} is in both {self.infos[name].file.path.name} "
                                             f"and {path.name}")
                    self.infos[name] = info

    def __contains__(self, name: str) -> bool:
        return name in self.infos

    def info(self, name: str) -> TensorInfo:
        info = self.infos.get(name)
        if info is None:
            raise ModelLoadError(f"tensor {name!r} is missing from the checkpoint in {self.directory}")
        return info

    def tensor(self, name: str) -> llaisys.Tensor:
        info = self.info(name)
        return info.file.tensor(name)

    @property
    def nbytes(self) -> int:
        return sum(i.nbytes for i in self.infos.values())
