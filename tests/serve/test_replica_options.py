"""``llaisys serve --replicas`` options: checked before anything starts, and what they ask of Ray Serve
(serve/replicas/launch.py): no Ray needed."""

from __future__ import annotations

import argparse

import pytest

from helpers.serve_helpers import require_serving

require_serving()

from llaisys import LlaisysValueError  # noqa: E402
from llaisys_models.serve.cli import check_replica_options, register_serve  # noqa: E402
from llaisys_models.serve.replicas.launch import replica_bundles, replica_resources, scaling_options  # noqa: E402


def parse(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    register_serve(parser.add_subparsers())
    return parser.parse_args(["serve", *argv])


@pytest.mark.parametrize("argv, message", [
    (["--max-replicas", "3"], "--max-replicas needs --replicas"),
    (["--ray-address", "auto"], "--ray-address needs --replicas"),
    (["--replicas", "0"], "--replicas = 0 is out of range"),
    (["--replicas", "3", "--max-replicas", "2"], "--max-replicas = 2 is less than --replicas = 3"),
    (["--replicas", "2", "--target-ongoing-requests", "0"], "--target-ongoing-requests = 0.0 is out of range"),
    (["--replicas", "2", "--replica-cpus", "-1"], "--replica-cpus = -1.0 is out of range"),
    (["--replicas", "2", "--tensor-parallel", "2", "--distributed-executor", "local"],
     "a replica's tensor-parallel ranks are Ray actors"),
    (["--replicas", "2", "--tensor-parallel", "2", "--replica-cpus", "0"], "they cannot both be 0"),
])
def test_bad_replica_options_are_refused(argv, message):
    with pytest.raises(LlaisysValueError, match=message):
        check_replica_options(parse(*argv))


def test_a_fixed_count_or_autoscaling_bounds():
    assert scaling_options(parse("--replicas", "2")) == {"num_replicas": 2}
    assert scaling_options(parse("--replicas", "2", "--max-replicas", "2")) == {"num_replicas": 2}
    bounds = scaling_options(parse("--replicas", "1", "--max-replicas", "4", "--max-running", "8"))
    assert bounds == {"autoscaling_config": {"min_replicas": 1, "initial_replicas": 1, "max_replicas": 4,
                                             "target_ongoing_requests": 8}}  # a replica is busy at --max-running
    target = scaling_options(parse("--replicas", "1", "--max-replicas", "4", "--target-ongoing-requests", "3"))
    assert target["autoscaling_config"]["target_ongoing_requests"] == 3


def test_what_each_replica_reserves():
    assert replica_resources(parse("--replicas", "2")) == {"num_cpus": 1.0, "num_gpus": 0.0}
    assert replica_resources(parse("--replicas", "2", "--device", "cuda:0")) == {"num_cpus": 1.0, "num_gpus": 1.0}
    assert replica_resources(parse("--replicas", "2", "--replica-cpus", "4", "--replica-gpus", "0.5")) == \
        {"num_cpus": 4.0, "num_gpus": 0.5}


def test_a_tensor_parallel_replica_reserves_a_bundle_per_rank():
    """Ray Serve's placement_group_bundles: the replica (rank 0) in the first, its other ranks' actors in the rest."""
    assert replica_bundles(parse("--replicas", "2")) is None
    assert replica_bundles(parse("--replicas", "2", "--tensor-parallel", "2")) == [{"CPU": 1.0}, {"CPU": 1.0}]
    assert replica_bundles(parse("--replicas", "1", "--tensor-parallel", "3", "--replica-cpus", "2")) == \
        [{"CPU": 2.0}] * 3
    assert replica_bundles(parse("--replicas", "1", "--tensor-parallel", "2", "--device", "cuda")) == \
        [{"CPU": 1.0, "GPU": 1.0}] * 2


def test_ranks_on_ray_without_replicas():
    from llaisys_models.cli.generate import tensor_parallel_options

    args = parse("--tensor-parallel", "2", "--distributed-executor", "ray", "--ray-address", "auto")
    check_replica_options(args)  # (--ray-address: the ranks' cluster)
    assert tensor_parallel_options(args) == {"tensor_parallel": 2, "distributed_executor": "ray"}
    with pytest.raises(LlaisysValueError, match="--distributed-executor ray places the ranks of --tensor-parallel N"):
        tensor_parallel_options(parse("--distributed-executor", "ray"))
