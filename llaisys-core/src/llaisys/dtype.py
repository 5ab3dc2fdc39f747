"""Data types: one enum shared by Python and the native kernels (``DType.code``)."""

from __future__ import annotations

import enum
import functools

import numpy as np

from .abi import DTypeCode
from .errors import LlaisysValueError


class DType(enum.Enum):
    # value = (code passed to kernels, itemsize, numpy dtype, DLPack (code, bits)); bfloat16's numpy dtype
    # is ml_dtypes', imported on first use (its extension takes ~1 s to import, and only host arrays need it)
    float32 = (DTypeCode.F32, 4, np.dtype(np.float32), (2, 32))
    float16 = (DTypeCode.F16, 2, np.dtype(np.float16), (2, 16))
    bfloat16 = (DTypeCode.BF16, 2, None, (4, 16))
    float64 = (DTypeCode.F64, 8, np.dtype(np.float64), (2, 64))
    int8 = (DTypeCode.I8, 1, np.dtype(np.int8), (0, 8))
    int32 = (DTypeCode.I32, 4, np.dtype(np.int32), (0, 32))
    int64 = (DTypeCode.I64, 8, np.dtype(np.int64), (0, 64))
    uint8 = (DTypeCode.U8, 1, np.dtype(np.uint8), (1, 8))
    bool_ = (DTypeCode.BOOL, 1, np.dtype(np.bool_), (6, 8))

    # Members are singletons compared by identity: hash them by identity too (C speed, unlike Enum's).
    __hash__ = object.__hash__

    @property
    def code(self) -> int:
        """The llaisys_dtype_t code of ``llaisys/backend.h``."""
        return int(self.value[0])

    @property
    def itemsize(self) -> int:
        return self.value[1]

    @property
    def numpy(self) -> np.dtype:
        dtype = self.value[2]
        return _bfloat16_numpy() if dtype is None else dtype

    @property
    def dlpack(self) -> tuple[int, int]:
        return self.value[3]

    @property
    def is_floating_point(self) -> bool:
        return self in (DType.float32, DType.float16, DType.bfloat16, DType.float64)

    def __repr__(self) -> str:
        return f"llaisys.{self.name}"

    __str__ = __repr__


float32 = DType.float32
float16 = DType.float16
bfloat16 = DType.bfloat16
float64 = DType.float64
int8 = DType.int8
int32 = DType.int32
int64 = DType.int64
uint8 = DType.uint8
bool_ = DType.bool_

@functools.cache
def _bfloat16_numpy() -> np.dtype:
    import ml_dtypes

    return np.dtype(ml_dtypes.bfloat16)


_BY_NUMPY = {d.value[2]: d for d in DType if d.value[2] is not None}
_BY_DLPACK = {d.dlpack: d for d in DType}
_BY_NAME = {d.name: d for d in DType} | {"bool": DType.bool_, "bf16": DType.bfloat16,
                                          "f32": DType.float32, "f16": DType.float16,
                                          "half": DType.float16, "float": DType.float32}


def as_dtype(value) -> DType:
    """Accept a DType, a name ("bfloat16", "bf16") or a numpy dtype."""
    if isinstance(value, DType):
        return value
    if isinstance(value, str):
        if value in _BY_NAME:
            return _BY_NAME[value]
        raise LlaisysValueError(f"unknown dtype name {value!r}; known: {sorted(_BY_NAME)}")
    try:
        dtype = np.dtype(value)
    except TypeError:
        raise LlaisysValueError(f"unsupported dtype {value!r}") from None
    if dtype in _BY_NUMPY:
        return _BY_NUMPY[dtype]
    # a numpy bfloat16 exists only once ml_dtypes (or a library built on it) is imported: no import here
    if dtype.name == "bfloat16" and dtype == DType.bfloat16.numpy:
        return DType.bfloat16
    raise LlaisysValueError(f"unsupported dtype {value!r}")


def from_dlpack_code(code: int, bits: int, lanes: int) -> DType:
    if lanes != 1 or (code, bits) not in _BY_DLPACK:
        raise LlaisysValueError(f"unsupported DLPack dtype (code={code}, bits={bits}, lanes={lanes})")
    return _BY_DLPACK[(code, bits)]
