"""ABI probes: what every compiled backend library answers at its C boundary (llaisys/backend.h), called
directly with ctypes, below core's checks. Each native backend (abi.NATIVE_BACKENDS) runs the same probes.

Kernels trust core's validation (the header's contract), so there are no probes of bad shapes or
parameters here: only what the header says a library must still answer itself (identity, error
reporting, device indices, allocation failure, memcpy kinds, unknown dtype / numerics codes, and data only
a kernel sees, such as embedding indices).
"""

import ctypes
import shutil
import subprocess
import threading

import numpy as np
import pytest
from abi import CODES, INVALID_ARGUMENT, NOT_SUPPORTED, OK, OUT_OF_MEMORY, RUNTIME_ERROR, SLOTS, DeviceBuffers

from llaisys.abi import UNIQUE_ID_BYTES

OPS = sorted(name for name, slot in SLOTS.items() if slot.kind == "OP")
F32 = CODES["LLAISYS_F32"]
UNKNOWN_DTYPE = 99
UNKNOWN_NUMERICS = 7


def test_every_required_slot_is_exported(native):
    missing = [name for name, slot in SLOTS.items() if slot.kind == "REQUIRED" and not native.has(name)]
    assert not missing, f"{native.path.name} lacks required slots {missing}"


def test_ops_exported(native):
    missing = [op for op in OPS if not native.has(op)]
    assert missing == [op for op in OPS if op in native.backend.missing_ops], \
        f"{native.path.name} lacks op slots {missing}; expected only {list(native.backend.missing_ops)}"


def test_exports_only_prefixed_names(native):
    nm = shutil.which("nm")
    if not nm:
        pytest.skip("needs nm (binutils) to list the dynamic symbol table")
    listing = subprocess.run([nm, "-D", "--defined-only", str(native.path)], capture_output=True, text=True,
                             check=True).stdout
    names = [line.split()[-1] for line in listing.splitlines() if line.strip()]
    foreign = [n for n in names if not n.startswith(native.backend.prefix + "_")]
    assert not foreign, f"{native.path.name} exports names outside {native.backend.prefix}_*: {foreign[:10]}"


def test_api_version_matches_the_header(native):
    assert native("api_version") == CODES["LLAISYS_API_VERSION"]


def test_last_error_names_the_call_and_is_per_thread(native):
    count = native.device_count()
    message = native.expect(native("malloc", count, 16, ctypes.byref(ctypes.c_void_p())), INVALID_ARGUMENT, "malloc")
    other = []
    thread = threading.Thread(target=lambda: other.append(native.last_error()))
    thread.start()
    thread.join()
    assert other == [""], "last_error must be per thread: a fresh thread has no error"
    assert native.last_error() == message


@pytest.mark.parametrize("bad", ["count", "-1"])
def test_device_index_out_of_range(native, bad):
    count = native.device_count()
    index = count if bad == "count" else -1
    ptr = ctypes.c_void_p()
    native.expect(native("malloc", index, 16, ctypes.byref(ptr)), INVALID_ARGUMENT, str(index))
    native.expect(native("device_synchronize", index), INVALID_ARGUMENT, str(index))
    if native.has("device_attribute"):
        value = ctypes.c_int64()
        status = native("device_attribute", index, CODES["LLAISYS_ATTR_WARP_SIZE"], ctypes.byref(value))
        native.expect(status, INVALID_ARGUMENT, str(index))


def test_malloc_of_an_absurd_size_is_out_of_memory(on_device):
    nbytes = 1 << 60
    ptr = ctypes.c_void_p()
    on_device.expect(on_device("malloc", 0, nbytes, ctypes.byref(ptr)), OUT_OF_MEMORY, str(nbytes))


def test_malloc_zero_and_free_null(on_device):
    ptr = ctypes.c_void_p()
    on_device.check("malloc", 0, 0, ctypes.byref(ptr))
    on_device.check("free", 0, ptr)
    on_device.check("free", 0, None)


@pytest.mark.parametrize("kind", [-1, 4, 99])
def test_memcpy_kind_invalid(on_device, kind):
    src = np.arange(4, dtype=np.float32)
    dst = np.zeros_like(src)
    on_device.expect(on_device("memcpy", 0, dst.ctypes.data, src.ctypes.data, src.nbytes, kind), INVALID_ARGUMENT,
                     str(kind))
    status = on_device("memcpy_async", 0, dst.ctypes.data, src.ctypes.data, src.nbytes, kind, None)
    on_device.expect(status, INVALID_ARGUMENT, str(kind))
    assert not dst.any(), "a refused copy must not write"


# -- ops: unknown codes, and the data only a kernel sees -------------------------------------------------

def _op_args(buffers, op, dtype, numerics):
    """Arguments (after device, stream) for a small valid call of `op` with the given dtype / numerics codes;
    the data is f32 (a kernel must refuse an unknown code before reading it)."""
    f = lambda *shape: buffers.upload(np.random.default_rng(0).standard_normal(shape).astype(np.float32))  # noqa: E731
    i32 = lambda *values: buffers.upload(np.array(values, dtype=np.int32))  # noqa: E731
    index = buffers.upload(np.array([0, 1], dtype=np.int64))
    q4_0_blocks = lambda: (buffers.upload(np.full((1, 1, 256), 0x98, np.uint8)),  # noqa: E731
                           buffers.upload(np.full((1, 1, 16), 0x3c00, np.uint16)))
    q8_cache = lambda n: [buffers.upload(np.ones((2, 2, 1, n), np.uint8)) for _ in "kv"]  # noqa: E731
    q8_scales = lambda: [buffers.upload(np.full((2, 2, 1), 0x3c00, np.uint16)) for _ in "kv"]  # noqa: E731
    return {
        "add": lambda: (dtype, 8, f(8), f(8), f(8)),
        "argmax": lambda: (dtype, 8, index, f(1), f(8)),
        "embedding": lambda: (dtype, 2, 4, 3, f(2, 4), index, f(3, 4)),
        "linear": lambda: (dtype, 2, 3, 4, f(2, 3), f(2, 4), f(3, 4), None),
        # N = 3, K = 4 in the block layout: weight int8 [1, 1, 8, 16, 4], scales bf16 [1, 1, 16] (raw 16-bit words)
        "linear_i8": lambda: (dtype, 2, 3, 4, f(2, 3), f(2, 4), buffers.upload(np.ones((1, 1, 8, 16, 4), np.int8)),
                              buffers.upload(np.full((1, 1, 16), 0x3f80, np.uint16)), None),
        # q4_0 blocks of a [3, 32] matrix: weight uint8 [1, 1, 256], scales uint8 [1, 1, 32] (f16 1.0 = 0x3c00)
        "linear_q": lambda: (dtype, CODES["LLAISYS_QFORMAT_Q4_0"], 2, 3, 32, f(2, 3), f(2, 32), q4_0_blocks()[0],
                             q4_0_blocks()[1], None),
        "embedding_q": lambda: (dtype, CODES["LLAISYS_QFORMAT_Q4_0"], 2, 32, 3, f(2, 32), index, q4_0_blocks()[0],
                                q4_0_blocks()[1]),
        # 4-bit blocks of a [3, 32] matrix, one group: weight uint8 [1, 4, 64], scales f16 [1, 1, 16], zeros [1, 1, 16]
        "linear_gq": lambda: (dtype, 4, 32, CODES["LLAISYS_I64"], 2, 3, 32, f(2, 3), f(2, 32),
                              buffers.upload(np.full((1, 4, 64), 0x98, np.uint8)),
                              buffers.upload(np.full((1, 1, 16), 0x3c00, np.uint16)),
                              buffers.upload(np.full((1, 1, 16), 8, np.uint8)), None,
                              buffers.upload(np.arange(32, dtype=np.int64))),
        # M = 2 rows (adapters 1 and -1), K = 8, R = 4, N = 3, S = 2 slots
        "lora_shrink": lambda: (dtype, 2, 8, 4, 2, f(2, 4), f(2, 8), f(2, 4, 8),
                                buffers.upload(np.array([1, -1], dtype=np.int64)), f(2)),
        "lora_expand": lambda: (dtype, 2, 4, 3, 2, f(2, 3), f(2, 4), f(2, 4, 3),
                                buffers.upload(np.array([1, -1], dtype=np.int64))),
        "rms_norm": lambda: (dtype, numerics, dtype, 2, 8, 1e-6, f(2, 8), f(2, 8), f(8)),
        "scale": lambda: (dtype, 8, 0.5, f(8), f(8)),
        "rope": lambda: (dtype, numerics, 2, 1, 8, 1.0, f(2, 1, 8), f(2, 1, 8), index, f(4)),
        "self_attention": lambda: (dtype, numerics, 2, 2, 2, 1, 8, 8, 0.35, f(2, 2, 8), f(2, 2, 8), f(2, 1, 8),
                                   f(2, 1, 8)),
        "swiglu": lambda: (dtype, numerics, 8, f(8), f(8), f(8)),
        "geglu_tanh": lambda: (dtype, numerics, 8, f(8), f(8), f(8)),
        "moe_router": lambda: (dtype, 2, 4, 2, 1, f(2, 2), buffers.upload(np.zeros((2, 2), np.int64)), f(2, 4)),
        # M = 2, E = 4 in 2 groups (keep 1, its top 2), k = 2, sigmoid, normalized, scale 2.5: weights [2, 2] in
        # dtype (f32-sized: room for any), logits f32 [2, 4] whatever dtype is (ABI 6.4), a bias f32 [4]
        "moe_router_grouped": lambda: (dtype, 2, 4, 2, 1, 2, 1, 2, 1, 2.5, f(2, 2),
                                       buffers.upload(np.zeros((2, 2), np.int64)), f(2, 4), f(4)),
        "moe_linear": lambda: (dtype, 2, 2, 4, 3, 8, 0, f(2, 2, 3), f(2, 8), f(4, 3, 8),
                               buffers.upload(np.array([[0, 1], [2, 3]], dtype=np.int64))),
        "moe_combine": lambda: (dtype, 2, 2, 3, f(2, 3), f(2, 2, 3), f(2, 2)),
        # 4 experts [3, 8]: weight int8 [4, 1, 1, 8, 16, 4], scales bf16 [4, 1, 1, 16] (as raw 16-bit words)
        "moe_linear_i8": lambda: (dtype, 2, 2, 4, 3, 8, 0, f(2, 2, 3), f(2, 8),
                                  buffers.upload(np.ones((4, 1, 1, 8, 16, 4), np.int8)),
                                  buffers.upload(np.full((4, 1, 1, 16), 0x3f80, np.uint16)),
                                  buffers.upload(np.array([[0, 1], [2, 3]], dtype=np.int64))),
        # 4 experts [3, 32] in q4_0 blocks: weight uint8 [4, 1, 1, 256], scales uint8 [4, 1, 1, 32] (f16 1.0)
        "moe_linear_q": lambda: (dtype, CODES["LLAISYS_QFORMAT_Q4_0"], 2, 2, 4, 3, 32, 0, f(2, 2, 3), f(2, 32),
                                 buffers.upload(np.full((4, 1, 1, 256), 0x98, np.uint8)),
                                 buffers.upload(np.full((4, 1, 1, 16), 0x3c00, np.uint16)),
                                 buffers.upload(np.array([[0, 1], [2, 3]], dtype=np.int64))),
        "sample": lambda: (dtype, 8, index, f(8), 1.0, 0, 1.0, 0),
        "mask_logits": lambda: (dtype, 1, 8, f(8), i32(1)),
        # logits [8], chosen token 1, temperature 1, the top 2: ids int64 [2], values f32 [3]
        "logprobs": lambda: (dtype, 8, f(8), 1, 1.0, 2, index, f(3)),
        "penalize_logits": lambda: (dtype, 8, 2, f(8), index, buffers.upload(np.zeros((2, 2), np.int64)), None, 1.2,
                                    0.5, 0.5),
        # one sequence, 2 query rows over 3 keys in blocks 1 and 0 of 2 positions each
        "paged_attention": lambda: (dtype, numerics, 2, 1, 2, 1, 8, 8, 2, 2, 2, 0, 0.35, f(2, 2, 8), f(2, 2, 8),
                                    f(2, 2, 1, 8), f(2, 2, 1, 8), i32(1, 0), i32(3), i32(0, 2)),
        # as paged_attention's over a latent cache: H = 2, dc = 8, dr = 4, q [2, 2, 12], c [2, 2, 8], r [2, 2, 4]
        "paged_latent_attention": lambda: (dtype, 2, 1, 2, 8, 4, 2, 2, 2, 0.35, f(2, 2, 8), f(2, 2, 12), f(2, 2, 8),
                                           f(2, 2, 4), i32(1, 0), i32(3), i32(0, 2)),
        "paged_kv_write": lambda: (dtype, 2, 1, 8, 8, 4, f(2, 2, 1, 8), f(2, 2, 1, 8), f(2, 1, 8), f(2, 1, 8), index),
        # as paged_attention's, over int8 bytes [2, 2, 1, 8] with f16 scales [2, 2, 1] (1.0 = 0x3c00)
        "paged_attention_q": lambda: (dtype, CODES["LLAISYS_KV_INT8"], 2, 1, 2, 1, 8, 8, 2, 2, 2, 0, 0.35, f(2, 2, 8),
                                      f(2, 2, 8), *q8_cache(8), *q8_scales(), i32(1, 0), i32(3), i32(0, 2)),
        "paged_kv_write_q": lambda: (dtype, CODES["LLAISYS_KV_INT8"], 2, 1, 8, 8, 4, *q8_cache(8), *q8_scales(),
                                     f(2, 1, 8), f(2, 1, 8), index),
    }[op]()


DTYPE_OPS = [op for op in OPS if SLOTS[op].argtypes[2] is ctypes.c_int and op != "rearrange"]
NUMERICS_OPS = ["rms_norm", "rope", "self_attention", "swiglu", "geglu_tanh", "paged_attention"]


@pytest.mark.parametrize("op", DTYPE_OPS)
def test_unknown_dtype_code_is_not_supported(on_device, op):
    if not on_device.has(op):
        pytest.skip(f"{on_device.backend.name} does not implement {op}")
    with DeviceBuffers(on_device) as buffers:
        args = _op_args(buffers, op, UNKNOWN_DTYPE, CODES["LLAISYS_NUMERICS_EXACT"])
        status = on_device.finish(on_device(op, 0, None, *args))
        on_device.expect(status, NOT_SUPPORTED, str(UNKNOWN_DTYPE))


@pytest.mark.parametrize("op", NUMERICS_OPS)
def test_numerics_modes(on_device, op):
    """numerics=HF runs or is NOT_SUPPORTED saying so; an unknown numerics code is always NOT_SUPPORTED."""
    assert SLOTS[op].argtypes[3] is ctypes.c_int, f"{op} takes numerics after dtype"
    if not on_device.has(op):
        pytest.skip(f"{on_device.backend.name} does not implement {op}")
    with DeviceBuffers(on_device) as buffers:
        status = on_device.finish(on_device(op, 0, None, *_op_args(buffers, op, F32, CODES["LLAISYS_NUMERICS_HF"])))
        if status != OK:
            on_device.expect(status, NOT_SUPPORTED, "numerics")
        status = on_device.finish(on_device(op, 0, None, *_op_args(buffers, op, F32, UNKNOWN_NUMERICS)))
        on_device.expect(status, NOT_SUPPORTED, "numerics", str(UNKNOWN_NUMERICS))


@pytest.mark.parametrize("op", ["linear_q", "embedding_q", "moe_linear_q"])
def test_unknown_weight_format_is_not_supported(on_device, op):
    if not on_device.has(op):
        pytest.skip(f"{on_device.backend.name} does not implement {op}")
    with DeviceBuffers(on_device) as buffers:
        args = list(_op_args(buffers, op, F32, CODES["LLAISYS_NUMERICS_EXACT"]))
        args[1] = 99
        on_device.expect(on_device.finish(on_device(op, 0, None, *args)), NOT_SUPPORTED, "99")


@pytest.mark.parametrize("bad", [3, -1, 1 << 40])
def test_embedding_q_index_out_of_range_names_it(on_device, bad):
    if not on_device.has("embedding_q"):
        pytest.skip(f"{on_device.backend.name} does not implement embedding_q")
    with DeviceBuffers(on_device) as buffers:
        args = list(_op_args(buffers, "embedding_q", F32, CODES["LLAISYS_NUMERICS_EXACT"]))
        args[2], args[6] = 3, buffers.upload(np.array([0, 2, bad], dtype=np.int64))
        args[5] = buffers.alloc(3 * 32 * 4)
        on_device.expect(on_device.finish(on_device("embedding_q", 0, None, *args)), INVALID_ARGUMENT, str(bad),
                         "position 2")


@pytest.mark.parametrize("bad", [3, -1, 1 << 40])
def test_embedding_index_out_of_range_names_it(on_device, bad):
    if not on_device.has("embedding"):
        pytest.skip(f"{on_device.backend.name} does not implement embedding")
    vocab, dim = 3, 4
    weight = np.arange(vocab * dim, dtype=np.float32).reshape(vocab, dim)
    with DeviceBuffers(on_device) as buffers:
        index = buffers.upload(np.array([0, 2, bad], dtype=np.int64))
        status = on_device("embedding", 0, None, F32, 3, dim, vocab, buffers.alloc(3 * dim * 4), index,
                           buffers.upload(weight))
        on_device.expect(on_device.finish(status), INVALID_ARGUMENT, str(bad), "position 2")


@pytest.mark.parametrize("case", ["block id", "seq_len", "query_start"])
def test_paged_attention_checks_its_index_data(on_device, case):
    """Block tables, lengths and query offsets are data only the kernel reads: a bad value is
    INVALID_ARGUMENT naming it, never a read outside the caches."""
    if not on_device.has("paged_attention"):
        pytest.skip(f"{on_device.backend.name} does not implement paged_attention")
    tables, seq_lens, query_start, named = {"block id": ([1, 7], [3], [0, 2], "7"),
                                            "seq_len": ([1, 0], [5], [0, 2], "5"),
                                            "query_start": ([1, 0], [3], [0, 9], "9")}[case]
    with DeviceBuffers(on_device) as buffers:
        f = lambda *shape: buffers.alloc(4 * int(np.prod(shape)))  # noqa: E731
        i32 = lambda values: buffers.upload(np.array(values, dtype=np.int32))  # noqa: E731
        status = on_device("paged_attention", 0, None, F32, CODES["LLAISYS_NUMERICS_EXACT"], 2, 1, 2, 1, 8, 8, 2, 2, 2,
                           0, 0.35, f(2, 2, 8), f(2, 2, 8), f(2, 2, 1, 8), f(2, 2, 1, 8), i32(tables), i32(seq_lens),
                           i32(query_start))
        on_device.expect(on_device.finish(status), INVALID_ARGUMENT, named)


@pytest.mark.parametrize("case", ["block id", "seq_len", "query_start"])
def test_paged_latent_attention_checks_its_index_data(on_device, case):
    """paged_attention's index data checks, over a latent cache: INVALID_ARGUMENT naming the bad value."""
    if not on_device.has("paged_latent_attention"):
        pytest.skip(f"{on_device.backend.name} does not implement paged_latent_attention")
    tables, seq_lens, query_start, named = {"block id": ([1, 7], [3], [0, 2], "7"),
                                            "seq_len": ([1, 0], [5], [0, 2], "5"),
                                            "query_start": ([1, 0], [3], [0, 9], "9")}[case]
    with DeviceBuffers(on_device) as buffers:
        f = lambda *shape: buffers.alloc(4 * int(np.prod(shape)))  # noqa: E731
        i32 = lambda values: buffers.upload(np.array(values, dtype=np.int32))  # noqa: E731
        status = on_device("paged_latent_attention", 0, None, F32, 2, 1, 2, 8, 4, 2, 2, 2, 0.35, f(2, 2, 8),
                           f(2, 2, 12), f(2, 2, 8), f(2, 2, 4), i32(tables), i32(seq_lens), i32(query_start))
        on_device.expect(on_device.finish(status), INVALID_ARGUMENT, named)


def test_paged_kv_write_refuses_a_slot_past_the_cache(on_device):
    if not on_device.has("paged_kv_write"):
        pytest.skip(f"{on_device.backend.name} does not implement paged_kv_write")
    with DeviceBuffers(on_device) as buffers:
        cache = buffers.upload(np.zeros((2, 2, 1, 8), dtype=np.float32))
        rows = buffers.upload(np.ones((2, 1, 8), dtype=np.float32))
        slots = buffers.upload(np.array([1, 4], dtype=np.int64))
        status = on_device("paged_kv_write", 0, None, F32, 2, 1, 8, 8, 4, cache, cache, rows, rows, slots)
        on_device.expect(on_device.finish(status), INVALID_ARGUMENT, "4")


def test_a_valid_call_passes(on_device):
    """The probes' arguments are well formed: with known codes every op runs."""
    with DeviceBuffers(on_device) as buffers:
        for op in DTYPE_OPS:
            if on_device.has(op):
                args = _op_args(buffers, op, F32, CODES["LLAISYS_NUMERICS_EXACT"])
                on_device.check(op, 0, None, *args)
        on_device.check("device_synchronize", 0)


# -- optional slots: absent is fine, present must keep the header's promises ----------------------------

def test_optional_device_queries(native):
    if native.has("build_info"):
        assert native("build_info"), "build_info returns one line"
    if native.device_count() < 1:
        return
    if native.has("device_attribute"):
        value = ctypes.c_int64(-1)
        native.check("device_attribute", 0, CODES["LLAISYS_ATTR_HOST_ADDRESSABLE"], ctypes.byref(value))
        assert value.value in (0, 1)
        native.check("device_attribute", 0, CODES["LLAISYS_ATTR_WARP_SIZE"], ctypes.byref(value))
        assert value.value >= 1
        native.expect(native("device_attribute", 0, 999, ctypes.byref(value)), NOT_SUPPORTED, "999")
    if native.has("device_name"):
        full = ctypes.create_string_buffer(256)
        native.check("device_name", 0, full, 256)
        assert full.value, "a device has a name"
        short = ctypes.create_string_buffer(b"x" * 8)
        native.check("device_name", 0, short, 4)
        assert short.raw[3:4] == b"\0" and short.raw[4:8] == b"xxxx", "the name is cut to `size` bytes with its NUL"
        untouched = ctypes.create_string_buffer(b"x" * 8)
        native.check("device_name", 0, untouched, 0)
        assert untouched.raw == b"x" * 8 + b"\0"
    if native.has("mem_info"):
        free, total = ctypes.c_size_t(), ctypes.c_size_t()
        native.check("mem_info", 0, ctypes.byref(free), ctypes.byref(total))
        assert 0 < free.value <= total.value


def test_optional_host_memory(on_device):
    """Pinned host memory is for copies to a device: an accelerator's driver pins it, so it needs a device."""
    if not (on_device.has("malloc_host") and on_device.has("free_host")):
        pytest.skip(f"{on_device.backend.name} has no pinned host memory (optional)")
    ptr = ctypes.c_void_p()
    on_device.check("malloc_host", 64, ctypes.byref(ptr))
    ctypes.memset(ptr, 7, 64)  # host memory: writable from the host
    on_device.check("free_host", ptr)
    on_device.check("free_host", None)


def test_optional_events(on_device):
    names = ["event_create", "event_destroy", "event_record", "event_synchronize"]
    if not all(on_device.has(n) for n in names):
        pytest.skip(f"{on_device.backend.name} has no events (optional)")
    stream, start, end = ctypes.c_void_p(), ctypes.c_void_p(), ctypes.c_void_p()
    on_device.check("stream_create", 0, ctypes.byref(stream))
    on_device.check("event_create", 0, ctypes.byref(start))
    on_device.check("event_create", 0, ctypes.byref(end))
    on_device.check("event_record", 0, start, stream)
    on_device.check("event_record", 0, end, stream)
    on_device.check("event_synchronize", 0, end)
    if on_device.has("event_elapsed_ms"):
        ms = ctypes.c_float(-1.0)
        status = on_device("event_elapsed_ms", 0, start, end, ctypes.byref(ms))
        if status != NOT_SUPPORTED:
            on_device.expect(status, OK)
            assert ms.value >= 0.0
    if on_device.has("stream_wait_event"):  # exported but NOT_SUPPORTED where the runtime lacks it (CoreX may)
        status = on_device("stream_wait_event", 0, stream, end)
        if status != NOT_SUPPORTED:
            on_device.expect(status, OK)
    on_device.check("stream_synchronize", 0, stream)
    for event in (start, end):
        on_device.check("event_destroy", 0, event)
    on_device.check("stream_destroy", 0, stream)


COLLECTIVES = ["comm_unique_id", "comm_create", "comm_destroy", "comm_abort", "comm_all_reduce", "comm_all_gather",
               "comm_broadcast"]


def test_optional_collectives(on_device):
    """A communicator of one rank: the collectives copy (in place, all_gather's rank 0 slot); bad ranks and
    dtypes are refused; a backend whose collective library is missing says NOT_SUPPORTED and what to install."""
    if not all(on_device.has(n) for n in COLLECTIVES):
        pytest.skip(f"{on_device.backend.name} has no collectives (optional)")
    uid = ctypes.create_string_buffer(UNIQUE_ID_BYTES)
    status = on_device("comm_unique_id", 0, uid)
    if status == NOT_SUPPORTED:  # (CUDA without NCCL): the message says what to install
        on_device.expect(status, NOT_SUPPORTED, "pip install")
        return
    on_device.expect(status, OK)
    comm = ctypes.c_void_p()
    on_device.expect(on_device("comm_create", 0, uid, 1, 1, 1000, ctypes.byref(comm)), INVALID_ARGUMENT, "rank 1")
    on_device.expect(on_device("comm_create", 0, uid, 0, 1, 0, ctypes.byref(comm)), INVALID_ARGUMENT, "timeout")
    on_device.check("comm_create", 0, uid, 0, 1, 5000, ctypes.byref(comm))
    try:
        with DeviceBuffers(on_device) as buffers:
            values = np.arange(7, dtype=np.float32) - 2.5
            data, out = buffers.upload(values), buffers.upload(np.full(7, np.nan, np.float32))
            on_device.check("comm_all_reduce", 0, None, comm, F32, 7, out, data)
            on_device.check("comm_all_reduce", 0, None, comm, F32, 7, data, data)  # in place
            on_device.expect(on_device.finish(on_device("comm_all_reduce", 0, None, comm, UNKNOWN_DTYPE, 7, out, data)),
                             NOT_SUPPORTED, str(UNKNOWN_DTYPE))
            gathered = buffers.upload(np.zeros(7, np.float32))
            on_device.check("comm_all_gather", 0, None, comm, 28, gathered, data)
            on_device.check("comm_broadcast", 0, None, comm, 28, data, 0)
            on_device.expect(on_device("comm_broadcast", 0, None, comm, 28, data, 1), INVALID_ARGUMENT, "root 1")
            on_device.check("device_synchronize", 0)
            for ptr in (out, data, gathered):
                np.testing.assert_array_equal(buffers.download(ptr, values), values)
        on_device.check("comm_abort", comm, b"probe")  # later collectives fail, saying so
        on_device.expect(on_device.finish(on_device("comm_all_reduce", 0, None, comm, F32, 0, None, None)),
                         RUNTIME_ERROR, "abort")
    finally:
        on_device.check("comm_destroy", comm)
    on_device.check("comm_destroy", None)


@pytest.mark.parametrize("bad", [32, -1, 1 << 40])
def test_linear_gq_perm_out_of_range_names_it(on_device, bad):
    if not on_device.has("linear_gq"):
        pytest.skip(f"{on_device.backend.name} does not implement linear_gq")
    with DeviceBuffers(on_device) as buffers:
        args = list(_op_args(buffers, "linear_gq", F32, CODES["LLAISYS_NUMERICS_EXACT"]))
        perm = np.arange(32, dtype=np.int64)
        perm[5] = bad
        args[-1] = buffers.upload(perm)
        on_device.expect(on_device.finish(on_device("linear_gq", 0, None, *args)), INVALID_ARGUMENT, str(bad))


@pytest.mark.parametrize("what", ["bits", "perm_dtype"])
def test_linear_gq_unknown_codes_are_not_supported(on_device, what):
    if not on_device.has("linear_gq"):
        pytest.skip(f"{on_device.backend.name} does not implement linear_gq")
    with DeviceBuffers(on_device) as buffers:
        args = list(_op_args(buffers, "linear_gq", F32, CODES["LLAISYS_NUMERICS_EXACT"]))
        args[1 if what == "bits" else 3] = 3 if what == "bits" else CODES["LLAISYS_F32"]
        on_device.expect(on_device.finish(on_device("linear_gq", 0, None, *args)), NOT_SUPPORTED,
                         "bits = 3" if what == "bits" else "perm dtype")


@pytest.mark.parametrize("op", ["lora_shrink", "lora_expand"])
@pytest.mark.parametrize("bad", [2, -2, 1 << 40])
def test_lora_adapter_out_of_range_names_it(on_device, op, bad):
    if not on_device.has(op):
        pytest.skip(f"{on_device.backend.name} does not implement {op}")
    with DeviceBuffers(on_device) as buffers:
        args = list(_op_args(buffers, op, F32, CODES["LLAISYS_NUMERICS_EXACT"]))
        args[8] = buffers.upload(np.array([0, bad], dtype=np.int64))
        on_device.expect(on_device.finish(on_device(op, 0, None, *args)), INVALID_ARGUMENT, f"adapters[1] = {bad}")
