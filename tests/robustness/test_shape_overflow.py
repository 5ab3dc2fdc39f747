"""Impossible sizes: every shape, view and byte count is checked with integer arithmetic before memory is touched.

Before these checks, ``empty((2**62 + 2**20,))`` allocated 4 MiB (the byte count wrapped) while the
tensor claimed 2**64 bytes, and an op on it wrote past the block. Each case runs in its own process.
"""

import pytest
from probe import expect_error, run_isolated

INT64_MAX = 2**63 - 1


@pytest.mark.parametrize("code,shape_text", [
    ("llaisys.empty((2**62 + 2**20,))", "(4611686018428436480,)"),                     # bytes wrap size_t
    ("llaisys.zeros((2**40, 2**40), llaisys.uint8)", "(1099511627776, 1099511627776)"),  # elements wrap int64
    ("llaisys.empty((0, 2**62, 2**62))", "(0, 4611686018427387904, 4611686018427387904)"),  # strides wrap
    ("llaisys.empty((2**63,), llaisys.uint8)", "(9223372036854775808,)"),
    ("llaisys.from_buffer(bytearray(16), llaisys.float32, (2**62,))", "(4611686018427387904,)"),
    ("llaisys.empty((0,)).view(2**40, 2**40, 0)", "(1099511627776, 1099511627776, 0)"),
], ids=["bytes", "elements", "strides", "int64-elements", "from_buffer", "view"])
def test_impossible_sizes_raise_naming_the_shape(code, shape_text):
    message = expect_error(code)
    assert shape_text in message and "too large" in message


def test_a_view_past_its_storage_is_refused():
    message = expect_error("""
        t = llaisys.empty((4,))
        llaisys.Tensor(t.storage, (8,), (1,), llaisys.float32)
    """)
    assert "past the 16 bytes of its storage" in message


def test_memory_stats_stay_true_after_refusals():
    out = run_isolated("""
        for shape in [(2**62 + 2**20,), (2**40, 2**40), (2**61, 8)]:
            try:
                llaisys.empty(shape)
            except llaisys.LlaisysValueError:
                pass
        s = llaisys.memory_stats()
        print(s["allocated_bytes"], s["reserved_bytes"])
    """)
    allocated, reserved = map(int, out.split())
    assert 0 <= allocated <= reserved < 2**32


def test_slices_load_and_read_only_their_elements():
    out = run_isolated("""
        t = llaisys.zeros((8,))
        t.slice(0, 2, 5).load(np.array([1, 2, 3], np.float32))
        print(t.numpy().tolist())
        try:
            t.slice(0, 6, 9)
        except llaisys.LlaisysValueError as e:
            print("RAISED", e)
    """)
    lines = out.splitlines()
    assert lines[0] == "[0.0, 0.0, 1.0, 2.0, 3.0, 0.0, 0.0, 0.0]"
    assert lines[1].startswith("RAISED slice: [6, 9) is out of range")


DLPACK_CASE = """
import ctypes
from llaisys import dlpack as d
buffer = np.zeros(64, np.uint8)
shape = (ctypes.c_int64 * 2)(*{shape})
strides = (ctypes.c_int64 * 2)(*{strides}) if {strides} else None
managed = d.DLManagedTensor()
dl = managed.dl_tensor
dl.data, dl.device, dl.ndim = buffer.ctypes.data, d.DLDevice(1, 0), 2
dl.dtype = d.DLDataType(2, 32, 1)
dl.shape = ctypes.cast(shape, ctypes.POINTER(ctypes.c_int64))
dl.strides = ctypes.cast(strides, ctypes.POINTER(ctypes.c_int64)) if strides else None
managed.deleter = d._Deleter(lambda ptr: None)
new_capsule = ctypes.pythonapi.PyCapsule_New
new_capsule.restype, new_capsule.argtypes = ctypes.py_object, [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_void_p]
t = llaisys.from_dlpack(new_capsule(ctypes.addressof(managed), b"dltensor", None))
print("IMPORTED", t.shape, t.nbytes)
"""


@pytest.mark.parametrize("shape,strides,needle", [
    ((2**62, 8), None, "beyond the int64 limit"),            # 2**65 elements
    ((2**40, 2**30), (1, 2**40), "beyond the int64 limit"),  # a span of 2**70 elements through the strides
    ((4, -3), None, "negative sizes"),
    ((4, 4), (4, -1), "negative strides"),
])
def test_dlpack_import_checks_the_producers_sizes(shape, strides, needle):
    message = expect_error(DLPACK_CASE.format(shape=shape, strides=strides))
    assert needle in message
