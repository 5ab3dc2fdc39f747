"""``llaisys serve --replicas N``: start (or join) a Ray cluster and run the application on it until stopped."""

from __future__ import annotations

import argparse
import logging
import os
import signal
import sys
import threading
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ray.serve import Application

RAY_EXTRA = "pip install 'llaisys-models[ray]'"
SERVE_LOGGING = {"log_level": "WARNING", "enable_access_log": False}  # Ray Serve's INFO lines, one per request


def replica_application(args: argparse.Namespace, path: Path, kv_memory: int | None, keys: list[str],
                        port: int) -> Application:
    """The Ray Serve application ``llaisys serve`` options ``args`` (checked: ``cli.checked_options``) describe,
    for clients that reach it at ``args.host``:``port``."""
    from ..tenancy import Tenants
    from .deployments import application

    options = {name: value for name, value in vars(args).items() if name != "func"}
    options.update(path=path, kv_memory=kv_memory, key_digests=Tenants.of_keys(keys).digests, port=port)
    if args.tensor_parallel > 1:  # a replica's ranks 1 .. N-1: Ray actors in the replica's placement group
        options.update(distributed_executor="ray")
    return application(options, scaling_options(args), replica_resources(args), replica_bundles(args))


def scaling_options(args: argparse.Namespace) -> dict[str, Any]:
    """The replica deployment's count: ``--replicas`` fixed, or (``--max-replicas`` more) Ray Serve's autoscaling
    between the two, aiming at ``--target-ongoing-requests`` per replica (default ``--max-running``: a replica
    is busy once its engine runs all it can at once)."""
    if args.max_replicas is None or args.max_replicas == args.replicas:
        return {"num_replicas": args.replicas}
    target = args.target_ongoing_requests or args.max_running
    return {"autoscaling_config": {"min_replicas": args.replicas, "initial_replicas": args.replicas,
                                   "max_replicas": args.max_replicas, "target_ongoing_requests": target}}


def replica_resources(args: argparse.Namespace) -> dict[str, float]:
    """What each replica reserves (Ray's ``ray_actor_options``): ``--replica-cpus`` cores (1), which Ray also makes
    its kernels' thread count (OMP_NUM_THREADS), and ``--replica-gpus`` (1 where --device names a GPU, else 0)."""
    gpus = args.replica_gpus if args.replica_gpus is not None else float(_names_a_gpu(args.device))
    return {"num_cpus": 1.0 if args.replica_cpus is None else args.replica_cpus, "num_gpus": gpus}


def replica_bundles(args: argparse.Namespace) -> list[dict[str, float]] | None:
    """A tensor-parallel replica's placement group (Ray Serve's ``placement_group_bundles``): one bundle per rank,
    each what ``replica_resources`` reserves; the replica, rank 0, takes bundle 0 and starts its ranks 1 .. N-1
    in the others (tensor_parallel/ray_ranks.py). None for a replica of one rank."""
    if args.tensor_parallel <= 1:
        return None
    resources = replica_resources(args)
    bundle = {name: amount for name, amount in (("CPU", resources["num_cpus"]), ("GPU", resources["num_gpus"]))
              if amount}
    return [dict(bundle) for _ in range(args.tensor_parallel)]


def _names_a_gpu(device: str | None) -> bool:
    return device is not None and device.split(":")[0] != "cpu"


def serve_replicas(args: argparse.Namespace, path: Path, kv_memory: int | None, keys: list[str]) -> int:
    from ..hosts import is_loopback

    if args.ray_address is None:  # the cluster started here is this machine's, for this server alone
        os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")  # (nobody asked for Ray's usage reports)
        if is_loopback(args.host):  # its ports (unauthenticated: whoever reaches them runs code) stay on loopback,
            os.environ["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = "0"  # as the server's (else Ray takes the outward IP)
    try:
        import ray
        from ray import serve
    except ImportError as e:
        print(f"llaisys: error: --replicas needs the 'ray' extra ({e.name or e} is missing): {RAY_EXTRA}",
              file=sys.stderr)
        return 2
    from ..launch import bind
    from .deployments import APP_NAME

    probe = bind(args.host, args.port)  # a port in use fails at once; --port 0 takes a free one
    port = probe.getsockname()[1]
    probe.close()  # (Ray Serve's proxy binds it)
    app = replica_application(args, path, kv_memory, keys, port)
    joined = args.ray_address is not None
    ray.init(address=args.ray_address, include_dashboard=False, logging_level=logging.WARNING)
    stop = threading.Event()
    previous = signal.signal(signal.SIGTERM, lambda *_: stop.set())
    try:
        serve.start(http_options={"host": args.host, "port": port}, logging_config=SERVE_LOGGING)
        serve.run(app, name=APP_NAME, route_prefix="/", logging_config=SERVE_LOGGING)
        if not is_loopback(args.host):
            print(f"llaisys serve: warning: binding {args.host} exposes the server beyond this machine"
                  + ("" if keys else " without an API key"), file=sys.stderr)
        host = f"[{args.host}]" if ":" in args.host else args.host
        cluster = f"the Ray cluster at {args.ray_address}" if joined else "a Ray cluster of this machine"
        count = f"{args.replicas}..{args.max_replicas}" if args.max_replicas else str(args.replicas)
        split = f", each split over {args.tensor_parallel} ranks" if args.tensor_parallel > 1 else ""
        print(f"llaisys serve: {count} replica{'' if count == '1' else 's'} of "
              f"{path.name}{split} on {cluster} at http://{host}:{port}/  (OpenAI API under /v1"
              f"{', API key required' if keys else ''}; Ctrl+C stops)", file=sys.stderr, flush=True)
        try:
            stop.wait()
        except KeyboardInterrupt:
            pass
    finally:
        signal.signal(signal.SIGTERM, previous)
        if joined:
            serve.delete(APP_NAME)  # the cluster, and Serve on it, stay for whoever else uses them
        else:
            serve.shutdown()
        ray.shutdown()
    return 0
