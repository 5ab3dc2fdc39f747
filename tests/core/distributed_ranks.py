"""The ranks of tests/core/test_distributed.py: each runs in its own process (rank 0 in the test's), joins a
group through shared memory and records what its collectives gave (a JSON file the test reads).

    python -m distributed_ranks SCENARIO RANK WORLD IDS OUT
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

import numpy as np

import llaisys

DTYPES = ("float32", "float16", "bfloat16")
SIZES = (1, 17, 1536, 4097, 10007)
SLOT_BYTES = 4096  # per rank and buffer: 10007 f32 values take 10 steps


def inputs(rank: int, size: int, dtype: str) -> np.ndarray:
    rng = np.random.default_rng(1000 * rank + size)
    return (rng.standard_normal(size) * 3).astype(llaisys.as_dtype(dtype).numpy)


def rank_sum(arrays: list[np.ndarray]) -> np.ndarray:
    """rank 0 + rank 1 + ... in float32, in that order, rounded once to the arrays' dtype."""
    total = arrays[0].astype(np.float32)
    for a in arrays[1:]:
        total = total + a.astype(np.float32)
    return total.astype(arrays[0].dtype)


def rank_main(scenario: str, rank: str, world: str, ids: str, out: str) -> None:
    rank, world = int(rank), int(world)
    uids = [bytes.fromhex(h) for h in ids.split(",")]
    results: dict = {}
    if scenario == "sums":
        _sums(rank, world, uids[0], results)
    else:
        _failures(rank, world, uids, results, Path(out))
    Path(out).write_text(json.dumps(results))


def _sums(rank: int, world: int, uid: bytes, results: dict) -> None:
    group = llaisys.distributed.Group(uid, rank, world, "cpu", timeout=60)
    for dtype in DTYPES:
        for size in SIZES:
            for repeat in range(2 if dtype == "bfloat16" else 1):  # (the same bits every time)
                t = llaisys.from_numpy(inputs(rank, size, dtype))
                group.all_reduce(t)
                results[f"sum {dtype} {size} {repeat}"] = t.numpy().astype(np.float32).tolist()
    # recorded in a graph, replayed with new inputs in the same buffer
    graph, t = llaisys.Graph("cpu"), llaisys.from_numpy(inputs(rank, 4097, "bfloat16"))
    group.all_reduce(t)  # (an eager call first: the capture allocates nothing new)
    with graph.capture():
        group.all_reduce(t)
    for repeat in range(2):
        t.load(inputs(rank + 10 * repeat, 4097, "bfloat16"))
        graph.replay()
        results[f"graph {repeat}"] = t.numpy().astype(np.float32).tolist()
    graph.close()
    for dtype, size in (("int8", 13), ("float32", 5000)):
        mine = llaisys.from_numpy((np.arange(size) * (rank + 1) % 100).astype(dtype))
        out = llaisys.empty((world, size), dtype)
        group.all_gather(out, mine)
        results[f"gather {dtype}"] = out.numpy().astype(np.float64).tolist()
    for root, dtype, size in ((1, "float16", 4099), (world - 1, "int64", 3)):
        t = llaisys.from_numpy((np.arange(size) + 7 * rank).astype(dtype))
        group.broadcast(t, root)
        results[f"broadcast {root}"] = t.numpy().astype(np.float64).tolist()
    group.barrier()
    group.destroy()


def _failures(rank: int, world: int, uids: list[bytes], results: dict, out: Path) -> None:
    def attempt(name: str, call) -> None:
        start = time.monotonic()
        try:
            call()
            results[name] = ["no error", time.monotonic() - start]
        except llaisys.LlaisysError as e:
            results[name] = [str(e), time.monotonic() - start]

    one = llaisys.zeros((5,), "float32")
    # an abort ends a broadcast's wait for its root
    group = llaisys.distributed.Group(uids[0], rank, world, "cpu", timeout=60)
    if rank == 0:
        time.sleep(0.3)
        group.abort("the test stops here")
    else:
        attempt("aborted", lambda: group.broadcast(one, 0))
    group.destroy()
    # a late rank is named after the timeout; the waiting rank then aborts, and the late one learns why
    group = llaisys.distributed.Group(uids[1], rank, world, "cpu", timeout=1.5)
    if rank == 0:
        attempt("late", lambda: group.all_reduce(one))
        group.abort("rank 0 gave up")
    else:
        time.sleep(3.0)
        attempt("after abort", lambda: group.all_reduce(one))
    group.destroy()
    # ranks that call different collectives are told so (not handed each other's data)
    group = llaisys.distributed.Group(uids[3], rank, world, "cpu", timeout=60)
    if rank == 0:
        attempt("out of step", lambda: group.all_reduce(one))
    else:
        attempt("out of step", lambda: group.broadcast(one, 0))
    group.destroy()
    # a rank that exits is named at once (not after the timeout)
    group = llaisys.distributed.Group(uids[2], rank, world, "cpu", timeout=60)
    if rank == 1:
        out.write_text(json.dumps(results))
        os._exit(0)  # gone without leaving the group
    attempt("exited", lambda: group.all_reduce(one))
    group.destroy()



if __name__ == "__main__":
    rank_main(*sys.argv[1:])
