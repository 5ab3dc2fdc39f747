"""Safetensors files read by memory-mapping them (or, on request, by plain reads): no torch, no
safetensors library.

Format: an 8-byte little-endian header length N, N bytes of JSON
(``{name: {"dtype", "shape", "data_offsets": [begin, end]}, "__metadata__": {...}}``),
then the data; offsets are relative to the start of the data. Every entry is checked
against the file size before any tensor is made, so a truncated or corrupt file fails
with a message instead of a wild read; every size in the header is bounded before any
work depends on it.
"""

from __future__ import annotations

import math
import mmap
import os
import struct
from dataclasses import dataclass
from pathlib import Path, PurePath

import numpy as np

import llaisys

from ..errors import ModelLoadError, shown
from .files import PathArg, check_regular, open_regular, parse_json, read_json_object

DTYPES = {"F32": llaisys.float32, "F16": llaisys.float16, "BF16": llaisys.bfloat16, "F64": llaisys.float64,
          "I64": llaisys.int64, "I32": llaisys.int32, "I8": llaisys.int8, "U8": llaisys.uint8,
          "BOOL": llaisys.bool_}
MAX_HEADER = 100 << 20  # the safetensors library's own limit
MAX_DIMS = 64  # numpy's limit on dimensions (NPY_MAXDIMS)


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
    """One ``.safetensors`` file: ``infos`` from the header; tensors zero-copy from a memory map, or,
    with ``mapped=False``, read into memory when asked for (the file is not kept open)."""

    def __init__(self, path: PathArg, mapped: bool = True) -> None:
        self.path = Path(path)
        self.mapped = mapped
        self._map: mmap.mmap | None = None
        with open_regular(self.path) as f:
            try:
                size = os.fstat(f.fileno()).st_size
                if size < 8:
                    raise ModelLoadError(f"{self.path} is truncated: {size} bytes, no safetensors header")
                (header_len,) = struct.unpack("<Q", f.read(8))
                if header_len < 2 or header_len > MAX_HEADER or 8 + header_len > size:
                    raise ModelLoadError(f"{self.path} has a corrupt or truncated safetensors header "
                                         f"(header length {header_len}, file size {size})")
                header_bytes = f.read(header_len)
                if mapped:
                    self._map = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
            except OSError as e:
                raise ModelLoadError(f"cannot read {self.path}: {e}") from None
        header = parse_json(header_bytes, f"the safetensors header of {self.path}")
        if not isinstance(header, dict):
            raise ModelLoadError(f"{self.path} has a corrupt safetensors header: not a JSON object")
        self.metadata = header.pop("__metadata__", None) or {}
        self._size = size
        data_start = 8 + header_len
        data_size = size - data_start
        self.infos: dict[str, TensorInfo] = {}
        for name, entry in header.items():
            self.infos[name] = self._parse(name, entry, data_start, data_size)

    def _parse(self, name: str, entry: object, data_start: int, data_size: int) -> TensorInfo:
        where = f"{self.path}: tensor {shown(name)}"
        if not isinstance(entry, dict):
            raise ModelLoadError(f"{where} has a corrupt header entry")
        dtype_name, shape, offsets = entry.get("dtype"), entry.get("shape"), entry.get("data_offsets")
        if not isinstance(dtype_name, str):
            raise ModelLoadError(f"{where} has no dtype")
        if (not isinstance(shape, list) or len(shape) > MAX_DIMS
                or not all(isinstance(s, int) and not isinstance(s, bool) and s >= 0 for s in shape)):
            raise ModelLoadError(f"{where} has an invalid shape {shown(shape)} (at most {MAX_DIMS} sizes, each >= 0)")
        if (not isinstance(offsets, list) or len(offsets) != 2
                or not all(isinstance(o, int) and not isinstance(o, bool) for o in offsets)):
            raise ModelLoadError(f"{where} has invalid data_offsets {shown(offsets)}")
        begin, end = offsets
        if not 0 <= begin <= end or end > data_size:
            raise ModelLoadError(f"{where} lies at bytes [{begin}, {end}) but the file holds {data_size} data "
                                 f"bytes: the file is truncated or corrupt")
        dtype = DTYPES.get(dtype_name)
        elements = math.prod(shape)  # of at most MAX_DIMS sizes: cheap however large they are
        if dtype is not None and end - begin != elements * dtype.itemsize:
            raise ModelLoadError(f"{where}: {end - begin} bytes do not hold shape {shown(tuple(shape))} of {dtype_name}")
        if dtype is None and elements > 8 * (end - begin):  # an unknown dtype: still at least one bit a value
            raise ModelLoadError(f"{where}: {end - begin} bytes cannot hold shape {shown(tuple(shape))} of any dtype")
        return TensorInfo(name, dtype, dtype_name, tuple(shape), data_start + begin, end - begin, self)

    def tensor(self, name: str) -> llaisys.Tensor:
        """A read-only CPU tensor pointing into the mapping (no copy); a copy when not mapped."""
        info, dtype = self._known(name)
        if self._map is None:
            return llaisys.from_numpy(self.array(info))
        return llaisys.from_buffer(self._map, dtype, info.shape, offset=info.offset)

    def array(self, info: TensorInfo, out: np.ndarray | None = None) -> np.ndarray:
        """The stored values of ``info`` as a host numpy array: a read-only view of the mapping, or
        the bytes read from the file now (into ``out``, a writable C-contiguous array of the tensor's
        bytes, when given: one copy, straight from the file)."""
        info, dtype = self._known(info.name)
        count = math.prod(info.shape)
        if self._map is not None:
            return np.frombuffer(self._map, dtype=dtype.numpy, count=count, offset=info.offset).reshape(info.shape)
        data = np.empty(info.nbytes, dtype=np.uint8) if out is None else out.reshape(-1).view(np.uint8)
        self.read_into(info, data)
        return data.view(dtype.numpy).reshape(info.shape)

    def read_into(self, info: TensorInfo, data: np.ndarray) -> None:
        """Read the stored bytes of ``info`` from the file into ``data`` (a writable uint8 array of
        exactly its bytes); needs no numpy dtype for the values (bf16's would import ml_dtypes)."""
        info, _ = self._known(info.name)
        with open_regular(self.path) as f:
            try:
                f.seek(info.offset)
                got = f.readinto(data.data)
            except OSError as e:
                raise ModelLoadError(f"cannot read {self.path}: {e}") from None
        if got != info.nbytes:
            raise ModelLoadError(f"{self.path} changed while loading: tensor {info.name!r} is cut short "
                                 f"({got} of {info.nbytes} bytes)")

    @property
    def mapping(self) -> mmap.mmap | None:
        """The file's memory map (None when loaded with ``mapped=False``)."""
        return self._map

    def _known(self, name: str) -> tuple[TensorInfo, llaisys.DType]:
        """The info of tensor ``name`` and its dtype (a ModelLoadError for a dtype llaisys has no type for)."""
        info = self.infos[name]
        if info.dtype is None:
            raise ModelLoadError(f"{self.path}: tensor {shown(name)} has dtype {shown(info.dtype_name)}, which llaisys "
                                 f"does not support")
        return info, info.dtype

    def release_pages(self, offset: int, nbytes: int) -> None:
        """Drop the pages of [offset, offset + nbytes) from this process's resident set once their
        bytes were copied elsewhere (the file stays in the page cache; a later read faults it back)."""
        mapping = self._map
        advise = getattr(mapping, "madvise", None)
        if mapping is None or advise is None or not hasattr(mmap, "MADV_DONTNEED") or nbytes <= 0:
            return
        start = offset - offset % mmap.PAGESIZE
        end = min(offset + nbytes, len(mapping))
        if end > start:
            advise(mmap.MADV_DONTNEED, start, end - start)

    def __repr__(self) -> str:
        return f"SafetensorsFile({str(self.path)!r}, {len(self.infos)} tensors)"


INDEX_FILE = "model.safetensors.index.json"


class Checkpoint:
    """The tensors of a HuggingFace safetensors directory: one file, or shards named by an index.

    Only files inside ``directory`` are opened: an index may name shards by bare file name only.
    ``mapped=False`` reads tensors into memory instead of mapping the files (see SafetensorsFile).
    """

    def __init__(self, directory: PathArg, mapped: bool = True) -> None:
        self.directory = Path(directory)
        index_path = self.directory / INDEX_FILE
        self.files: list[SafetensorsFile] = []
        self.infos: dict[str, TensorInfo] = {}
        if index_path.exists():
            shards: dict[str, SafetensorsFile] = {}
            weight_map = _weight_map(index_path)
            for shard in sorted(set(weight_map.values())):
                shard_path = self.directory / shard
                if not shard_path.exists():
                    raise ModelLoadError(f"{index_path} names the shard {shard!r}, which does not exist")
                shards[shard] = SafetensorsFile(shard_path, mapped)
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
                check_regular(path)  # before any is opened: a FIFO among them must not block the others
            for path in paths:
                f = SafetensorsFile(path, mapped)
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


def _weight_map(index_path: Path) -> dict[str, str]:
    """The index's {tensor name: shard file name}, each shard a bare file name in the same directory."""
    index = read_json_object(index_path)
    weight_map = index.get("weight_map")
    if not isinstance(weight_map, dict):
        raise ModelLoadError(f"{index_path} is not a valid safetensors index: 'weight_map' is not an object")
    for name, shard in weight_map.items():
        if not isinstance(shard, str) or not _is_bare_file_name(shard):
            raise ModelLoadError(f"{index_path}: weight_map places {shown(name)} in {shown(shard)}, which is not a file "
                                 f"name inside the model directory")
    return weight_map


def _is_bare_file_name(name: str) -> bool:
    """'model-00001-of-00002.safetensors' yes; '/etc/passwd', '../x', 'a/b', '' no."""
    return name not in ("", ".", "..") and PurePath(name).name == name and "\\" not in name and "\0" not in name
