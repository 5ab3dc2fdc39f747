"""The C ABI of ``llaisys/backend.h`` as Python tables: codes, enums and every slot's C signature.

This module only describes; ``llaisys.native`` binds a library with it. The header is the
single definition of the ABI and ``tests/core/test_abi_header.py`` parses it and checks that
every name, value, slot kind and argument type below matches it exactly.

C types map to ctypes as: ``int`` c_int, ``int64_t`` c_int64, ``uint64_t`` c_uint64, ``size_t``
c_size_t, ``double`` c_double, ``void*`` (const or not) c_void_p, a returned ``const char*``
c_char_p, any other ``T*`` POINTER(T).
"""

from __future__ import annotations

import enum
from ctypes import POINTER, c_char, c_char_p, c_double, c_float, c_int, c_int64, c_size_t, c_uint64, c_void_p

# The ABI's version, major.minor (backend.h explains the policy). A library's api_version() is
# major * 1000 + minor; one built before minors existed returns its plain major (< 1000), read as major.0.
API_MAJOR = 6  # LLAISYS_API_VERSION_MAJOR: bumped by a breaking change; another major is refused
API_MINOR = 4  # LLAISYS_API_VERSION_MINOR: bumped by a compatible one (a new optional or op slot)
API_VERSION = API_MAJOR * 1000 + API_MINOR  # LLAISYS_API_VERSION
UNIQUE_ID_BYTES = 128  # LLAISYS_UNIQUE_ID_BYTES: a communicator's unique id (comm_unique_id)


class Status(enum.IntEnum):  # llaisys_status_t, LLAISYS_<name>
    OK = 0
    INVALID_ARGUMENT = 1  # raised as LlaisysValueError
    RUNTIME_ERROR = 2
    OUT_OF_MEMORY = 3  # raised as OutOfMemoryError
    NOT_SUPPORTED = 4


class DTypeCode(enum.IntEnum):  # llaisys_dtype_t, LLAISYS_<name>; llaisys.DType.code
    F32 = 0
    F16 = 1
    BF16 = 2
    F64 = 3
    I8 = 4
    I32 = 5
    I64 = 6
    U8 = 7
    BOOL = 8


class MemcpyKind(enum.IntEnum):  # llaisys_memcpy_kind_t, LLAISYS_MEMCPY_<name>
    H2H = 0
    H2D = 1
    D2H = 2
    D2D = 3


class Numerics(enum.IntEnum):  # llaisys_numerics_t, LLAISYS_NUMERICS_<name>
    EXACT = 0  # f32 inside, one rounding to the output dtype
    HF = 1  # f16 / bf16: round where HF transformers' default (sdpa) forward rounds


class QFormat(enum.IntEnum):  # llaisys_qformat_t, LLAISYS_QFORMAT_<name>; llaisys.ops.quant's formats
    Q8_0 = 0
    Q4_0 = 1
    Q4_1 = 2
    Q4_K = 3
    Q6_K = 4


class KVFormat(enum.IntEnum):  # llaisys_kv_format_t, LLAISYS_KV_<name>; a quantized paged KV cache's bytes
    INT8 = 1
    FP8_E4M3 = 2


class DeviceAttr(enum.IntEnum):  # llaisys_device_attr_t, LLAISYS_ATTR_<name>
    HOST_ADDRESSABLE = 0
    WARP_SIZE = 1
    MAX_THREADS_PER_BLOCK = 2
    MULTIPROCESSOR_COUNT = 3
    TOTAL_MEMORY = 4
    COMPUTE_CAPABILITY = 5
    MAX_SHARED_MEMORY_PER_BLOCK = 6


# (C enum type, Python enum, prefix of its constants) for every enum of the header
ENUMS = [("llaisys_status", Status, "LLAISYS_"), ("llaisys_dtype", DTypeCode, "LLAISYS_"),
         ("llaisys_memcpy_kind", MemcpyKind, "LLAISYS_MEMCPY_"), ("llaisys_numerics", Numerics, "LLAISYS_NUMERICS_"),
         ("llaisys_qformat", QFormat, "LLAISYS_QFORMAT_"), ("llaisys_kv_format", KVFormat, "LLAISYS_KV_"),
         ("llaisys_device_attr", DeviceAttr, "LLAISYS_ATTR_")]


class SlotKind(enum.Enum):
    REQUIRED = "required"  # the library fails to load without it
    OPTIONAL = "optional"  # missing: the capability it belongs to is "not supported"
    OP = "op"  # an operator; missing: "op not implemented by this backend" when first used


REQUIRED, OPTIONAL, OP = SlotKind.REQUIRED, SlotKind.OPTIONAL, SlotKind.OP
_p = c_void_p
_out_p = POINTER(c_void_p)  # void** (a handle or pointer written by the callee)

# Runtime slots in header order: name -> (kind, return type, argument types)
RUNTIME_SLOTS: dict[str, tuple[SlotKind, object, list]] = {
    "api_version": (REQUIRED, c_int, []),
    "last_error": (REQUIRED, c_char_p, []),
    "build_info": (OPTIONAL, c_char_p, []),
    "device_count": (REQUIRED, c_int, [POINTER(c_int)]),
    "device_attribute": (OPTIONAL, c_int, [c_int, c_int, POINTER(c_int64)]),
    "device_name": (OPTIONAL, c_int, [c_int, POINTER(c_char), c_size_t]),
    "mem_info": (OPTIONAL, c_int, [c_int, POINTER(c_size_t), POINTER(c_size_t)]),
    "device_synchronize": (REQUIRED, c_int, [c_int]),
    "malloc": (REQUIRED, c_int, [c_int, c_size_t, _out_p]),
    "free": (REQUIRED, c_int, [c_int, _p]),
    "malloc_host": (OPTIONAL, c_int, [c_size_t, _out_p]),
    "free_host": (OPTIONAL, c_int, [_p]),
    "memset": (REQUIRED, c_int, [c_int, _p, c_int, c_size_t, _p]),
    "memcpy": (REQUIRED, c_int, [c_int, _p, _p, c_size_t, c_int]),
    "memcpy_async": (REQUIRED, c_int, [c_int, _p, _p, c_size_t, c_int, _p]),
    "memcpy_peer": (OPTIONAL, c_int, [c_int, _p, c_int, _p, c_size_t, _p]),
    "stream_create": (REQUIRED, c_int, [c_int, _out_p]),
    "stream_destroy": (REQUIRED, c_int, [c_int, _p]),
    "stream_synchronize": (REQUIRED, c_int, [c_int, _p]),
    "event_create": (OPTIONAL, c_int, [c_int, _out_p]),
    "event_destroy": (OPTIONAL, c_int, [c_int, _p]),
    "event_record": (OPTIONAL, c_int, [c_int, _p, _p]),
    "event_synchronize": (OPTIONAL, c_int, [c_int, _p]),
    "event_elapsed_ms": (OPTIONAL, c_int, [c_int, _p, _p, POINTER(c_float)]),
    "stream_wait_event": (OPTIONAL, c_int, [c_int, _p, _p]),
    "graph_begin_capture": (OPTIONAL, c_int, [c_int, _p]),
    "graph_end_capture": (OPTIONAL, c_int, [c_int, _p, _out_p]),
    "graph_launch": (OPTIONAL, c_int, [c_int, _p, _p]),
    "graph_destroy": (OPTIONAL, c_int, [c_int, _p]),
    # collectives: device, id (char [UNIQUE_ID_BYTES]); device, id, rank, world_size, timeout_ms, comm*; ...
    "comm_unique_id": (OPTIONAL, c_int, [c_int, POINTER(c_char)]),
    "comm_create": (OPTIONAL, c_int, [c_int, POINTER(c_char), c_int, c_int, c_int64, _out_p]),
    "comm_destroy": (OPTIONAL, c_int, [_p]),
    "comm_abort": (OPTIONAL, c_int, [_p, POINTER(c_char)]),
    # device, stream, comm, dtype, n, out [n], in [n]
    "comm_all_reduce": (OPTIONAL, c_int, [c_int, _p, _p, c_int, c_int64, _p, _p]),
    # device, stream, comm, nbytes, out [world_size * nbytes], in [nbytes]
    "comm_all_gather": (OPTIONAL, c_int, [c_int, _p, _p, c_int64, _p, _p]),
    # device, stream, comm, nbytes, data [nbytes], root
    "comm_broadcast": (OPTIONAL, c_int, [c_int, _p, _p, c_int64, _p, c_int]),
}

_i64 = c_int64
# Operator slots: int <prefix>_<op>(int device, void* stream, <these>); name -> argument types after the stream
OP_SLOTS: dict[str, list] = {
    # dtype, n, c, a, b
    "add": [c_int, _i64, _p, _p, _p],
    # dtype, n, max_idx (int64*), max_val, vals
    "argmax": [c_int, _i64, _p, _p, _p],
    # dtype, n_index, dim, vocab, out [n,dim], index int64 [n], weight [vocab,dim]
    "embedding": [c_int, _i64, _i64, _i64, _p, _p, _p],
    # dtype, M, N, K, out [M,N], x [M,K], weight [N,K], bias [N] or NULL
    "linear": [c_int, _i64, _i64, _i64, _p, _p, _p, _p],
    # dtype, M, N, K, out [M,N], x [M,K], weight int8 [NB,G,8,16,4] and scales bf16 [NB,G,16] (blocks of 16 rows,
    # NB = ceil(N/16), G = ceil(K/32): llaisys.ops.int8), bias [N] or NULL
    "linear_i8": [c_int, _i64, _i64, _i64, _p, _p, _p, _p, _p],
    # dtype, M, E, k, normalize, weights [M,k], experts int64 [M,k], logits [M,E]
    "moe_router": [c_int, _i64, _i64, _i64, c_int, _p, _p, _p],
    # dtype, M, E, k, scoring (0 softmax, 1 sigmoid), n_group, topk_group, group_top, normalize, route_scale,
    # weights [M,k] (dtype), experts int64 [M,k], logits f32 [M,E], bias f32 [E] or NULL
    "moe_router_grouped": [c_int, _i64, _i64, _i64, c_int, _i64, _i64, _i64, c_int, c_double, _p, _p, _p, _p],
    # dtype, M, k, E, N, K, x_per_slot, out [M,k,N], x [M,K] or [M,k,K], weight [E,N,K], experts int64 [M,k]
    "moe_linear": [c_int, _i64, _i64, _i64, _i64, _i64, c_int, _p, _p, _p, _p],
    # dtype, M, k, N, out [M,N], y [M,k,N], weights [M,k]
    "moe_combine": [c_int, _i64, _i64, _i64, _p, _p, _p],
    # elem_size, ndim, shape*, dst, dst_strides*, src, src_strides* (strides in elements)
    "rearrange": [c_int, c_int, POINTER(c_int64), _p, POINTER(c_int64), _p, POINTER(c_int64)],
    # dtype, numerics, weight_dtype (dtype, or F32 with F16 / BF16), rows, dim, eps, out, x, weight
    "rms_norm": [c_int, c_int, c_int, _i64, _i64, c_double, _p, _p, _p],
    # dtype, numerics, seq, heads, head_dim, scale, out, x, pos_ids int64 [seq], inv_freq f32 [head_dim / 2]
    "rope": [c_int, c_int, _i64, _i64, _i64, c_double, _p, _p, _p, _p],
    # dtype, numerics, L, S, H, Hkv, d, dv, scale, out [L,H,dv], q [L,H,d], k [S,Hkv,d], v [S,Hkv,dv]
    "self_attention": [c_int, c_int, _i64, _i64, _i64, _i64, _i64, _i64, c_double, _p, _p, _p, _p],
    # dtype, numerics, T, num_seqs, H, Hkv, d, dv, num_blocks, block_size, max_blocks, window (0: none), scale,
    # out [T,H,dv], q [T,H,d], k_cache [blocks,bs,Hkv,d], v_cache [blocks,bs,Hkv,dv], block_tables int32
    # [num_seqs,max_blocks], seq_lens int32 [num_seqs], query_start int32 [num_seqs+1]
    "paged_attention": [c_int, c_int, _i64, _i64, _i64, _i64, _i64, _i64, _i64, _i64, _i64, _i64, c_double,
                        _p, _p, _p, _p, _p, _p, _p],
    # dtype, T, Hkv, d, dv, num_slots, k_cache, v_cache, k [T,Hkv,d], v [T,Hkv,dv], slot_mapping int64 [T]
    "paged_kv_write": [c_int, _i64, _i64, _i64, _i64, _i64, _p, _p, _p, _p, _p],
    # dtype, kv_format (KVFormat), T, num_seqs, H, Hkv, d, dv, num_blocks, block_size, max_blocks, window, scale,
    # out, q, k_cache uint8 [blocks,bs,Hkv,d], v_cache uint8 [blocks,bs,Hkv,dv], k_scale f16 [blocks,bs,Hkv],
    # v_scale f16 [blocks,bs,Hkv], block_tables, seq_lens, query_start (as paged_attention's)
    "paged_attention_q": [c_int, c_int, _i64, _i64, _i64, _i64, _i64, _i64, _i64, _i64, _i64, _i64, c_double,
                          _p, _p, _p, _p, _p, _p, _p, _p, _p],
    # dtype (of k and v), kv_format, T, Hkv, d, dv, num_slots, k_cache, v_cache, k_scale, v_scale, k, v,
    # slot_mapping
    "paged_kv_write_q": [c_int, c_int, _i64, _i64, _i64, _i64, _i64, _p, _p, _p, _p, _p, _p, _p],
    # dtype, T, num_seqs, H, dc, dr, num_blocks, block_size, max_blocks, scale, out [T,H,dc], q [T,H,dc+dr],
    # c_cache [blocks,bs,dc], r_cache [blocks,bs,dr], block_tables, seq_lens, query_start (as paged_attention's)
    "paged_latent_attention": [c_int, _i64, _i64, _i64, _i64, _i64, _i64, _i64, _i64, c_double, _p, _p, _p, _p,
                               _p, _p, _p],
    # dtype, numerics, n, out, gate, up
    "swiglu": [c_int, c_int, _i64, _p, _p, _p],
    # dtype, n, out_idx int64 [1], logits [n], temperature, top_k, top_p, seed
    "sample": [c_int, _i64, _p, _p, c_double, _i64, c_double, c_uint64],
    # dtype, rows, vocab, logits [rows,vocab] (in place), bitmask int32 [rows,ceil(vocab/32)]
    "mask_logits": [c_int, _i64, _i64, _p, _p],
    # dtype, vocab, n, logits [vocab], ids int64 [n], counts int64 [n,2], bias f32 [n] or NULL, repetition,
    # frequency, presence
    "penalize_logits": [c_int, _i64, _i64, _p, _p, _p, _p, c_double, c_double, c_double],
    # dtype, n, logits [n], chosen, temperature, k, top_ids int64 [k] or NULL, values f32 [k + 1]
    "logprobs": [c_int, _i64, _p, _i64, c_double, _i64, _p, _p],
    # dtype, numerics, n, out, gate, up
    "geglu_tanh": [c_int, c_int, _i64, _p, _p, _p],
    # dtype, n, factor, out, x
    "scale": [c_int, _i64, c_double, _p, _p],
    # dtype, M, k, E, N, K, x_per_slot, out [M,k,N], x [M,K] or [M,k,K], weight int8 [E,NB,G,8,16,4], scales bf16
    # [E,NB,G,16] (each expert's linear_i8 blocks), experts int64 [M,k]
    "moe_linear_i8": [c_int, _i64, _i64, _i64, _i64, _i64, c_int, _p, _p, _p, _p, _p],
    # dtype, fmt (QFormat), M, N, K, out [M,N], x [M,K], weight and scales uint8 (blocks of 16 rows in format fmt:
    # llaisys.ops.quant), bias [N] or NULL
    "linear_q": [c_int, c_int, _i64, _i64, _i64, _p, _p, _p, _p, _p],
    # dtype, fmt, n_index, dim, vocab, out [n,dim], index int64 [n], weight and scales uint8 (as linear_q's)
    "embedding_q": [c_int, c_int, _i64, _i64, _i64, _p, _p, _p, _p],
    # dtype, bits (4 / 8), group_size, perm_dtype (I32 / I64), M, N, K, out [M,N], x [M,K], weight uint8
    # [NB,K*bits/32,64], scales f16 [NB,G,16], zeros uint8 [NB,G,16] (llaisys.ops.gq), bias [N] or NULL, perm [K] or NULL
    "linear_gq": [c_int, c_int, _i64, c_int, _i64, _i64, _i64, _p, _p, _p, _p, _p, _p, _p],
    # dtype (of x and a), M, K, R, S, h f32 [M,R], x [M,K], a [S,R,K], adapters int64 [M] (-1: none), scales f32 [S]
    "lora_shrink": [c_int, _i64, _i64, _i64, _i64, _p, _p, _p, _p, _p],
    # dtype (of out and b), M, R, N, S, out [M,N] (in place), h f32 [M,R], b [S,R,N], adapters int64 [M] (-1: none)
    "lora_expand": [c_int, _i64, _i64, _i64, _i64, _p, _p, _p, _p],
    # dtype, fmt (QFormat), M, k, E, N, K, x_per_slot, out [M,k,N], x [M,K] or [M,k,K], weight and scales uint8 [E,..]
    # (each expert's linear_q blocks of format fmt), experts int64 [M,k]
    "moe_linear_q": [c_int, c_int, _i64, _i64, _i64, _i64, _i64, c_int, _p, _p, _p, _p, _p],
}
OP_LEADING_ARGS = [c_int, _p]  # (int device, void* stream) before every operator's own arguments

# Capabilities a backend reports, each the set of optional slots it needs (every optional slot is in one).
CAPABILITIES: dict[str, tuple[str, ...]] = {
    "build_info": ("build_info",),
    "device_attributes": ("device_attribute",),
    "device_name": ("device_name",),
    "mem_info": ("mem_info",),
    "pinned_host": ("malloc_host", "free_host"),
    "peer_copy": ("memcpy_peer",),
    "events": ("event_create", "event_destroy", "event_record", "event_synchronize", "stream_wait_event"),
    "event_timing": ("event_elapsed_ms",),
    "graphs": ("graph_begin_capture", "graph_end_capture", "graph_launch", "graph_destroy"),
    "collectives": ("comm_unique_id", "comm_create", "comm_destroy", "comm_abort", "comm_all_reduce",
                    "comm_all_gather", "comm_broadcast"),
}

# The minor version of API_MAJOR that added a slot, for the slots added after API_MAJOR.0 (backend.h lists the
# same). A library built for an older minor lacks them: core treats them as missing even if it exports the name.
SLOT_SINCE: dict[str, int] = {"linear_gq": 1, "lora_shrink": 2, "lora_expand": 2, "paged_attention_q": 3,
                               "paged_kv_write_q": 3, "moe_linear_q": 3, "paged_latent_attention": 4,
                               "moe_router_grouped": 4}


def split_version(version: int) -> tuple[int, int]:
    """(major, minor) of an ``api_version()`` value (a plain major below 1000 is major.0)."""
    return (version // 1000, version % 1000) if version >= 1000 else (version, 0)


def version_text(version: int) -> str:
    """``api_version()`` as people read it: "6.0"."""
    return "{}.{}".format(*split_version(version))


def slot_in(slot: str, version: int) -> bool:
    """Whether ``slot`` exists in the ABI a library of ``version`` (of core's major) was built for."""
    return SLOT_SINCE.get(slot, 0) <= split_version(version)[1]


INT64_MAX = (1 << 63) - 1
UINT64_MAX = (1 << 64) - 1
