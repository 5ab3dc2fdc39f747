"""llaisys.profile(): every op call inside the block is counted and timed, by op name, by sizes or by label;
outside the block the op path is the plain one again."""

import numpy as np
import pytest

import llaisys
from llaisys import ops
from llaisys.plugins import registry


def _tensors(m=2, n=8, k=16):
    rng = np.random.default_rng(0)
    x = llaisys.from_numpy(rng.standard_normal((m, k)).astype(np.float32))
    w = llaisys.from_numpy(rng.standard_normal((n, k)).astype(np.float32))
    return x, w, llaisys.empty((m, n))


def test_calls_are_counted_by_op_and_results_are_unchanged():
    x, w, out = _tensors()
    expected = x.numpy() @ w.numpy().T
    with llaisys.profile() as prof:
        for _ in range(3):
            ops.linear(out, x, w)
        ops.add(out, out, out)
    assert dict(prof.calls) == {"linear": 3, "add": 1}
    np.testing.assert_allclose(out.numpy(), 2 * expected, rtol=1e-5)
    assert all(seconds > 0 for seconds in prof.seconds.values())
    assert prof.wall_seconds >= prof.op_seconds
    table = prof.table(per=3, unit="step")
    assert table.splitlines()[0].split() == ["op", "calls/step", "ms/step", "share"]
    assert "linear" in table and "(outside ops)" in table and table.splitlines()[-1].startswith("total")


def test_shapes_and_labels_split_the_calls():
    x, w, out = _tensors(m=2, n=8, k=16)
    x1, w1, out1 = _tensors(m=1, n=4, k=16)
    with llaisys.profile(shapes=True) as prof:
        ops.linear(out, x, w)
        ops.linear(out1, x1, w1)
        with prof.label("head"):
            ops.linear(out1, x1, w1)
    assert dict(prof.calls) == {"linear 2x8x16": 1, "linear 1x4x16": 1, "head": 1}


def test_outside_the_block_the_plain_kernels_run_again():
    x, w, out = _tensors()
    with llaisys.profile() as prof:
        ops.linear(out, x, w)
    ops.linear(out, x, w)  # not counted
    assert prof.calls["linear"] == 1
    assert registry().kernel_wrapper is None
    with llaisys.profile() as again:
        ops.linear(out, x, w)
    assert again.calls["linear"] == 1


def test_profiles_do_not_nest():
    with llaisys.profile(), pytest.raises(RuntimeError, match="do not nest"):
        with llaisys.profile():
            pass
    assert registry().kernel_wrapper is None


def test_calls_recorded_into_a_graph_are_not_timed():
    a = llaisys.from_numpy(np.ones(64, np.float32))
    out = llaisys.empty((64,))
    ops.add(out, a, a)  # warm-up
    graph = llaisys.Graph("cpu")
    with llaisys.profile() as prof:
        with graph.capture():
            ops.add(out, a, a)
        graph.replay()
        ops.add(out, a, a)
    graph.close()
    assert prof.calls["add"] == 1  # the eager call; the captured one ran only inside the replay
