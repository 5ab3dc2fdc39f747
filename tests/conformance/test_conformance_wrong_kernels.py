"""Deliberately wrong kernels are caught by the conformance suite, which names the op, the dtype and the case.

Each wrong kernel is the CPU backend's own kernel with one realistic bug, installed as a plugin's kernel
override (``llaisys_kernels``) on a backend that is otherwise the CPU library under another device type.
"""

from __future__ import annotations

from ctypes import c_int64

import pytest

import llaisys
import llaisys.testing
from helpers.wrong_kernels import add_one_ulp_off_in_f32
from llaisys.testing.case import FAIL

ITEMSIZE = {d.code: d.itemsize for d in llaisys.DType}


def rearrange_ignoring_source_strides(cpu_rearrange):
    """Reads the source as if it were contiguous (its strides ignored): right for contiguous sources only."""
    def kernel(device, stream, itemsize, ndim, shape, out, out_strides, x, x_strides):
        strides, step = [0] * ndim, 1
        for d in reversed(range(ndim)):
            strides[d], step = step, step * shape[d]
        return cpu_rearrange(device, stream, itemsize, ndim, shape, out, out_strides, x, (c_int64 * ndim)(*strides))
    return kernel


def linear_tail_ignoring_the_row_offset(cpu_linear):
    """Rows in tiles of 4; the rows past the last whole tile are computed from x's first rows (the tail's x
    pointer not advanced by the rows before it). Right whenever M < 4 or M is a multiple of 4."""
    def kernel(device, stream, code, m, n, k, out, x, w, bias):
        full = m - m % 4
        status = cpu_linear(device, stream, code, full, n, k, out, x, w, bias) if full else 0
        if status or full == m:
            return status
        return cpu_linear(device, stream, code, m - full, n, k, out + full * n * ITEMSIZE[code], x, w, bias)
    return kernel


def swiglu_missing_the_last_element(cpu_swiglu):
    def kernel(device, stream, code, numerics, n, out, gate, up):
        return cpu_swiglu(device, stream, code, numerics, max(n - 1, 0), out, gate, up)
    return kernel


def sample_always_greedy(cpu_sample):
    """Draws the argmax whatever the temperature: every top-k / top-p / argmax property holds, the
    distribution does not."""
    def kernel(device, stream, code, n, out, logits, temperature, top_k, top_p, seed):
        return cpu_sample(device, stream, code, n, out, logits, 0.0, top_k, top_p, seed)
    return kernel


def failure_lines(report) -> list[str]:
    return [r.line() for r in report.failures]


def test_an_add_one_ulp_off_is_caught_in_its_dtype_and_cases(fake_backend):
    device = fake_backend("wrongadd", {"add": add_one_ulp_off_in_f32})
    report = llaisys.testing.check_backend(device, ops=["add"])
    assert not report.ok
    assert report.cell("add", llaisys.float32).startswith("FAIL")
    assert report.cell("add", llaisys.float16).startswith("pass")
    assert report.cell("add", llaisys.bfloat16).startswith("pass")
    lines = failure_lines(report)
    assert all(line.startswith("add f32 [") for line in lines), lines
    # n = 1 and 3 have no fifth element: they pass; 17 and the larger shapes fail, each named with its shape
    assert any(line.startswith("add f32 [odd shape 17]: c: 3 of 17 elements are not bit-exact") for line in lines)
    assert not any("odd shape 1]" in line or "odd shape 3]" in line for line in lines)
    assert "add f32 [contiguous 2x3x5]" in str(report)


def test_a_rearrange_that_ignores_a_stride_fails_its_strided_cases_in_every_dtype(fake_backend):
    device = fake_backend("wrongcopy", {"rearrange": rearrange_ignoring_source_strides})
    report = llaisys.testing.check_backend(device, ops=["rearrange"])
    assert not report.ok
    for dtype in report.dtypes:
        assert report.cell("rearrange", dtype).startswith("FAIL"), (dtype, report.table())
    failed = {(r.case.dtype, r.case.layout, r.case.detail) for r in report.failures}
    assert {layout for _, layout, _ in failed} == {"strided"}  # the contiguous and odd-shape copies pass
    assert (llaisys.bfloat16, "strided", "transposed 17x5") in failed
    assert (llaisys.int8, "strided", "sliced 3x5x4") in failed
    assert not any(detail.startswith("into a sliced+permuted out") for _, _, detail in failed)  # contiguous source
    assert "rearrange bf16 [strided transposed 17x5]: out: " in str(report)


def test_a_linear_tail_bug_is_caught_by_the_odd_shapes_and_batch_invariance(fake_backend):
    device = fake_backend("wronglinear", {"linear": linear_tail_ignoring_the_row_offset})
    report = llaisys.testing.check_backend(device, ops=["linear"], dtypes=["f32", "bf16"])
    lines = failure_lines(report)
    for short in ("f32", "bf16"):
        assert any(line.startswith(f"linear {short} [odd shape 17x3x33]: out: ") and "differ beyond tol" in line
                   for line in lines), lines
        assert any(line.startswith(f"linear {short} [batch-invariant 13x33x300 rows alone]") for line in lines)
        assert not any(line.startswith(f"linear {short} [odd shape 1x") for line in lines)
    cell = report.cell("linear", llaisys.float32)
    assert cell.startswith("FAIL ") and "/10)" in cell  # the largest error, then failed / cases
    assert report.table().splitlines()[0].split() == ["op", "f32", "bf16"]


def test_an_unwritten_element_shows_as_nan(fake_backend):
    device = fake_backend("wrongglu", {"swiglu": swiglu_missing_the_last_element})
    report = llaisys.testing.check_backend(device, ops=["swiglu"], dtypes="f16")
    assert any(line.startswith("swiglu f16 [odd shape 17]: out: 1 of 17 elements are NaN where the reference is not")
               for line in failure_lines(report)), failure_lines(report)


def test_a_sampler_that_ignores_the_temperature_fails_the_distribution(fake_backend):
    device = fake_backend("wrongsample", {"sample": sample_always_greedy})
    report = llaisys.testing.check_backend(device, ops=["sample"], dtypes=["bf16"])
    failed = {r.case.detail for r in report.failures}
    assert {"distribution T=1", "distribution T=0.7 top_k=3", "a seed draws the same token"} <= failed
    assert "top_k=1 is argmax n=17" not in failed


def test_case_run_is_the_pytest_view(fake_backend):
    """What an out-of-tree backend's tests call: an AssertionError naming op, dtype and case."""
    device = fake_backend("wrongadd2", {"add": add_one_ulp_off_in_f32})
    by_name = {str(c): c for c in llaisys.testing.cases("add", "f32")}
    by_name["add f32 [odd shape 3]"].run(device)  # passes: no fifth element
    with pytest.raises(AssertionError, match=r"^add f32 \[odd shape 17\]: c: 3 of 17 elements are not bit-exact"):
        by_name["add f32 [odd shape 17]"].run(device)


@pytest.mark.parametrize("strict", [False, True], ids=["fallback", "strict"])
def test_a_partial_backend_shows_what_is_native(fake_backend, monkeypatch, strict):
    """Ops the backend lacks are "fallback" (they run on the CPU backend: not the backend's passes) or, with
    LLAISYS_FALLBACK=0, "not impl"; neither fails the report."""
    if strict:
        monkeypatch.setenv("LLAISYS_FALLBACK", "0")
    device = fake_backend("partial", missing=("rms_norm", "argmax"))
    report = llaisys.testing.check_backend(device, ops="add,rms_norm,argmax", dtypes="f32")
    assert report.ok
    assert report.cell("add", llaisys.float32).startswith("pass")
    expected = "not impl" if strict else "fallback"
    assert report.cell("rms_norm", llaisys.float32) == expected
    assert report.cell("argmax", llaisys.float32) == expected
    title = "not implemented" if expected == "not impl" else "falls back to the cpu backend"
    assert f"{title}: argmax, rms_norm" in str(report)  # (backend.h's order)
    assert all(r.outcome.status != FAIL for r in report.results)
