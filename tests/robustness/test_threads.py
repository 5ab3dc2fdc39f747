"""Ops from several threads on separate tensors: plans and kernels are resolved concurrently, results stay right."""

import numpy as np

import llaisys
from helpers import run_in_threads


def test_ops_on_separate_tensors_from_many_threads(device):
    def work(seed):
        rng = np.random.default_rng(seed)
        for step in range(40):
            m, k, n = 1 + (seed + step) % 5, 3 + step % 7, 2 + seed % 4  # new layouts while others run
            x = rng.standard_normal((m, k)).astype(np.float32)
            w = rng.standard_normal((n, k)).astype(np.float32)
            out = llaisys.empty((m, n), llaisys.float32, device)
            llaisys.ops.linear(out, llaisys.from_numpy(x, device), llaisys.from_numpy(w, device))
            total = llaisys.empty((m, n), llaisys.float32, device)
            llaisys.ops.add(total, out, out)
            np.testing.assert_allclose(total.numpy(), 2 * (x.astype(np.float64) @ w.T.astype(np.float64)),
                                       rtol=1e-5, atol=1e-5)

    errors = run_in_threads(work, [(seed,) for seed in range(6)])
    assert not errors, errors[0]
