"""The CPU backend's thread team (csrc/common/thread_pool.h): the kernels' results never depend on how their
work was shared, whoever calls them and however the team waits.

Every kernel below hands out its work in pieces whose arithmetic does not depend on which thread runs them,
so the check is bit-for-bit against the same call made alone in this process (the kernels' correctness
against torch is tested in tests/ops).
"""

from __future__ import annotations

import json
import multiprocessing
import os
import queue as queues

import numpy as np

import llaisys
from helpers import run_in_threads
from helpers.child_process import run_in_child

# large enough that every kernel below runs on the team (linear: M*N*K >= 2^16; argmax: >= 1M elements;
# rms_norm: rows * dim >= 2^15)
X_SHAPE, W_SHAPE = (3, 1536), (2048, 1536)
ARGMAX_LEN = 1 << 21
NORM_SHAPE = (64, 1024)


def _inputs(seed: int):
    rng = np.random.default_rng(seed)
    x = rng.standard_normal(X_SHAPE, np.float32)
    w = rng.standard_normal(W_SHAPE, np.float32) / 40
    v = rng.standard_normal(ARGMAX_LEN, np.float32)
    v[ARGMAX_LEN * 3 // 4 + seed] = 50.0  # the maximum, in the last quarter (another thread's part)
    rows = rng.standard_normal(NORM_SHAPE, np.float32)
    return x, w, v, rows


def _run(seed: int) -> dict[str, list]:
    """linear, argmax and rms_norm on seed's inputs: the results as lists of f32 bit patterns / ints."""
    x, w, v, rows = _inputs(seed)
    out = llaisys.empty((X_SHAPE[0], W_SHAPE[0]), llaisys.float32)
    llaisys.ops.linear(out, llaisys.from_numpy(x), llaisys.from_numpy(w))
    idx, val = llaisys.empty((1,), llaisys.int64), llaisys.empty((1,), llaisys.float32)
    llaisys.ops.argmax(idx, val, llaisys.from_numpy(v))
    normed = llaisys.empty(NORM_SHAPE, llaisys.float32)
    llaisys.ops.rms_norm(normed, llaisys.from_numpy(rows), llaisys.from_numpy(np.ones(NORM_SHAPE[1], np.float32)),
                         1e-6)
    return {"linear": out.numpy().view(np.uint32).ravel().tolist(), "argmax": int(idx.numpy()[0]),
            "norm": normed.numpy().view(np.uint32).ravel().tolist()}


def test_argmax_finds_the_planted_maximum():
    assert _run(0)["argmax"] == ARGMAX_LEN * 3 // 4  # (the other tests compare runs with each other)


def test_callers_on_several_threads_at_once_get_their_own_results():
    """One thread holds the team, the others run alone meanwhile: nobody's work is mixed with another's."""
    expected = {seed: _run(seed) for seed in range(4)}
    got: dict[int, list] = {seed: [] for seed in range(4)}

    def caller(seed: int):
        for _ in range(5):
            got[seed].append(_run(seed))

    errors = run_in_threads(caller, [(seed,) for seed in range(4)])
    assert not errors, errors
    for seed in range(4):
        assert got[seed] == [expected[seed]] * 5, f"caller {seed} got another result"


def _child(queue):
    queue.put(_run(1))  # (read before join: a child with unread queued data does not exit)


def test_a_forked_child_starts_its_own_team():
    """fork() copies none of the team's threads: the child must not wait for them."""
    expected = _run(1)  # the team is running in this process now
    context = multiprocessing.get_context("fork")
    queue = context.Queue()
    child = context.Process(target=_child, args=(queue,))
    child.start()
    try:
        got = queue.get(timeout=120)
    except queues.Empty:
        child.kill()
        raise AssertionError("the forked child hung in a kernel") from None
    child.join(timeout=60)
    assert child.exitcode == 0
    assert got == expected


def bits_in_child() -> None:
    """The child (its team size and spin budget set by the environment): ``_run(2)``'s bits, as JSON."""
    print(json.dumps(_run(2)))


def test_team_size_and_spin_budget_do_not_change_results():
    """One thread (no team), more threads than cores, and threads that sleep at once: the same bits."""
    expected = _run(2)
    for env in ({"OMP_NUM_THREADS": "1"}, {"OMP_NUM_THREADS": "3"}, {"LLAISYS_CPU_SPIN_US": "0"},
                {"LLAISYS_CPU_SPIN_US": "5000", "OMP_NUM_THREADS": "2"}):
        child = run_in_child(bits_in_child, env={**os.environ, **env}, timeout=300)
        assert child.returncode == 0, child.stderr
        assert json.loads(child.stdout) == expected, f"{env} gives other bits"
