"""Test helpers: random inputs, torch references and the per-dtype tolerances of DESIGN §6."""

from __future__ import annotations

import threading

import numpy as np
import torch

import llaisys

TORCH_DTYPES = {llaisys.float32: torch.float32, llaisys.float16: torch.float16,
                llaisys.bfloat16: torch.bfloat16, llaisys.float64: torch.float64,
                llaisys.int64: torch.int64, llaisys.int32: torch.int32, llaisys.uint8: torch.uint8,
                llaisys.int8: torch.int8, llaisys.bool_: torch.bool}
FLOAT_DTYPES = [llaisys.float32, llaisys.float16, llaisys.bfloat16]
TOLERANCE = {llaisys.float32: 1e-5, llaisys.float16: 1e-3, llaisys.bfloat16: 1e-2}


def to_torch(t: llaisys.Tensor) -> torch.Tensor:
    """A host copy of a llaisys tensor as a torch tensor (any device, any dtype)."""
    array = t.numpy()
    if t.dtype == llaisys.bfloat16:
        return torch.from_numpy(array.view(np.int16)).view(torch.bfloat16)
    return torch.from_numpy(array)


def from_torch(x: torch.Tensor, device) -> llaisys.Tensor:
    """A copy of a (CPU) torch tensor on ``device``."""
    x = x.contiguous()
    if x.dtype == torch.bfloat16:
        host = llaisys.from_numpy(x.view(torch.int16).numpy().view(llaisys.bfloat16.numpy))
        return host.to(device)
    return llaisys.from_numpy(x.numpy(), device)


def random(shape, dtype, device, generator: torch.Generator, scale: float = 1.0):
    """(llaisys tensor, the same values as a float64 torch tensor)."""
    ref = (torch.randn(shape, generator=generator, dtype=torch.float64) * scale).to(TORCH_DTYPES[dtype])
    return from_torch(ref, device), ref.to(torch.float64)


def rope_table(head_dim: int, theta: float, device) -> llaisys.Tensor:
    """The plain rope table (``llaisys.ops.rope_inv_freq``) as an f32 tensor on ``device``."""
    return llaisys.from_numpy(llaisys.ops.rope_inv_freq(head_dim, theta), device)


def nan_filled(shape, dtype, device) -> llaisys.Tensor:
    """An output tensor full of NaN, so that elements a kernel forgets to write show."""
    return from_torch(torch.full(shape, float("nan"), dtype=TORCH_DTYPES[dtype]), device)


def assert_close(actual: llaisys.Tensor, expected: torch.Tensor, tol: float | None = None):
    """|actual - expected| <= tol + tol * |expected|, with expected rounded to actual's dtype.

    Non-finite values must match exactly: NaN where (and only where) the reference has NaN, so an
    unwritten element of a NaN-filled output still shows when the reference holds NaN elsewhere;
    +-inf only where the reference has the same infinity.
    """
    tol = TOLERANCE[actual.dtype] if tol is None else tol
    got = to_torch(actual).to(torch.float64)
    want = expected.to(TORCH_DTYPES[actual.dtype]).to(torch.float64)
    assert got.shape == want.shape, f"shape {tuple(got.shape)} != expected {tuple(want.shape)}"
    nan_mismatch = torch.isnan(got) != torch.isnan(want)
    if nan_mismatch.any():
        idx = tuple(int(i) for i in nan_mismatch.nonzero()[0])
        raise AssertionError(f"{int(nan_mismatch.sum())} of {got.numel()} elements are NaN where the reference is "
                             f"not, or the other way round (unwritten elements?); first at {idx}: got "
                             f"{got[idx].item()}, expected {want[idx].item()}")
    finite = torch.isfinite(want)
    # where the reference is finite: within tolerance (an inf or NaN there fails the <=);
    # where it is +-inf: exactly that infinity
    bad = torch.where(finite, ~((got - want).abs() <= tol + tol * want.abs()), got != want) & ~torch.isnan(want)
    if bad.any():
        idx = tuple(int(i) for i in bad.nonzero()[0])
        err = (got - want)[finite].abs()
        raise AssertionError(f"{int(bad.sum())} of {bad.numel()} elements differ beyond tol={tol}; "
                             f"first at {idx}: got {got[idx].item()}, expected {want[idx].item()}; "
                             f"max abs err {err.max().item() if err.numel() else float('nan'):.3g}")


def skip_without_kernels(device, ops, what: str) -> None:
    """Skip, naming them, when ``device``'s backend lacks any of ``ops`` (``what`` needs them)."""
    import pytest

    missing = [op for op in ops if not llaisys.ops.implemented(op, device)]
    if missing:
        pytest.skip(f"the '{llaisys.as_device(device).type}' backend does not implement {', '.join(missing)}, "
                    f"which {what} needs")


def run_in_threads(work, args_list, timeout: float = 300.0) -> list[Exception]:
    """work(*args) on one thread per args, all at once; asserts that none hung and returns the exceptions
    they raised (a thread's own exception would vanish)."""
    errors: list[Exception] = []

    def guarded(*args):
        try:
            work(*args)
        except Exception as error:
            errors.append(error)

    threads = [threading.Thread(target=guarded, args=args) for args in args_list]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=timeout)
    assert not any(t.is_alive() for t in threads), "a thread hung"
    return errors

