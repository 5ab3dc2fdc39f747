"""Zero-copy DLPack exchange with torch and numpy, both directions, and its lifetimes."""

import gc

import ml_dtypes
import numpy as np
import pytest
import torch

import llaisys


def test_torch_from_llaisys_shares_memory():
    t = llaisys.from_numpy(np.arange(12, dtype=np.float32).reshape(3, 4))
    x = torch.from_dlpack(t)
    assert x.data_ptr() == t.data_ptr() and x.shape == (3, 4)
    x[1, 2] = -5
    assert t.numpy()[1, 2] == -5


def test_torch_from_llaisys_view_keeps_strides_and_storage_alive():
    t = llaisys.from_numpy(np.arange(24, dtype=np.float32).reshape(2, 3, 4)).permute(2, 0, 1).slice(0, 1, 3)
    x = torch.from_dlpack(t)
    assert x.stride() == t.strides and tuple(x.shape) == t.shape
    expected = np.arange(24, dtype=np.float32).reshape(2, 3, 4).transpose(2, 0, 1)[1:3]
    del t
    gc.collect()
    np.testing.assert_array_equal(x.numpy(), expected)


def test_numpy_from_llaisys():
    t = llaisys.from_numpy(np.arange(6, dtype=np.int64))
    a = np.from_dlpack(t)
    assert a.ctypes.data == t.data_ptr()
    np.testing.assert_array_equal(a, np.arange(6))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16, torch.int64, torch.uint8,
                                   torch.bool])
def test_llaisys_from_torch_is_zero_copy(dtype):
    x = (torch.arange(20).reshape(4, 5) % 3).to(dtype).t()
    t = llaisys.from_dlpack(x)
    assert t.data_ptr() == x.data_ptr()
    assert t.shape == tuple(x.shape) and t.strides == x.stride()
    got = t.numpy()
    want = x.view(torch.int16).numpy().view(ml_dtypes.bfloat16) if dtype == torch.bfloat16 else x.numpy()
    np.testing.assert_array_equal(got, want)


def test_producer_memory_lives_as_long_as_the_llaisys_tensor():
    t = llaisys.from_dlpack(torch.full((1000,), 7.0))
    gc.collect()
    torch.full((1000,), 1.0)  # would reuse the freed block if the producer had released it
    assert (t.numpy() == 7.0).all()


def test_round_trip_through_torch_and_back():
    t = llaisys.from_numpy(np.arange(10, dtype=np.float16))
    back = llaisys.from_dlpack(torch.from_dlpack(t))
    assert back.data_ptr() == t.data_ptr()
    np.testing.assert_array_equal(back.numpy(), np.arange(10, dtype=np.float16))


def test_legacy_capsule_and_unconsumed_capsule():
    t = llaisys.from_numpy(np.ones(4, np.float32))
    capsule = t.__dlpack__()  # legacy, no max_version
    u = llaisys.from_dlpack(capsule)
    assert u.data_ptr() == t.data_ptr()
    with pytest.raises(ValueError, match="not a DLPack tensor"):
        llaisys.from_dlpack(capsule)  # consumed already


def test_exports_are_released_when_the_consumer_dies():
    t = llaisys.from_numpy(np.ones(4, np.float32))
    before = len(llaisys.dlpack._exports)
    x = torch.from_dlpack(t)
    assert len(llaisys.dlpack._exports) == before + 1
    del x
    gc.collect()
    assert len(llaisys.dlpack._exports) == before
    capsule = t.__dlpack__(max_version=(1, 0))
    assert len(llaisys.dlpack._exports) == before + 1
    del capsule
    gc.collect()
    assert len(llaisys.dlpack._exports) == before


def test_negative_strides_are_refused():
    with pytest.raises((ValueError, BufferError)):
        llaisys.from_dlpack(np.arange(5.0)[::-1])


def test_readonly_numpy_is_imported_read_only():
    a = np.arange(4.0)
    a.flags.writeable = False
    t = llaisys.from_dlpack(a)
    assert t.storage.readonly
    with pytest.raises(ValueError, match="read-only"):
        t.load(np.zeros(4))
