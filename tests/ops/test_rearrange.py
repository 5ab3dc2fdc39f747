"""ops.rearrange (and Tensor.contiguous): strided copies between any views, against torch."""

from __future__ import annotations

import random as pyrandom

import pytest
import torch

import llaisys
from helpers import TORCH_DTYPES, from_torch, to_torch

ALL_DTYPES = [llaisys.float32, llaisys.float16, llaisys.bfloat16, llaisys.float64, llaisys.int8,
              llaisys.int32, llaisys.int64, llaisys.uint8, llaisys.bool_]
SIZES = [1, 2, 3, 5, 17]  # odd sizes on purpose; 1 exercises the size-1 dims the kernel drops


def random_values(shape, dtype, g):
    """Random torch values of ``dtype`` (every bit pattern class: signs, fractions, large ints)."""
    tdt = TORCH_DTYPES[dtype]
    if dtype == llaisys.bool_:
        return torch.randint(0, 2, shape, generator=g).bool()
    if tdt.is_floating_point:
        return (torch.randn(shape, generator=g, dtype=torch.float64) * 100).to(tdt)
    info = torch.iinfo(tdt)
    return torch.randint(info.min, info.max, shape, generator=g, dtype=torch.int64).to(tdt)


def sentinel(shape, dtype):
    """A fill value that no copied element equals, so that stray and missing writes show."""
    tdt = TORCH_DTYPES[dtype]
    if dtype == llaisys.bool_:
        raise AssertionError("bool has no free sentinel value; test bool with a contiguous out")
    if tdt.is_floating_point:
        return torch.full(shape, float("nan"), dtype=tdt)
    return torch.full(shape, torch.iinfo(tdt).max, dtype=tdt)  # random_values never draws max


def random_view(rng: pyrandom.Random, shape):
    """A recipe [(op, args)] turning a base of some bigger shape into a strided view of ``shape``.

    Returns (base_shape, recipe): each dim may be sliced out of a bigger dim, then the dims are permuted.
    """
    ndim = len(shape)
    order = list(range(ndim))
    rng.shuffle(order)
    # the base dim that becomes view dim i is order[i]; build base sizes in base order
    base_shape = [0] * ndim
    slices = []
    for i, b in enumerate(order):
        extra = rng.choice([0, 0, 1, 2, 3] if ndim <= 4 else [0, 0, 1])
        start = rng.randint(0, extra)
        base_shape[b] = shape[i] + extra
        if extra:
            slices.append((b, start, start + shape[i]))
    return tuple(base_shape), [("slice", s) for s in slices] + [("permute", tuple(order))]


def apply_llaisys(t, recipe):
    for op, args in recipe:
        t = t.slice(*args) if op == "slice" else t.permute(*args)
    return t


def apply_torch(t, recipe):
    for op, args in recipe:
        if op == "slice":
            dim, start, end = args
            t = t.narrow(dim, start, end - start)
        else:
            t = t.permute(*args)
    return t


def strided_input(shape, dtype, device, rng, g, kind):
    """(llaisys view, the same values as a torch tensor) for kind in contiguous/permuted/sliced/both."""
    if kind == "contiguous":
        values = random_values(shape, dtype, g)
        return from_torch(values, device), values
    base_shape, recipe = random_view(rng, shape)
    if kind == "permuted":
        recipe = [r for r in recipe if r[0] == "permute"]
        base_shape = tuple(shape[recipe[0][1].index(b)] for b in range(len(shape)))
    elif kind == "sliced":
        base_shape, recipe = base_shape_without_permute(rng, shape)
    base = random_values(base_shape, dtype, g)
    view = apply_llaisys(from_torch(base, device), recipe)
    expected = apply_torch(base, recipe)
    assert view.shape == tuple(shape) == tuple(expected.shape)
    return view, expected


def base_shape_without_permute(rng, shape):
    base_shape, slices = [], []
    for dim, n in enumerate(shape):
        extra = rng.choice([0, 1, 3] if len(shape) <= 4 else [0, 1])
        start = rng.randint(0, extra)
        base_shape.append(n + extra)
        if extra:
            slices.append(("slice", (dim, start, start + n)))
    if not slices:  # make sure something is sliced
        base_shape[-1] += 2
        slices.append(("slice", (len(shape) - 1, 1, 1 + shape[-1])))
    return tuple(base_shape), slices


def check_into_strided_out(x, expected, dtype, device, rng):
    """rearrange(out_view, x) with out a permuted + sliced view of a sentinel-filled base."""
    shape = x.shape
    base_shape, recipe = random_view(rng, shape)
    fill = sentinel(base_shape, dtype)
    base = from_torch(fill, device)
    out = apply_llaisys(base, recipe)
    llaisys.ops.rearrange(out, x)
    got = to_torch(base)  # base is contiguous: read back without going through rearrange
    want = fill.clone()
    apply_torch(want, recipe).copy_(expected)
    assert_equal(got, want)


def assert_equal(got, want):
    assert got.shape == want.shape and got.dtype == want.dtype
    if want.dtype.is_floating_point:  # NaN sentinels compare equal to themselves here
        same = (got == want) | (torch.isnan(got) & torch.isnan(want))
    else:
        same = got == want
    if not bool(same.all()):
        idx = tuple(int(i) for i in (~same).nonzero()[0])
        raise AssertionError(f"{int((~same).sum())} of {same.numel()} elements differ; first at {idx}: "
                             f"got {got[idx].item()}, expected {want[idx].item()}")


@pytest.mark.parametrize("dtype", ALL_DTYPES, ids=lambda t: t.name)
@pytest.mark.parametrize("ndim", range(1, 9))
def test_views_into_contiguous_out(device, dtype, ndim):
    rng = pyrandom.Random(ndim * 100 + dtype.code)
    g = torch.Generator().manual_seed(ndim)
    for kind in ("contiguous", "permuted", "sliced", "both"):
        shape = tuple(rng.choice(SIZES if ndim <= 4 else SIZES[:3]) for _ in range(ndim))
        x, expected = strided_input(shape, dtype, device, rng, g, kind)
        if dtype == llaisys.bool_:
            out = from_torch(~expected, device)  # every element starts wrong
        else:
            out = from_torch(sentinel(shape, dtype), device)
        llaisys.ops.rearrange(out, x)
        assert_equal(to_torch(out), expected)
        # Tensor.contiguous() goes through the same kernel
        assert_equal(to_torch(x.contiguous()), expected)


@pytest.mark.parametrize("dtype", [d for d in ALL_DTYPES if d != llaisys.bool_], ids=lambda t: t.name)
@pytest.mark.parametrize("ndim", range(1, 9))
def test_views_into_strided_out(device, dtype, ndim):
    rng = pyrandom.Random(ndim * 7 + dtype.code)
    g = torch.Generator().manual_seed(100 + ndim)
    for kind in ("contiguous", "permuted", "sliced", "both"):
        shape = tuple(rng.choice(SIZES if ndim <= 4 else SIZES[:3]) for _ in range(ndim))
        x, expected = strided_input(shape, dtype, device, rng, g, kind)
        check_into_strided_out(x, expected, dtype, device, rng)


def test_bool_into_strided_out(device):
    # bool has no sentinel: check the view through a uint8 alias of the same base is written exactly
    g = torch.Generator().manual_seed(5)
    values = random_values((3, 5, 4), llaisys.bool_, g)
    base = llaisys.zeros((4, 6, 7), llaisys.bool_, device)
    out = base.permute(2, 0, 1).slice(0, 1, 5).slice(1, 0, 3).slice(2, 1, 6)  # shape (4, 3, 5)
    x = from_torch(values, device).permute(2, 0, 1)
    llaisys.ops.rearrange(out, x)
    got = to_torch(base)
    want = torch.zeros(4, 6, 7, dtype=torch.bool)
    want.permute(2, 0, 1)[1:5, 0:3, 1:6].copy_(values.permute(2, 0, 1))
    assert_equal(got, want)


@pytest.mark.parametrize("dtype", [llaisys.float32, llaisys.bfloat16, llaisys.int64, llaisys.uint8],
                         ids=lambda t: t.name)
def test_large_transposes(device, dtype):
    # big enough for the threaded path; inner dims that are strided on one side or both
    g = torch.Generator().manual_seed(9)
    base = random_values((301, 517), dtype, g)
    x = from_torch(base, device)
    assert_equal(to_torch(x.permute(1, 0).contiguous()), base.t())
    sliced = x.slice(1, 3, 514).slice(0, 1, 300)  # rows not adjacent: a memcpy per row
    assert_equal(to_torch(sliced.contiguous()), base[1:300, 3:514])
    fill = sentinel((517, 301), dtype)
    out_base = from_torch(fill, device)
    llaisys.ops.rearrange(out_base.permute(1, 0), x)  # strided destination, contiguous source
    want = fill.clone()
    want.t().copy_(base)
    assert_equal(to_torch(out_base), want)


def test_broadcast_source(device):
    # a stride-0 (expanded) source, as torch.expand hands it over through DLPack
    if device.type != "cpu":
        pytest.skip("DLPack import of host memory is a CPU matter")
    src = torch.arange(6, dtype=torch.float32).reshape(1, 6, 1).expand(4, 6, 3)
    x = llaisys.from_dlpack(src)
    assert 0 in x.strides
    out = llaisys.empty((4, 6, 3), llaisys.float32, device)
    llaisys.ops.rearrange(out, x)
    assert_equal(to_torch(out), src.contiguous())


def test_scalar_and_empty(device):
    x = llaisys.zeros((), llaisys.float32, device).load(torch.tensor(3.5).numpy())
    out = llaisys.zeros((), llaisys.float32, device)
    llaisys.ops.rearrange(out, x)
    assert float(out.numpy()) == 3.5
    empty = llaisys.zeros((3, 0, 2), llaisys.float32, device)
    llaisys.ops.rearrange(llaisys.zeros((3, 0, 2), llaisys.float32, device).permute(2, 1, 0),
                          empty.permute(2, 1, 0))


def test_shape_mismatch(device):
    out = llaisys.zeros((3, 4), llaisys.float32, device)
    with pytest.raises(llaisys.LlaisysError, match=r"\bx\b.*shape") as info:
        llaisys.ops.rearrange(out, llaisys.zeros((4, 3), llaisys.float32, device))
    assert isinstance(info.value, ValueError)
    with pytest.raises(ValueError, match=r"\bx\b.*shape"):
        llaisys.ops.rearrange(out, llaisys.zeros((3, 4, 1), llaisys.float32, device))


def test_dtype_mismatch(device):
    out = llaisys.zeros((3, 4), llaisys.float32, device)
    with pytest.raises(llaisys.LlaisysError, match=r"\bx\b.*dtype") as info:
        llaisys.ops.rearrange(out, llaisys.zeros((3, 4), llaisys.int32, device))
    assert isinstance(info.value, ValueError)
    with pytest.raises(ValueError, match=r"\bx\b.*dtype"):
        llaisys.ops.rearrange(out, llaisys.zeros((3, 4), llaisys.float16, device))


def test_rank_limit(device):
    shape = (1,) * 17
    with pytest.raises(ValueError, match="rank 17"):
        llaisys.ops.rearrange(llaisys.zeros(shape, llaisys.float32, device),
                              llaisys.zeros(shape, llaisys.float32, device))
