"""embedding: out[i] = weight[index[i]], a row copy (bit-exact), with out-of-range indices rejected."""

import pytest
import torch

import llaisys
from helpers import FLOAT_DTYPES, TORCH_DTYPES, from_torch, nan_filled, to_torch

# (n_index, vocab, dim): odd sizes, a Qwen2 hidden size and the full Qwen2 vocabulary (narrow rows)
CASES = [(1, 1, 1), (3, 5, 3), (17, 4097, 17), (4097, 17, 3), (5, 1000, 1536), (64, 151936, 16), (0, 7, 4)]


def check_embedding(n, vocab, dim, dtype, device, seed=0):
    g = torch.Generator().manual_seed(seed)
    weight = torch.randn(vocab, dim, generator=g).to(TORCH_DTYPES[dtype])
    index = torch.randint(0, vocab, (n,), generator=g)
    if n >= 2:
        index[0], index[-1] = 0, vocab - 1  # first and last rows
    out = nan_filled((n, dim), dtype, device)
    llaisys.ops.embedding(out, from_torch(index, device), from_torch(weight, device))
    assert torch.equal(to_torch(out), weight[index]), f"embedding {n}x{vocab}x{dim} {dtype.name} differs"


@pytest.mark.parametrize("dtype", FLOAT_DTYPES, ids=lambda d: d.name)
@pytest.mark.parametrize("case", CASES, ids=lambda c: "x".join(map(str, c)))
def test_embedding_matches_torch(device, case, dtype):
    check_embedding(*case, dtype, device, seed=sum(case))


def test_embedding_repeated_indices(device):
    weight = torch.arange(12, dtype=torch.float32).reshape(4, 3)
    index = torch.tensor([2, 2, 0, 3, 2])
    out = nan_filled((5, 3), llaisys.float32, device)
    llaisys.ops.embedding(out, from_torch(index, device), from_torch(weight, device))
    assert torch.equal(to_torch(out), weight[index])


@pytest.mark.parametrize("bad,pos", [(-1, 0), (10, 2), (1 << 40, 1), (-(1 << 62), 3)])
def test_embedding_rejects_out_of_range_index(device, bad, pos):
    weight = from_torch(torch.randn(10, 4), device)
    index = torch.tensor([1, 2, 3, 4])
    index[pos] = bad
    out = nan_filled((4, 4), llaisys.float32, device)
    raised_by_the_call = True
    with pytest.raises(llaisys.LlaisysError, match=rf"index value {bad} at position {pos} is out of range \[0, 10\)") as e:
        llaisys.ops.embedding(out, from_torch(index, device), weight)
        raised_by_the_call = False
        llaisys.synchronize(device)  # an asynchronous backend reports what its kernel found here
    assert isinstance(e.value, ValueError)
    assert raised_by_the_call or device.type != "cpu", "the CPU backend checks the indices in the call"
    rows = torch.isnan(to_torch(out)).all(1)
    assert rows[pos], "the bad index's row must not be written"
    if raised_by_the_call:  # the indices were checked before the copy: nothing was written
        assert rows.all(), "out must be left untouched when an index is bad"


def test_embedding_checks_indices_even_with_empty_rows(device):
    out = llaisys.empty((2, 0), llaisys.float32, device)
    with pytest.raises(ValueError, match=r"index value 3 at position 1"):
        llaisys.ops.embedding(out, from_torch(torch.tensor([0, 3]), device), llaisys.empty((3, 0), llaisys.float32, device))
        llaisys.synchronize(device)  # an asynchronous backend reports what its kernel found here


def test_embedding_rejects_bad_arguments(device):
    weight = llaisys.empty((10, 4), llaisys.float32, device)
    index = from_torch(torch.tensor([1, 2]), device)
    with pytest.raises(ValueError, match=r"\bindex\b.*dtype int32"):
        llaisys.ops.embedding(llaisys.empty((2, 4), llaisys.float32, device),
                              llaisys.empty((2,), llaisys.int32, device), weight)
    with pytest.raises(ValueError, match=r"\bindex\b.*1-d"):
        llaisys.ops.embedding(llaisys.empty((2, 4), llaisys.float32, device),
                              llaisys.empty((2, 1), llaisys.int64, device), weight)
    with pytest.raises(ValueError, match=r"\bweight\b.*2-d"):
        llaisys.ops.embedding(llaisys.empty((2, 4), llaisys.float32, device), index,
                              llaisys.empty((40,), llaisys.float32, device))
    with pytest.raises(ValueError, match=r"\bout\b.*shape"):
        llaisys.ops.embedding(llaisys.empty((2, 5), llaisys.float32, device), index, weight)
    with pytest.raises(ValueError, match=r"\bout\b.*dtype"):
        llaisys.ops.embedding(llaisys.empty((2, 4), llaisys.float16, device), index, weight)
    with pytest.raises(ValueError, match=r"\bweight\b.*contiguous"):
        llaisys.ops.embedding(llaisys.empty((2, 10), llaisys.float32, device), index,
                              llaisys.empty((10, 4), llaisys.float32, device).permute(1, 0))
