"""A GGUF file, memory-mapped: its metadata, its tensor table, and each tensor's bytes.

Layout (little-endian): magic ``GGUF``, version (2 or 3), tensor count and metadata count
(u64), the metadata as key/type/value triples, the tensor table (name, dims fastest-first,
ggml type, offset into the data section), then the data section, aligned to
``general.alignment`` (32 by default).

The format's constants (value types, ggml types and their block sizes) come from the ``gguf``
package, ggml's own Python library. Its ``GGUFReader`` is not used to parse the header: it builds
two numpy arrays for every string of a metadata array, and so takes seconds on a 150k-token
vocabulary, where the loop below takes a tenth of a second (the tests parse every file with both
and compare).

The file is untrusted: every size it declares (counts, string and array lengths, nesting, tensor
dimensions and offsets, the alignment) is bounded before any loop, allocation or read depends on
it, so a truncated, corrupt or hostile file fails at once with one line naming the file and the
problem: never a wild read, a hang, a runaway allocation or another exception. The bounds are
llama.cpp's (ggml/src/gguf.cpp) unless said otherwise.
"""

from __future__ import annotations

import math
import mmap
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from gguf import GGML_QUANT_SIZES, GGUF_DEFAULT_ALIGNMENT, GGMLQuantizationType, GGUFValueType

from ...errors import ModelLoadError, shown
from ..files import GGUF_MAGIC as MAGIC
from ..files import PathArg

VERSIONS = (2, 3)
MAX_DIMS = 4  # GGML_MAX_DIMS
MAX_NAME = 64  # GGML_MAX_NAME: a tensor name is shorter (ggml keeps names in a char[64])
MAX_STRING = 1 << 30  # GGUF_MAX_STRING_LENGTH
MAX_ARRAY = 1 << 30  # GGUF_MAX_ARRAY_ELEMENTS
MAX_ARRAY_DEPTH = 8  # arrays inside arrays: llama.cpp reads none at all; the gguf package writes them
MAX_ELEMENTS = 2 ** 63 - 1  # a tensor's element count must fit in int64
MIN_ALIGNMENT = 8  # the GGUF specification: general.alignment "must be a multiple of 8"
# the fewest bytes one record takes: a count the rest of the file cannot hold is refused before any loop
MIN_KV_BYTES = 8 + 4 + 1  # key length, value type, a one-byte value
MIN_TENSOR_BYTES = 8 + 4 + 8 + 4 + 8  # name length, dimension count, one dimension, ggml type, offset
# a string: its length; an array: its item type and count
MIN_ITEM_BYTES: dict[GGUFValueType, int] = {GGUFValueType.STRING: 8, GGUFValueType.ARRAY: 4 + 8}

# fixed-size metadata value types -> numpy dtype (little-endian)
_SCALARS: dict[GGUFValueType, np.dtype[Any]] = {
    GGUFValueType.UINT8: np.dtype("<u1"), GGUFValueType.INT8: np.dtype("<i1"),
    GGUFValueType.UINT16: np.dtype("<u2"), GGUFValueType.INT16: np.dtype("<i2"),
    GGUFValueType.UINT32: np.dtype("<u4"), GGUFValueType.INT32: np.dtype("<i4"),
    GGUFValueType.UINT64: np.dtype("<u8"), GGUFValueType.INT64: np.dtype("<i8"),
    GGUFValueType.FLOAT32: np.dtype("<f4"), GGUFValueType.FLOAT64: np.dtype("<f8"),
    GGUFValueType.BOOL: np.dtype("?"),
}


MADV_POPULATE_READ = getattr(mmap, "MADV_POPULATE_READ", 22)  # Linux >= 5.14


@dataclass(frozen=True)
class TensorInfo:
    name: str
    type: GGMLQuantizationType
    shape: tuple[int, ...]  # numpy order: slowest dimension first (ggml lists them the other way round)
    offset: int  # absolute byte offset in the file
    nbytes: int

    @property
    def rows(self) -> int:
        return math.prod(self.shape[:-1])

    @property
    def row_bytes(self) -> int:
        return self.nbytes // self.rows if self.rows else 0


class _Truncated(Exception):
    pass


class _Cursor:
    """Reads little-endian values from the mapping, refusing to read past its end."""

    def __init__(self, buf: mmap.mmap, pos: int):
        self.buf, self.pos, self.size = buf, pos, len(buf)

    @property
    def left(self) -> int:
        return self.size - self.pos

    def take(self, n: int) -> int:
        """Advance by n bytes; returns where they start."""
        start = self.pos
        if n < 0 or start + n > self.size:
            raise _Truncated(f"a {n}-byte field at byte {start} runs past the end of the file ({self.size} bytes)")
        self.pos += n
        return start

    def unpack(self, fmt: str) -> tuple[Any, ...]:
        return struct.unpack_from(fmt, self.buf, self.take(struct.calcsize(fmt)))

    def u32(self) -> int:
        return self.unpack("<I")[0]

    def u64(self) -> int:
        return self.unpack("<Q")[0]

    def string(self, what: str = "a string", limit: int = MAX_STRING) -> str:
        at = self.pos
        n = self.u64()
        if n > limit:
            raise ModelLoadError(f"{what} at byte {at} declares {n} bytes (at most {limit} allowed)")
        start = self.take(n)
        try:
            return self.buf[start:start + n].decode("utf-8")
        except UnicodeDecodeError as e:
            raise ModelLoadError(f"{what} at byte {at} is not valid UTF-8 ({e.reason})") from None

    def value(self, kind: int) -> object:
        """A metadata value of type ``kind`` (the u32 just read)."""
        kind = _value_type(kind, self.pos - 4)
        if kind == GGUFValueType.STRING:
            return self.string()
        if kind == GGUFValueType.ARRAY:
            return self.array(depth=1)
        dtype = _SCALARS[kind]
        return np.frombuffer(self.buf, dtype, 1, self.take(dtype.itemsize))[0].item()

    def array(self, depth: int) -> list[Any]:
        """An array's item type, count and items; ``depth``: 1 for a key's value, 2 for an array in it, ..."""
        at = self.pos
        item, count = _value_type(self.u32(), at), self.u64()
        if item == GGUFValueType.ARRAY and depth >= MAX_ARRAY_DEPTH:
            raise ModelLoadError(f"arrays are nested more than {MAX_ARRAY_DEPTH} deep (at byte {at})")
        if count > MAX_ARRAY:
            raise ModelLoadError(f"an array at byte {at} declares {count} items (at most {MAX_ARRAY} allowed)")
        item_bytes = MIN_ITEM_BYTES.get(item) or _SCALARS[item].itemsize
        if count * item_bytes > self.left:
            raise _Truncated(f"an array of {count} {item.name} items at byte {at} cannot fit in the "
                             f"{self.left} bytes left")
        if item == GGUFValueType.STRING:
            return [self.string() for _ in range(count)]
        if item == GGUFValueType.ARRAY:
            return [self.array(depth + 1) for _ in range(count)]
        dtype = _SCALARS[item]
        return np.frombuffer(self.buf, dtype, count, self.take(count * dtype.itemsize)).tolist()


def _value_type(kind: int, pos: int) -> GGUFValueType:
    try:
        return GGUFValueType(kind)
    except ValueError:
        raise ModelLoadError(f"unknown metadata value type {kind} at byte {pos}: the file is corrupt") from None


def _alignment(kind: int, value: object) -> int:
    """general.alignment: a UINT32 (as llama.cpp requires), a power of two and a multiple of 8 (as the
    GGUF specification does: every tensor then starts on a boundary its element type can be read from)."""
    if kind != GGUFValueType.UINT32 or not isinstance(value, int) or value < MIN_ALIGNMENT or value & (value - 1):
        shown_value = shown(value) if kind == GGUFValueType.UINT32 else f"a {GGUFValueType(kind).name}"
        raise ModelLoadError(f"general.alignment must be a UINT32 power of two of at least {MIN_ALIGNMENT}, "
                             f"got {shown_value}")
    return value


class GGUFFile:
    """One GGUF file: ``metadata`` (key -> value), ``tensors`` (name -> TensorInfo), ``raw(name)``."""

    def __init__(self, path: PathArg) -> None:
        self.path = Path(path)
        if not self.path.is_file():
            what = "is a directory, not a GGUF file" if self.path.is_dir() else "does not exist"
            raise ModelLoadError(f"{self.path} {what}")
        try:
            with open(self.path, "rb") as f:
                head = f.read(8)
                if len(head) < 8:
                    raise ModelLoadError(f"{self.path} is not a GGUF file: it holds only {len(head)} bytes")
                self._check_magic_and_version(head)
                self._map = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
        except OSError as e:
            raise ModelLoadError(f"cannot read {self.path}: {e}") from None
        try:
            self._parse()
        except _Truncated as e:
            raise ModelLoadError(f"{self.path} is truncated or corrupt: {e}") from None
        except ModelLoadError as e:
            raise ModelLoadError(f"{self.path}: {e}") from None

    def _check_magic_and_version(self, head: bytes) -> None:
        if head[:4] != MAGIC:
            raise ModelLoadError(f"{self.path} is not a GGUF file: it starts with {head[:4]!r}, not {MAGIC!r}")
        (version,) = struct.unpack("<I", head[4:8])
        if version not in VERSIONS and version & 0xFFFF == 0:
            raise ModelLoadError(f"{self.path} is a big-endian GGUF file; llaisys reads little-endian ones only")
        if version not in VERSIONS:
            raise ModelLoadError(f"{self.path} is GGUF version {version}; llaisys reads versions "
                                 f"{' and '.join(map(str, VERSIONS))}")
        self.version = version

    def _parse(self) -> None:
        cur = _Cursor(self._map, 8)
        tensor_count, kv_count = cur.u64(), cur.u64()
        if tensor_count * MIN_TENSOR_BYTES + kv_count * MIN_KV_BYTES > cur.left:
            raise _Truncated(f"the header declares {tensor_count} tensors and {kv_count} metadata keys, more than "
                             f"the {cur.left} bytes after it can hold")
        self.metadata: dict[str, object] = {}
        alignment = GGUF_DEFAULT_ALIGNMENT
        for i in range(kv_count):
            key = cur.string(f"metadata key {i}")
            if not key:
                raise ModelLoadError(f"metadata key {i} is empty")
            if key in self.metadata:
                raise ModelLoadError(f"metadata key {shown(key)} appears twice")
            kind = cur.u32()
            try:
                self.metadata[key] = value = cur.value(kind)
            except _Truncated as e:
                raise _Truncated(f"metadata key {shown(key)}: {e}") from None
            except ModelLoadError as e:
                raise ModelLoadError(f"metadata key {shown(key)}: {e}") from None
            if key == "general.alignment":
                alignment = _alignment(kind, value)

        table = []
        for i in range(tensor_count):
            name = cur.string(f"the name of tensor {i}", limit=MAX_NAME - 1)
            n_dims = cur.u32()
            if not 1 <= n_dims <= MAX_DIMS:
                raise ModelLoadError(f"tensor {name!r} has {n_dims} dimensions (1..{MAX_DIMS} allowed)")
            dims = cur.unpack(f"<{n_dims}Q")
            type_id, offset = cur.u32(), cur.u64()
            table.append((name, dims, type_id, offset))

        data_start = -(-cur.pos // alignment) * alignment  # the data section starts at the next aligned byte
        if table and data_start > len(self._map):
            raise _Truncated(f"the data section would start at byte {data_start}, past the end of the file "
                             f"({len(self._map)} bytes)")
        self.tensors: dict[str, TensorInfo] = {}
        for name, dims, type_id, offset in table:
            if name in self.tensors:
                raise ModelLoadError(f"tensor {name!r} appears twice")
            self.tensors[name] = self._tensor_info(name, dims, type_id, offset, data_start, alignment)

    def _tensor_info(self, name: str, dims: tuple[int, ...], type_id: int, offset: int, data_start: int,
                     alignment: int) -> TensorInfo:
        """The tensor's entry, once its type, size and place (``offset`` into the data section) are checked."""
        try:
            qtype = GGMLQuantizationType(type_id)
        except ValueError:
            raise ModelLoadError(f"tensor {name!r} has ggml type id {type_id}, which the installed gguf package "
                                 f"does not know (a newer quantization type?)") from None
        block, type_size = GGML_QUANT_SIZES[qtype]
        shape = tuple(int(d) for d in reversed(dims))
        if math.prod(shape) > MAX_ELEMENTS:
            raise ModelLoadError(f"tensor {name!r} has shape {shape}: more than {MAX_ELEMENTS} elements")
        if shape[-1] % block:
            raise ModelLoadError(f"tensor {name!r}: rows of {shape[-1]} values are not whole {qtype.name} blocks "
                                 f"of {block}")
        if offset % alignment:
            raise ModelLoadError(f"tensor {name!r} is at offset {offset} of the data section, which is not a "
                                 f"multiple of general.alignment ({alignment})")
        nbytes = math.prod(shape) // block * type_size
        start, end = data_start + offset, data_start + offset + nbytes
        if end > len(self._map):
            raise _Truncated(f"tensor {name!r} lies at bytes [{start}, {end}) but the file ends at "
                             f"{len(self._map)} (an incomplete download?)")
        return TensorInfo(name, qtype, shape, start, nbytes)

    # -- access ---------------------------------------------------------------------

    @property
    def architecture(self) -> str | None:
        arch = self.metadata.get("general.architecture")
        return arch if isinstance(arch, str) else None

    def raw(self, name: str) -> np.ndarray:
        """The stored bytes of a tensor as uint8 [rows, bytes per row], a view of the mapping."""
        info = self.tensors[name]
        return np.frombuffer(self._map, np.uint8, info.nbytes, info.offset).reshape(info.rows, info.row_bytes)

    @property
    def mapping(self) -> mmap.mmap:
        return self._map

    def populate(self, name: str, rows: tuple[int, int]) -> None:
        """Fault in the mapped pages of a tensor's rows [start, end) with one madvise call (MADV_POPULATE_READ,
        Linux >= 5.14; elsewhere they fault in as they are read): one call instead of a fault per 4 KiB page."""
        info = self.tensors[name]
        offset, nbytes = info.offset + rows[0] * info.row_bytes, (rows[1] - rows[0]) * info.row_bytes
        start = offset - offset % mmap.PAGESIZE
        try:
            self._map.madvise(MADV_POPULATE_READ, start, min(offset + nbytes, len(self._map)) - start)
        except (OSError, ValueError):
            pass

    def release(self, name: str, rows: tuple[int, int] | None = None) -> None:
        """Drop a tensor's mapped pages (those of its stored rows [start, stop) when given) from this process's
        resident set once their bytes were converted (the file stays in the page cache; a later read faults
        them back in)."""
        info = self.tensors[name]
        first, stop = rows or (0, info.rows)
        offset, nbytes = info.offset + first * info.row_bytes, (stop - first) * info.row_bytes
        if not hasattr(mmap, "MADV_DONTNEED") or nbytes <= 0:
            return
        start = offset - offset % mmap.PAGESIZE
        end = min(offset + nbytes, len(self._map))
        self._map.madvise(mmap.MADV_DONTNEED, start, end - start)

    def __repr__(self) -> str:
        return f"GGUFFile({str(self.path)!r}, {self.architecture!r}, {len(self.tensors)} tensors)"
