"""llaisys.distributed on the CPU: ranks as processes of this host, joined through shared memory.

The ranks run ``distributed_ranks.rank_main``: rank 0 in this process, the others in child processes. Each
all-reduce must equal the sum of the ranks' inputs made here with numpy in rank order (rank 0 + rank 1 +
rank 2, in float32, rounded once to the dtype), to the bit, on every rank and at every repetition; the
buffers are cut into several protocol steps (a small LLAISYS_CPU_COMM_SLOT_BYTES), at odd sizes. The
failures: a rank that is late (the error names it after the timeout), one that has exited (named at once),
an abort (every rank's wait ends with the reason), ranks that call different collectives (told so).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from pathlib import Path

import numpy as np
import pytest
from distributed_ranks import DTYPES, SIZES, SLOT_BYTES, inputs, rank_main, rank_sum

import llaisys

SLOT_ENV = "LLAISYS_CPU_COMM_SLOT_BYTES"


def run_ranks(scenario: str, world: int, groups: int, tmp_path: Path, timeout: float = 120) -> list[dict]:
    """Rank 0 in this process (a thread), the others in child processes; what each recorded."""
    ids = ",".join(llaisys.distributed.unique_id("cpu").hex() for _ in range(groups))
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).parent), "OMP_NUM_THREADS": "1"}
    outs = [tmp_path / f"{scenario}-{rank}.json" for rank in range(world)]
    children = [subprocess.Popen([sys.executable, "-m", "distributed_ranks", scenario, str(rank), str(world), ids,
                                  str(outs[rank])], env=env, stderr=subprocess.PIPE, text=True)
                for rank in range(1, world)]
    failed = []
    rank0 = threading.Thread(target=lambda: _record_failure(failed, rank_main, scenario, "0", str(world), ids,
                                                            str(outs[0])))
    saved = os.environ.get(SLOT_ENV)
    os.environ[SLOT_ENV] = str(SLOT_BYTES)  # rank 0 makes the segment: its size is rank 0's choice
    try:
        rank0.start()
        rank0.join(timeout)
    finally:
        os.environ.pop(SLOT_ENV) if saved is None else os.environ.update({SLOT_ENV: saved})
    for child in children:
        _, err = child.communicate(timeout=timeout)
        assert child.returncode == 0, err[-2000:]
    assert not failed and not rank0.is_alive(), failed
    return [json.loads(out.read_text()) if out.exists() else {} for out in outs]


def _record_failure(failed: list, fn, *args) -> None:
    try:
        fn(*args)
    except BaseException as e:  # (re-raised by the test)
        failed.append(repr(e))


@pytest.fixture(scope="module")
def sums(tmp_path_factory):
    return run_ranks("sums", 3, 1, tmp_path_factory.mktemp("sums"))


@pytest.mark.parametrize("dtype", DTYPES)
def test_all_reduce_sums_in_rank_order(sums, dtype):
    for size in SIZES:
        want = rank_sum([inputs(rank, size, dtype) for rank in range(3)]).astype(np.float32)
        for rank, results in enumerate(sums):
            for repeat in range(2 if dtype == "bfloat16" else 1):
                got = np.array(results[f"sum {dtype} {size} {repeat}"], np.float32)
                np.testing.assert_array_equal(got, want, err_msg=f"{dtype}, {size} values, rank {rank}, run {repeat}")


def test_all_reduce_recorded_in_a_graph_replays_with_new_inputs(sums):
    for repeat in range(2):
        want = rank_sum([inputs(rank + 10 * repeat, 4097, "bfloat16") for rank in range(3)]).astype(np.float32)
        for results in sums:
            np.testing.assert_array_equal(np.array(results[f"graph {repeat}"], np.float32), want)


def test_all_gather_and_broadcast(sums):
    for dtype, size in (("int8", 13), ("float32", 5000)):
        want = [(np.arange(size) * (rank + 1) % 100).astype(dtype).astype(np.float64) for rank in range(3)]
        for results in sums:
            np.testing.assert_array_equal(np.array(results[f"gather {dtype}"]), np.stack(want))
    for root, dtype, size in ((1, "float16", 4099), (2, "int64", 3)):
        want = (np.arange(size) + 7 * root).astype(dtype).astype(np.float64)
        for results in sums:
            np.testing.assert_array_equal(np.array(results[f"broadcast {root}"]), want)


def test_late_exited_aborted_and_out_of_step_ranks_end_the_waits(tmp_path):
    rank0, rank1 = run_ranks("failures", 2, 4, tmp_path)
    message, seconds = rank1["aborted"]
    assert "aborted by rank 0: the test stops here" in message, message
    message, seconds = rank0["late"]
    assert "rank 1 is late" in message and "1.5 s" in message and "rank 0 of 2: all_reduce" in message, message
    assert 1.4 <= seconds < 3.5, f"the late rank was named after {seconds:.2f} s (timeout 1.5 s)"
    message, _ = rank1["after abort"]
    assert "aborted by rank 0: rank 0 gave up" in message, message
    for results, mine, theirs in ((rank0, "all_reduce of 20 bytes", "broadcast from root 0 of 20 bytes"),
                                  (rank1, "broadcast from root 0 of 20 bytes", "all_reduce of 20 bytes")):
        message, _ = results["out of step"]
        assert "out of step" in message and f"in a {mine}" in message and f"in a {theirs}" in message, message
    message, seconds = rank0["exited"]
    assert "rank 1" in message and "has exited" in message, message
    assert seconds < 1.0, f"an exited rank was named after {seconds:.2f} s"


# -- in one process: arguments, and backends without collectives ----------------------------------------------

@pytest.fixture(scope="module")
def alone():
    group = llaisys.distributed.Group(llaisys.distributed.unique_id("cpu"), 0, 1, "cpu", timeout=5)
    yield group
    group.destroy()


def test_a_group_of_one_copies_and_checks_its_arguments(alone):
    t = llaisys.from_numpy(np.arange(6, dtype=np.float32).reshape(2, 3))
    alone.all_reduce(t)
    np.testing.assert_array_equal(t.numpy(), np.arange(6).reshape(2, 3))
    out = llaisys.empty((1, 2, 3), "float32")
    alone.all_gather(out, t)
    np.testing.assert_array_equal(out.numpy()[0], t.numpy())
    with pytest.raises(llaisys.LlaisysValueError, match="t must be contiguous"):
        alone.all_reduce(t.permute(1, 0))
    with pytest.raises(llaisys.LlaisysValueError, match="int64; all_reduce sums"):
        alone.all_reduce(llaisys.zeros((3,), "int64"))
    with pytest.raises(llaisys.LlaisysValueError, match=r"out must be float32 \(1, 2, 3\)"):
        alone.all_gather(llaisys.empty((2, 3), "float32"), t)
    with pytest.raises(llaisys.LlaisysValueError, match="overlap"):
        alone.all_gather(out, out.view(2, 3))
    with pytest.raises(llaisys.LlaisysValueError, match="root must be a rank in"):
        alone.broadcast(t, 1)
    with pytest.raises(llaisys.LlaisysValueError, match="a llaisys.Tensor"):
        alone.all_reduce(np.zeros(3, np.float32))


def test_group_arguments_and_a_destroyed_group():
    uid = llaisys.distributed.unique_id("cpu")
    with pytest.raises(llaisys.LlaisysValueError, match="rank 2 is not in"):
        llaisys.distributed.Group(uid, 2, 2)
    with pytest.raises(llaisys.LlaisysValueError, match="unique_id must be the 128 bytes"):
        llaisys.distributed.Group(uid[:10], 0, 1)
    with pytest.raises(llaisys.LlaisysValueError, match="not a unique id of the cpu backend"):
        llaisys.distributed.Group(bytes(128), 0, 1)
    group = llaisys.distributed.Group(uid, 0, 1, timeout=5)
    group.destroy()
    with pytest.raises(llaisys.LlaisysError, match="on a destroyed group"):
        group.all_reduce(llaisys.zeros((1,), "float32"))
    local = llaisys.distributed.local_group("cpu")
    t = llaisys.from_numpy(np.ones(4, np.float32))
    local.all_reduce(t)
    assert local.world_size == 1 and (t.numpy() == 1).all()


def test_the_default_group():
    with pytest.raises(llaisys.LlaisysError, match="no default group"):
        llaisys.distributed.all_reduce(llaisys.zeros((1,), "float32"))
    llaisys.distributed.init(llaisys.distributed.unique_id("cpu"), 0, 1, timeout=5)
    try:
        assert llaisys.distributed.is_initialized()
        t = llaisys.from_numpy(np.full(3, 2.0, np.float32))
        llaisys.distributed.all_reduce(t)
        llaisys.distributed.barrier()
        assert (t.numpy() == 2).all()
    finally:
        llaisys.distributed.destroy()
    assert not llaisys.distributed.is_initialized()


def test_a_backend_without_collectives_reports_them_unsupported(fake_library):
    backend = llaisys.NativeBackend("fake", fake_library(), "llaisys_fake")
    assert backend.supports("collectives") is False and backend.capabilities()["collectives"] is False
    with pytest.raises(llaisys.NotSupportedError, match="does not support collectives"):
        backend.comm_unique_id(0)
