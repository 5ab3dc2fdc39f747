"""The CUDA kernels run on the CPU through host execution: the shared driver code of the host-execution op tests."""

import torch

DTYPES = [torch.float32, torch.float16, torch.bfloat16]

TOL = {torch.float32: 1e-5, torch.float16: 1e-3, torch.bfloat16: 1e-2}

CODE = {torch.float32: 0, torch.float16: 1, torch.bfloat16: 2}

dtype_ids = {torch.float32: "f32", torch.float16: "f16", torch.bfloat16: "bf16"}


def check(got: torch.Tensor, want: torch.Tensor, dtype, tol=None):
    """|got - want| <= tol (1 + |want|), want (float64) rounded to dtype first."""
    tol = TOL[dtype] if tol is None else tol
    got = got.to(torch.float64)
    want = want.to(dtype).to(torch.float64)
    assert got.shape == want.shape
    assert not torch.isnan(got).any() or torch.isnan(want).any(), "NaN in the output (unwritten elements?)"
    bad = (got - want).abs() > tol + tol * want.abs()
    assert not bad.any(), f"{int(bad.sum())}/{bad.numel()} differ; max err {(got - want).abs().max():.3g}"


def randn(shape, dtype, seed=0, scale=1.0):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(shape, generator=g, dtype=torch.float64) * scale).to(dtype)
