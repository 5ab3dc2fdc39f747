"""The test helpers themselves: assert_close must fail where a kernel is wrong, NaN and inf included."""

import pytest
import torch

import llaisys
from helpers import TORCH_DTYPES, assert_close, from_torch

INF, NAN = float("inf"), float("nan")


def check(got, want, dtype=llaisys.float32):
    """assert_close of a ``dtype`` tensor holding ``got`` against the float64 reference ``want``."""
    assert_close(from_torch(torch.tensor(got).to(TORCH_DTYPES[dtype]), "cpu"), torch.tensor(want, dtype=torch.float64))


@pytest.mark.parametrize("dtype", [llaisys.float32, llaisys.float16, llaisys.bfloat16], ids=lambda d: d.name)
def test_matching_values_pass(dtype):
    check([1.0, -2.5, INF, -INF, NAN, 0.0], [1.0, -2.5, INF, -INF, NAN, 0.0], dtype)


@pytest.mark.parametrize("got,want", [
    ([1.0, 65504.0], [1.0, INF]),      # a finite value where the reference is inf
    ([1.0, -INF], [1.0, INF]),         # the wrong infinity
    ([1.0, INF], [1.0, 2.0]),          # inf where the reference is finite
    ([NAN, NAN], [1.0, NAN]),          # an unwritten (NaN) element beside a NaN the reference has
    ([1.0, 2.0], [1.0, NAN]),          # a number where the reference is NaN
    ([1.0, 1.001], [1.0, 1.0]),        # beyond the f32 tolerance
])
def test_wrong_values_fail(got, want):
    with pytest.raises(AssertionError):
        check(got, want)
