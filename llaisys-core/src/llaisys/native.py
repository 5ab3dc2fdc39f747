"""The C ABI every compiled backend exports, bound once with ctypes.

The ABI is defined in one place, the C header ``llaisys/backend.h`` that core ships
(``llaisys.get_include()``): status codes, dtype codes, memcpy kinds, the API version and
every slot with its contract. The tables below mirror it for ctypes, and
``tests/core/test_abi_header.py`` checks that they do. A backend library exports
``<prefix>_<slot>``; ops are ``int <prefix>_<op>(int device, void* stream, ...)`` with the
arguments of ``OP_SIGNATURES``. An operator whose symbol is missing is reported as not
implemented by that backend.
"""

from __future__ import annotations

import ctypes
import enum
from ctypes import c_char_p, c_double, c_int, c_int64, c_size_t, c_uint64, c_void_p
from pathlib import Path

from .errors import LlaisysError, LlaisysValueError


class Status(enum.IntEnum):
    OK = 0
    INVALID_ARGUMENT = 1  # raised as LlaisysValueError
    RUNTIME_ERROR = 2
    OUT_OF_MEMORY = 3
    NOT_SUPPORTED = 4


class MemcpyKind(enum.IntEnum):
    H2H = 0
    H2D = 1
    D2H = 2
    D2D = 3


class Numerics(enum.IntEnum):
    EXACT = 0  # f32 inside, one rounding to the output dtype
    HF = 1  # round where HF transformers' eager forward rounds


NUMERICS_EXACT = int(Numerics.EXACT)


def get_include() -> str:
    """The folder that holds ``llaisys/backend.h``, the C ABI header (pass it to the compiler with -I)."""
    return str(Path(__file__).with_name("include"))


_p = c_void_p
_i64 = c_int64
# op name -> argument types after (int device, void* stream)
OP_SIGNATURES: dict[str, list] = {
    # dtype, n, c, a, b
    "add": [c_int, _i64, _p, _p, _p],
    # dtype, n, max_idx (int64*), max_val, vals
    "argmax": [c_int, _i64, _p, _p, _p],
    # dtype, n_index, dim, vocab, out [n,dim], index int64 [n], weight [vocab,dim]
    "embedding": [c_int, _i64, _i64, _i64, _p, _p, _p],
    # dtype, M, N, K, out [M,N], x [M,K], weight [N,K], bias [N] or NULL
    "linear": [c_int, _i64, _i64, _i64, _p, _p, _p, _p],
    # elem_size, ndim, shape*, dst, dst_strides*, src, src_strides* (strides in elements)
    "rearrange": [c_int, c_int, _p, _p, _p, _p, _p],
    # dtype, numerics, rows, dim, eps, out, x, weight
    "rms_norm": [c_int, c_int, _i64, _i64, c_double, _p, _p, _p],
    # dtype, numerics, seq, heads, head_dim, theta, out, x, pos_ids int64 [seq]
    "rope": [c_int, c_int, _i64, _i64, _i64, c_double, _p, _p, _p],
    # dtype, numerics, L, S, H, Hkv, d, dv, scale, out [L,H,dv], q [L,H,d], k [S,Hkv,d], v [S,Hkv,dv]
    "self_attention": [c_int, c_int, _i64, _i64, _i64, _i64, _i64, _i64, c_double, _p, _p, _p, _p],
    # dtype, numerics, T, num_seqs, H, Hkv, d, dv, num_blocks, block_size, max_blocks, scale, out [T,H,dv],
    # q [T,H,d], k_cache [blocks,bs,Hkv,d], v_cache [blocks,bs,Hkv,dv], block_tables int32 [num_seqs,max_blocks],
    # seq_lens int32 [num_seqs], query_start int32 [num_seqs+1]
    "paged_attention": [c_int, c_int, _i64, _i64, _i64, _i64, _i64, _i64, _i64, _i64, _i64, c_double,
                        _p, _p, _p, _p, _p, _p, _p],
    # dtype, T, Hkv, d, dv, num_slots, k_cache, v_cache, k [T,Hkv,d], v [T,Hkv,dv], slot_mapping int64 [T]
    "paged_kv_write": [c_int, _i64, _i64, _i64, _i64, _i64, _p, _p, _p, _p, _p],
    # dtype, numerics, n, out, gate, up
    "swiglu": [c_int, c_int, _i64, _p, _p, _p],
    # dtype, n, out_idx int64 [1], logits [n], temperature, top_k, top_p, seed
    "sample": [c_int, _i64, _p, _p, c_double, _i64, c_double, c_uint64],
}


def _shape_array(values) -> ctypes.Array:
    return (c_int64 * len(values))(*values)


# op name -> packer(*op args) -> C arguments after (device, stream)
_PACKERS = {
    "add": lambda c, a, b: (c.dtype.code, c.numel(), c.data_ptr(), a.data_ptr(), b.data_ptr()),
    "argmax": lambda max_idx, max_val, vals: (
        vals.dtype.code, vals.numel(), max_idx.data_ptr(), max_val.data_ptr(), vals.data_ptr()),
    "embedding": lambda out, index, weight: (
        out.dtype.code, index.shape[0], weight.shape[1], weight.shape[0],
        out.data_ptr(), index.data_ptr(), weight.data_ptr()),
    "linear": lambda out, x, weight, bias: (
        out.dtype.code, x.shape[0], weight.shape[0], weight.shape[1],
        out.data_ptr(), x.data_ptr(), weight.data_ptr(), bias.data_ptr() if bias is not None else None),
    "rearrange": lambda out, x: (
        out.dtype.itemsize, out.ndim, _shape_array(out.shape),
        out.data_ptr(), _shape_array(out.strides), x.data_ptr(), _shape_array(x.strides)),
    "rms_norm": lambda out, x, weight, eps: (
        out.dtype.code, NUMERICS_EXACT, x.numel() // x.shape[-1], x.shape[-1], eps,
        out.data_ptr(), x.data_ptr(), weight.data_ptr()),
    "rope": lambda out, x, pos_ids, theta: (
        out.dtype.code, NUMERICS_EXACT, x.shape[0], x.shape[1], x.shape[2], theta,
        out.data_ptr(), x.data_ptr(), pos_ids.data_ptr()),
    "self_attention": lambda out, q, k, v, scale: (
        out.dtype.code, NUMERICS_EXACT, q.shape[0], k.shape[0], q.shape[1], k.shape[1], q.shape[2], v.shape[2], scale,
        out.data_ptr(), q.data_ptr(), k.data_ptr(), v.data_ptr()),
    "paged_attention": lambda out, q, k_cache, v_cache, block_tables, seq_lens, query_start, scale: (
        out.dtype.code, NUMERICS_EXACT, q.shape[0], block_tables.shape[0], q.shape[1], k_cache.shape[2], q.shape[2],
        v_cache.shape[3], k_cache.shape[0], k_cache.shape[1], block_tables.shape[1], scale,
        out.data_ptr(), q.data_ptr(), k_cache.data_ptr(), v_cache.data_ptr(), block_tables.data_ptr(),
        seq_lens.data_ptr(), query_start.data_ptr()),
    "paged_kv_write": lambda k_cache, v_cache, k, v, slot_mapping: (
        k.dtype.code, k.shape[0], k.shape[1], k.shape[2], v.shape[2], k_cache.shape[0] * k_cache.shape[1],
        k_cache.data_ptr(), v_cache.data_ptr(), k.data_ptr(), v.data_ptr(), slot_mapping.data_ptr()),
    "swiglu": lambda out, gate, up: (
        out.dtype.code, NUMERICS_EXACT, out.numel(), out.data_ptr(), gate.data_ptr(), up.data_ptr()),
    "sample": lambda out_idx, logits, temperature, top_k, top_p, seed: (
        logits.dtype.code, logits.numel(), out_idx.data_ptr(), logits.data_ptr(),
        temperature, top_k, top_p, seed),
}
assert _PACKERS.keys() == OP_SIGNATURES.keys()


class NativeLibrary:
    """A backend's shared library with its exports bound and its status codes checked."""

    def __init__(self, path: str | Path, prefix: str):
        self.path = str(path)
        self.prefix = prefix
        try:
            self._lib = ctypes.CDLL(self.path)
        except OSError as e:
            raise LlaisysError(f"cannot load native library {self.path}: {e}") from e
        self._last_error = self._bind("last_error", c_char_p, [])
        self.api_version = self._bind("api_version", c_int, [])()
        sigs = {
            "device_count": [_p],
            "malloc": [c_int, c_size_t, _p], "free": [c_int, _p],
            "malloc_host": [c_size_t, _p], "free_host": [_p],
            "memset": [c_int, _p, c_int, c_size_t, _p],
            "memcpy": [c_int, _p, _p, c_size_t, c_int],
            "memcpy_async": [c_int, _p, _p, c_size_t, c_int, _p],
            "stream_create": [c_int, _p], "stream_destroy": [c_int, _p],
            "stream_synchronize": [c_int, _p], "device_synchronize": [c_int],
        }
        self._rt = {name: self._bind(name, c_int, argtypes) for name, argtypes in sigs.items()}

    def _bind(self, name: str, restype, argtypes, required: bool = True):
        symbol = f"{self.prefix}_{name}"
        fn = getattr(self._lib, symbol, None)
        if fn is None:
            if required:
                raise LlaisysError(f"{self.path} does not export {symbol}")
            return None
        fn.restype = restype
        fn.argtypes = argtypes
        return fn

    def raise_status(self, status: int, what: str):
        message = (self._last_error() or b"").decode(errors="replace") or "no message"
        cls = LlaisysValueError if status == Status.INVALID_ARGUMENT else LlaisysError
        raise cls(f"{what}: {message}")

    def call(self, name: str, *args):
        status = self._rt[name](*args)
        if status:
            self.raise_status(status, f"{self.prefix}_{name}")

    def kernel(self, op: str):
        """A callable ``kernel(device_index, stream, *op_args)`` or None if not exported."""
        fn = self._bind(op, c_int, [c_int, c_void_p, *OP_SIGNATURES[op]], required=False)
        if fn is None:
            return None
        pack = _PACKERS[op]
        raise_status = self.raise_status
        what = f"{self.prefix}_{op}"

        def call(device_index, stream, *args):
            status = fn(device_index, stream, *pack(*args))
            if status:
                raise_status(status, what)

        call.__name__ = what
        return call
