"""Tensor metadata and views, checked against torch's semantics."""

import contextlib
import io
import mmap
import re

import ml_dtypes
import numpy as np
import pytest
import torch

import llaisys
from helpers import from_torch, to_torch


def arange(shape, dtype=np.float32):
    return np.arange(int(np.prod(shape))).reshape(shape).astype(dtype)


def test_metadata_matches_torch():
    t = llaisys.empty((2, 3, 5), llaisys.bfloat16)
    ref = torch.empty((2, 3, 5), dtype=torch.bfloat16)
    assert t.shape == tuple(ref.shape)
    assert t.strides == ref.stride()
    assert (t.ndim, t.numel(), t.nbytes) == (3, 30, 60)
    assert t.dtype is llaisys.bfloat16 and t.dtype.itemsize == 2
    assert str(t.device) == "cpu:0" and t.is_contiguous()


@pytest.mark.parametrize("shape,order", [((2, 3, 4), (2, 0, 1)), ((5, 1, 7), (1, 2, 0)), ((4, 6), (1, 0))])
def test_permute_matches_torch(shape, order):
    base = arange(shape)
    t, ref = llaisys.from_numpy(base).permute(*order), torch.from_numpy(base).permute(*order)
    assert t.shape == tuple(ref.shape) and t.strides == ref.stride()
    assert t.is_contiguous() == ref.is_contiguous()
    np.testing.assert_array_equal(t.numpy(), ref.numpy())


@pytest.mark.parametrize("dim,start,end", [(0, 1, 3), (1, 0, 1), (2, 2, 5), (-1, 0, 0), (1, 2, 3)])
def test_slice_matches_torch(dim, start, end):
    base = arange((4, 3, 5))
    t, ref = llaisys.from_numpy(base).slice(dim, start, end), torch.from_numpy(base).narrow(dim, start, end - start)
    assert t.shape == tuple(ref.shape) and t.strides == ref.stride()
    assert t.is_contiguous() == ref.is_contiguous()
    np.testing.assert_array_equal(t.numpy(), ref.numpy())
    assert t.data_ptr() - llaisys.from_numpy(base).data_ptr() != 0 or start == 0 or t.numel() == 0


def test_views_share_storage():
    t = llaisys.from_numpy(arange((4, 6)))
    v = t.view(6, 4).slice(0, 2, 4)
    v.load(np.full((2, 4), -1, np.float32))
    expected = arange((4, 6)).reshape(-1)
    expected[8:16] = -1
    np.testing.assert_array_equal(t.numpy().reshape(-1), expected)


@pytest.mark.parametrize("shape,new", [((2, 3, 4), (6, 4)), ((2, 3, 4), (-1,)), ((2, 3, 4), (2, 1, 12)),
                                        ((1, 24), (4, -1, 2))])
def test_view_of_contiguous(shape, new):
    base = arange(shape)
    t, ref = llaisys.from_numpy(base).view(*new), torch.from_numpy(base).view(*new)
    assert t.shape == tuple(ref.shape) and t.strides == ref.stride()
    np.testing.assert_array_equal(t.numpy(), ref.numpy())


def test_view_of_non_contiguous_follows_torch_rule():
    base = arange((4, 6, 8))
    t, ref = llaisys.from_numpy(base).slice(1, 1, 5), torch.from_numpy(base).narrow(1, 1, 4)
    # merging the last dims of a sliced tensor is allowed where strides permit
    ok_t, ok_ref = t.view(4, 4, 2, 4), ref.view(4, 4, 2, 4)
    assert ok_t.strides == ok_ref.stride()
    np.testing.assert_array_equal(ok_t.numpy(), ok_ref.numpy())
    with pytest.raises(RuntimeError):
        ref.view(16, 8)
    with pytest.raises(llaisys.LlaisysValueError, match="compatible with the strides"):
        t.view(16, 8)


def test_invalid_views_raise():
    t = llaisys.from_numpy(arange((2, 3, 4)))
    with pytest.raises(ValueError, match="contiguous"):
        t.permute(2, 0, 1).view(24)
    with pytest.raises(ValueError, match="invalid for"):
        t.view(5, 5)
    with pytest.raises(ValueError, match="only one dimension"):
        t.view(-1, -1)
    with pytest.raises(ValueError, match="not a permutation"):
        t.permute(0, 0, 1)
    with pytest.raises(ValueError, match="not a permutation"):
        t.permute(0, 1)


@pytest.mark.parametrize("dim,start,end", [(0, 0, 3), (1, 2, 1), (2, -1, 2), (3, 0, 1), (-4, 0, 1)])
def test_out_of_range_slice_raises(dim, start, end):
    t = llaisys.empty((2, 3, 4))
    with pytest.raises(llaisys.LlaisysError, match="out of range"):
        t.slice(dim, start, end)


def test_contiguous_copies_only_when_needed():
    t = llaisys.from_numpy(arange((3, 4)))
    assert t.contiguous() is t
    p = t.permute(1, 0)
    c = p.contiguous()
    assert c is not p and c.is_contiguous() and c.strides == (3, 1)
    np.testing.assert_array_equal(c.numpy(), arange((3, 4)).T)


@pytest.mark.parametrize("dtype", [np.float32, np.float16, ml_dtypes.bfloat16, np.float64, np.int64, np.int32,
                                   np.int8, np.uint8, np.bool_])
def test_numpy_round_trip_every_dtype(dtype):
    base = (arange((3, 5)) % 7).astype(dtype)
    t = llaisys.from_numpy(base)
    out = t.numpy()
    assert out.dtype == np.dtype(dtype) and out.shape == base.shape
    np.testing.assert_array_equal(out, base)


def test_bf16_numpy_is_ml_dtypes_and_matches_torch():
    x = torch.randn(4, 7).to(torch.bfloat16)
    t = from_torch(x, "cpu")
    assert t.numpy().dtype == ml_dtypes.bfloat16
    assert torch.equal(to_torch(t), x)


def test_from_numpy_copies_strided_input():
    base = arange((4, 6))[:, ::2]
    t = llaisys.from_numpy(base)
    base[...] = 0
    np.testing.assert_array_equal(t.numpy(), arange((4, 6))[:, ::2])


def test_zeros_and_load_checks():
    z = llaisys.zeros((3, 17), llaisys.float16)
    assert not z.numpy().any()
    with pytest.raises(ValueError, match="dtype"):
        z.load(np.ones((3, 17), np.float32))
    with pytest.raises(ValueError, match="does not fit"):
        z.load(np.ones((3, 16), np.float16))
    z.load(np.ones((3, 17), np.float16).tobytes())
    assert (z.numpy() == 1).all()


def test_load_into_non_contiguous_view():
    t = llaisys.zeros((4, 3))
    t.permute(1, 0).load(arange((3, 4)))
    np.testing.assert_array_equal(t.numpy(), arange((3, 4)).T)


def test_from_buffer_is_zero_copy_and_read_only_is_enforced(tmp_path):
    path = tmp_path / "blob"
    path.write_bytes(arange((8,)).tobytes())
    with open(path, "rb") as f:
        mapped = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
    t = llaisys.from_buffer(mapped, llaisys.float32, (2, 3), offset=8)
    np.testing.assert_array_equal(t.numpy(), arange((8,))[2:].reshape(2, 3))
    with pytest.raises(ValueError, match="read-only"):
        t.load(np.zeros((2, 3), np.float32))
    with pytest.raises(ValueError, match="read-only"):
        llaisys.ops.add(t, t, t)
    with pytest.raises(ValueError, match="exceed"):
        llaisys.from_buffer(mapped, llaisys.float32, (8,), offset=4)
    writable = bytearray(16)
    w = llaisys.from_buffer(writable, llaisys.int32, (4,))
    w.load(np.array([1, 2, 3, 4], np.int32))
    assert np.frombuffer(writable, np.int32).tolist() == [1, 2, 3, 4]


def test_bad_constructor_arguments_raise():
    with pytest.raises(ValueError, match="non-negative"):
        llaisys.empty((2, -1))
    with pytest.raises(ValueError, match="unknown dtype"):
        llaisys.empty((2,), "float8")
    with pytest.raises(ValueError, match="invalid device"):
        llaisys.empty((2,), device="cuda:x")
    with pytest.raises(llaisys.BackendUnavailableError, match="No llaisys backend provides 'nosuch'") as e:
        llaisys.empty((2,), device="nosuch")
    assert "llaisys-backend-nosuch" not in str(e.value)  # only packages that exist are named
    with pytest.raises(llaisys.BackendUnavailableError, match="does not exist"):
        llaisys.empty((2,), device="cpu:3")


def test_device_index_must_be_a_non_negative_int():
    assert llaisys.Device("cpu", np.int64(0)) is llaisys.Device("cpu")
    for bad in (True, -1, 1.5, "1"):
        with pytest.raises(ValueError, match=re.escape(f"invalid device index {bad!r} for 'cpu'")):
            llaisys.Device("cpu", bad)


def test_to_same_device_is_identity_and_debug_prints():
    t = llaisys.from_numpy(arange((2, 3)))
    assert t.to("cpu") is t
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        t.permute(1, 0).debug()
    text = buf.getvalue()
    assert "shape=(3, 2)" in text and "float32" in text and "contiguous=False" in text and "5." in text


def test_device_parsing():
    assert llaisys.Device("cuda", 1) == "cuda:1"
    assert str(llaisys.device.as_device("cuda")) == "cuda:0"
    assert llaisys.device.as_device(" cpu:0 ") == llaisys.Device("cpu")
    with pytest.raises(ValueError):
        llaisys.Device("cuda", -1)


def test_zero_dim_tensors_keep_their_shape():
    t = llaisys.from_numpy(np.array(3.5, np.float32))
    assert t.shape == () and t.strides == () and t.numel() == 1
    assert t.numpy().shape == () and float(t.numpy()) == 3.5
    assert t.view(1, 1).shape == (1, 1)
