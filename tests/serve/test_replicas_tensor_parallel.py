"""Tensor-parallel ranks as Ray actors (tensor_parallel/ray_ranks.py; ``distributed_executor="ray"``), on the local
Ray cluster of two nodes on 127.0.0.1 (tests/ray_cluster.py, shared with test_replicas.py), one CPU each:

- the chat model (f32 Qwen2) split over 2 ranks, rank 0 here and rank 1 an actor on the other Ray node (one
  bundle per node): the same greedy tokens as the model on one rank (the two nodes are one host, so the CPU's
  shared-memory collectives reach across them; ranks on two real hosts are refused: test_tensor_parallel.py);
- a rank actor killed (SIGKILL) ends the group with one line naming it, well within 30 s; nothing stays behind
  (no actor process, no placement group);
- ``llaisys serve --replicas 1 --tensor-parallel 2`` (as ``serve run`` builds it): the replica reserves a bundle per
  rank, starts its rank 1 in the second, and answers a chat as the single server does.
"""

from __future__ import annotations

import contextlib
import importlib.util
import os
import signal
import socket
import time

import numpy as np
import pytest

from helpers.ray_cluster import LOOPBACK, processes_titled
from helpers.serve_helpers import CHAT_MODEL, http_request, require_serving, user, wait_until

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


@pytest.fixture(scope="module")
def tensor_parallel_replica(cluster, chat_model_dir):
    """The base URL of one replica of 2 ranks on Ray Serve (the cluster's two cores: a bundle each)."""
    require_serving()
    from ray import serve

    from llaisys_models.serve.ray_app import build_app
    from llaisys_models.serve.replicas.deployments import APP_NAME

    with socket.socket() as s:
        s.bind((LOOPBACK, 0))
        port = s.getsockname()[1]
    quiet = {"log_level": "WARNING", "enable_access_log": False}
    serve.start(http_options={"host": LOOPBACK, "port": port}, proxy_location="HeadOnly", logging_config=quiet)
    app = build_app({"model": str(chat_model_dir), "replicas": "1", "tensor-parallel": "2",
                     "served-model-name": CHAT_MODEL, "max-running": "4", "kv-memory": "16MiB", "port": str(port)})
    try:
        serve.run(app, name=APP_NAME, route_prefix="/", logging_config=quiet)
        yield f"http://{LOOPBACK}:{port}"
    finally:
        serve.shutdown()


def test_a_tensor_parallel_replica_answers_as_the_single_server(tensor_parallel_replica, cluster, chat_server):
    body = {"model": CHAT_MODEL, "messages": user("Split me over two ranks."), "max_tokens": 24, "temperature": 0}
    reply = http_request(tensor_parallel_replica, "POST", "/v1/chat/completions", body, timeout=120)
    assert reply.status == 200, reply.text
    want = http_request(chat_server.base_url, "POST", "/v1/chat/completions", body).json()
    assert reply.json()["choices"][0]["message"]["content"] == want["choices"][0]["message"]["content"]
    assert len(processes_titled(cluster, RANK_PROCESS)) == 1  # the replica's rank 1
