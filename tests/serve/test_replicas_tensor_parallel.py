"""Tensor-parallel ranks as Ray actors (tensor_parallel/ray_ranks.py; ``distributed_executor="ray"``), on the local
Ray cluster of two nodes on 127.0.0.1 (tests/ray_cluster.py, shared with test_replicas.py), one CPU each:

- the chat model (f32 Qwen2) split over 2 ranks, rank 0 here and rank 1 an actor on the other Ray node (one
  bundle per node): the same greedy tokens as the model on one rank (the two nodes are one host, so the CPU's
  shared-memory collectives reach across them; ranks on two real hosts are refused: test_tensor_parallel.py);
- a rank actor killed (SIGKILL) ends the group with one line naming it, well within 30 s; nothing stays behind
  (no actor process, no placement group).
"""

from __future__ import annotations

import contextlib
import importlib.util
import os
import signal
import time

import numpy as np
import pytest
from ray_cluster import processes_titled
from serve_helpers import wait_until

if importlib.util.find_spec("ray") is None:
    pytest.skip("Ray is not installed: pip install 'llaisys-models[ray]'", allow_module_level=True)

import llaisys_models  # noqa: E402
from llaisys_models.errors import RankFailedError  # noqa: E402

pytestmark = pytest.mark.slow  # a Ray cluster starts (unless test_replicas.py has started it)

RANK_PROCESS = b"ray::TensorParallelRank"  # a rank actor's process title
NEW = 16


@pytest.fixture(scope="module")
def cluster(ray_cluster):
    return ray_cluster.start()


@contextlib.contextmanager
def split_on_ray(path, monkeypatch):
    """The model at ``path`` split over 2 ranks, rank 1 a Ray actor; closed at the end."""
    monkeypatch.setenv("OMP_NUM_THREADS", "1")  # each rank's bundle: one core (a node's only one)
    model = llaisys_models.load(path, device="cpu", tensor_parallel=2, distributed_executor="ray")
    try:
        yield model
    finally:
        model.close()


def prompt(length: int) -> list[int]:
    return np.random.default_rng(length).integers(32, 127, size=length).tolist()  # (printable: the chat model's)


def test_a_rank_on_each_ray_node_gives_one_rank_s_greedy_tokens(cluster, chat_model_dir, monkeypatch):
    whole = llaisys_models.load(chat_model_dir, device="cpu")
    with split_on_ray(chat_model_dir, monkeypatch) as model:
        places = model.followers.ranks.places
        assert places[0].node != places[1].node, "the two ranks are on one Ray node"
        assert places[0].host == places[1].host and places[1].pid != os.getpid()
        for length in (1, 13, 64):
            ids = prompt(length)
            assert model.generate(ids, NEW, eos_token_ids=()) == whole.generate(ids, NEW, eos_token_ids=()), length
        prompts = [prompt(n) for n in (5, 21)]
        assert model.generate_batch(prompts, NEW, eos_token_ids=()) == whole.generate_batch(prompts, NEW,
                                                                                             eos_token_ids=())


def test_a_killed_rank_actor_ends_the_group(cluster, chat_model_dir, monkeypatch):
    from ray.util.placement_group import placement_group_table

    with split_on_ray(chat_model_dir, monkeypatch) as model:
        ranks = model.followers.ranks
        ids = prompt(13)
        model.generate(ids, 4)
        os.kill(ranks.places[1].pid, signal.SIGKILL)
        start = time.monotonic()
        with pytest.raises(RankFailedError, match="rank 1") as failed:
            model.generate(ids, 200)
        seconds = time.monotonic() - start
        assert seconds < 30, f"the group ended after {seconds:.1f} s"
        assert "\n" not in str(failed.value), str(failed.value)
        with pytest.raises(RankFailedError, match="rank 1"):
            model.generate(ids, 2)
    assert wait_until(lambda: not processes_titled(cluster, RANK_PROCESS), 30), "a rank actor stays"
    assert wait_until(lambda: placement_group_table(ranks.placement)["state"] == "REMOVED", 30)
