"""Ranks 1 .. N-1 of a tensor-parallel group as Ray actors: ``load(..., tensor_parallel=N,
distributed_executor="ray")``, ``llaisys generate|infer|serve --tensor-parallel N --distributed-executor ray``,
and each replica of ``llaisys serve --replicas R --tensor-parallel N``. Rank 0 is this process (the engine).

Placement: a placement group of one bundle per rank, rank r's actor in bundle r: its cores on the CPU
({"CPU": threads}), its GPU on accelerators ({"CPU": 1, "GPU": 1}). Bundle 0 is rank 0's:
  * this process already runs in a placement group (a Ray Serve replica of a tensor-parallel deployment: Serve
    puts the replica in bundle 0 of its group, serve/replicas): that group;
  * elsewhere (a driver): a group made here, bundle 0 on this process's node (a label selector), removed at
    the end; on accelerators a seat actor holds bundle 0's GPU and says which it is, for rank 0 to use.
Strategy PACK: on one node when the ranks fit, else over several. Ranks on the CPU must share one host
(hosts.py: their collectives are shared memory): each actor says where it landed, and a rank on another host
than rank 0's is refused with one line; two Ray nodes of one machine are one host. Ranks on GPUs (NCCL) may
be on any node.

Ray carries what the control store carries for processes (connected.py): the actors' start and where they
landed (``where``), the group's unique id and what to load (``load``'s arguments), ready or the error (its
result), then ``follow``: it returns when rank 0 says stop, raises a rank's failure, or fails with Ray's
ActorDiedError when the actor's process dies, which the supervisor (followers.py) sees at once. Steps go through
the group's own broadcast, as with processes; a rank that hangs is the collectives' timeout to name. Ray ends
the actors when their owner (this process) ends, and the group made here with it.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import os
import re
from typing import Any

import ray
from ray.exceptions import GetTimeoutError, RayActorError, RayTaskError
from ray.util.placement_group import PlacementGroup, get_current_placement_group, placement_group, remove_placement_group
from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

import llaisys

from . import worker
from .hosts import Place, check_one_host, host_key
from .options import LoadOptions
from .store import STARTUP_TIMEOUT

NODE_ID_LABEL = "ray.io/node-id"  # every Ray node's label: its id


class TensorParallelRank:
    """Rank r of a group, in a Ray actor: ``load`` joins the group and loads its part, ``follow`` runs rank 0's
    steps until it says stop."""

    def where(self) -> Place:
        return Place(ray.get_runtime_context().get_node_id(), ray.util.get_node_ip_address(), host_key(),
                     os.getpid())

    def load(self, rank: int, world_size: int, unique_id: bytes, options: dict[str, Any]) -> None:
        load_options = LoadOptions(**options)
        # (on accelerators Ray shows the actor the GPU of its bundle alone: device 0)
        device = "cpu" if load_options.device_type == "cpu" else f"{load_options.device_type}:0"
        self.model, self.group = worker.join(rank, world_size, unique_id, load_options, device)

    def follow(self) -> None:
        worker.follow_to_the_end(self.model, self.group)


class Seat:
    """Holds bundle 0 of a group made by a driver on accelerators (rank 0 is the driver, which Ray does not
    place) and says which GPU Ray reserved there."""

    def gpu_ids(self) -> list[int] | list[str]:
        return ray.get_gpu_ids()


_RankActor = ray.remote(max_restarts=0)(TensorParallelRank)
_SeatActor = ray.remote(max_restarts=0)(Seat)


def connect() -> None:
    """Join the Ray cluster this process is in, or RAY_ADDRESS names; else start one of this machine (launch.py
    keeps its ports on 127.0.0.1 and Ray's usage reports off, unless the environment says otherwise)."""
    if not ray.is_initialized():
        ray.init(include_dashboard=False, logging_level=logging.WARNING)


def bundles(world_size: int, device_type: str, threads: int) -> list[dict[str, float]]:
    """One bundle per rank: its cores on the CPU, its GPU (and a core to drive it) on accelerators."""
    one = {"CPU": float(threads)} if device_type == "cpu" else {"CPU": 1.0, "GPU": 1.0}
    return [dict(one) for _ in range(world_size)]


class RayRanks:
    """``followers.Ranks`` on Ray: ``place`` (the placement group and the actors, started and checked), then
    ``hand_out`` (the unique id and what to load)."""

    def __init__(self, world_size: int, device: llaisys.Device, group: PlacementGroup, own_group: bool) -> None:
        self.world_size, self.rank_0_device = world_size, device
        self.placement, self._own_placement = group, own_group
        # actor handles: Any, as Ray's own types cannot call their methods (ActorProxy: a handle or the class)
        self.actors: dict[int, Any] = {}
        self.places: dict[int, Place] = {}
        self._seat: Any = None
        self._loads: dict[ray.ObjectRef, int] = {}
        self._follows: dict[ray.ObjectRef, int] = {}
        self._stopped = False

    @classmethod
    def place(cls, world_size: int, first: llaisys.Device, threads: int | None) -> RayRanks:
        """Ranks 1 .. N-1 started as actors of a placement group (see the module docstring) and placed: on the
        CPU every rank on rank 0's host. ``first``: rank 0's device as asked; ``threads``: each CPU rank's cores
        (None: OMP_NUM_THREADS)."""
        connect()
        current = get_current_placement_group()
        if current is None:
            shape = bundles(world_size, first.type, threads or _omp_threads())
            here = ray.get_runtime_context().get_node_id()
            group = placement_group(shape, strategy="PACK",
                                    bundle_label_selector=[{NODE_ID_LABEL: here}] + [{}] * (world_size - 1))
        elif len(current.bundle_specs) < world_size:
            raise llaisys.LlaisysError(f"this process runs in a Ray placement group of {len(current.bundle_specs)} "
                                       f"bundles, and {world_size} tensor-parallel ranks need one each (this "
                                       f"process, rank 0, in bundle 0)")
        else:
            group = current
        ranks = cls(world_size, first, group, current is None)
        try:
            ranks._start()
        except BaseException:
            ranks.stop(grace=0.0)
            raise
        return ranks

    def _start(self) -> None:
        try:
            ray.get(self.placement.ready(), timeout=STARTUP_TIMEOUT)
        except GetTimeoutError:
            raise llaisys.LlaisysError(
                f"the Ray cluster has not found room for {self.world_size} tensor-parallel ranks within "
                f"{STARTUP_TIMEOUT:.0f} s (bundles {self.placement.bundle_specs}, rank 0's on this node; free: "
                f"{ray.available_resources()})") from None
        if self._own_placement and self.rank_0_device.type != "cpu":
            self._seat = _SeatActor.options(num_cpus=0, num_gpus=self.placement.bundle_specs[0]["GPU"],
                                            scheduling_strategy=self._bundle(0)).remote()
            gpu = ray.get(self._seat.gpu_ids.remote(), timeout=STARTUP_TIMEOUT)[0]
            self.rank_0_device = llaisys.Device(self.rank_0_device.type, visible_index(gpu))
        for rank in range(1, self.world_size):
            spec = self.placement.bundle_specs[rank]
            self.actors[rank] = _RankActor.options(num_cpus=spec.get("CPU", 0), num_gpus=spec.get("GPU", 0),
                                                   scheduling_strategy=self._bundle(rank)).remote()
        calls = {rank: actor.where.remote() for rank, actor in self.actors.items()}
        for rank, call in calls.items():
            try:
                self.places[rank] = ray.get(call, timeout=STARTUP_TIMEOUT)
            except GetTimeoutError:
                raise llaisys.LlaisysError(f"tensor-parallel rank {rank}'s Ray actor did not start within "
                                           f"{STARTUP_TIMEOUT:.0f} s") from None
            except RayActorError as e:
                raise llaisys.LlaisysError(f"tensor-parallel {self._died(rank, e)} as it started") from None
        self.places[0] = Place(ray.get_runtime_context().get_node_id(), ray.util.get_node_ip_address(), host_key(),
                               os.getpid())
        if self.rank_0_device.type == "cpu":
            check_one_host(self.places)

    def _bundle(self, rank: int) -> PlacementGroupSchedulingStrategy:
        return PlacementGroupSchedulingStrategy(self.placement, placement_group_bundle_index=rank)

    def hand_out(self, unique_id: bytes, options: LoadOptions) -> None:
        """Every rank joins the group ``unique_id`` and loads its part (the calls run while rank 0 joins too)."""
        fields = dataclasses.asdict(options)
        self._loads = {actor.load.remote(rank, self.world_size, unique_id, fields): rank
                       for rank, actor in self.actors.items()}

    # -- followers.Ranks ------------------------------------------------------------------------------

    def wait_ready(self) -> None:
        while self._loads:
            done, _ = ray.wait(list(self._loads), num_returns=1, timeout=1.0)
            for call in done:
                rank = self._loads.pop(call)
                try:
                    ray.get(call)
                except RayActorError as e:
                    raise llaisys.LlaisysError(f"tensor-parallel {self._died(rank, e)} while loading") from None
                except RayTaskError as e:
                    raise llaisys.LlaisysError(f"tensor-parallel rank {rank} could not load: {_line(e)}") from None
                self._follows[self.actors[rank].follow.remote()] = rank

    def watching(self) -> bool:
        return bool(self._follows)

    def watch(self, timeout: float) -> list[str]:
        calls = list(self._follows)
        if not calls:
            return []
        try:
            done, _ = ray.wait(calls, num_returns=1, timeout=timeout)
        except Exception:
            if ray.is_initialized():
                raise
            self._follows.clear()  # (Ray was shut down under us, at the process's end: nothing left to watch)
            return []
        return [self._end_of(self._follows.pop(call), call) for call in done]

    def ended(self, wait: float) -> str | None:
        follows = dict(self._follows)
        if not follows:
            return None
        done, _ = ray.wait(list(follows), num_returns=len(follows), timeout=wait)
        for call in done:
            try:
                ray.get(call)
            except RayActorError as e:
                return self._died(follows[call], e)
            except RayTaskError:
                pass
        return None

    def stop(self, grace: float) -> None:
        if self._stopped:
            return
        self._stopped = True
        running = list(self._follows)
        if grace > 0 and running:  # (after a stop message: they are leaving)
            ray.wait(running, num_returns=len(running), timeout=grace)
        for actor in [*self.actors.values(), self._seat]:
            if actor is not None:
                with contextlib.suppress(Exception):
                    ray.kill(actor, no_restart=True)
        if self._own_placement:
            with contextlib.suppress(Exception):
                remove_placement_group(self.placement)

    # -- one-line descriptions ------------------------------------------------------------------------

    def _end_of(self, rank: int, call: ray.ObjectRef) -> str:
        try:
            ray.get(call)
        except RayActorError as e:
            return self._died(rank, e)
        except RayTaskError as e:
            return f"rank {rank}: {_line(e)}"
        return f"rank {rank} left the group"

    def _died(self, rank: int, error: RayActorError) -> str:
        place = self.places.get(rank)
        where = f"pid {place.pid} on {place.address}" if place else "not started yet"
        text = str(error)
        reason = re.search(r"The actor is dead because ([^.]+)", text)
        kind = re.search(r"Worker exit type: (\w+)", text)
        return (f"rank {rank} (a Ray actor, {where}) died: {reason.group(1) if reason else 'Ray says so'}"
                + (f" ({kind.group(1)})" if kind else ""))


def _line(error: RayTaskError) -> str:
    """The actor's own exception, on one line."""
    cause = getattr(error, "cause", None) or error
    return f"{type(cause).__name__}: {cause}".splitlines()[0]


def _omp_threads() -> int:
    """OMP_NUM_THREADS's (first) number, else 1."""
    match = re.match(r"\s*(\d+)", os.environ.get("OMP_NUM_THREADS", ""))
    return max(1, int(match[1])) if match else 1


def visible_index(gpu_id: int | str) -> int:
    """The index in this process of the GPU Ray calls ``gpu_id`` (CUDA_VISIBLE_DEVICES renumbers them)."""
    visible = [v.strip() for v in os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",") if v.strip()]
    if not visible:
        return int(gpu_id)
    if str(gpu_id) not in visible:
        raise llaisys.LlaisysError(f"Ray reserved GPU {gpu_id} for tensor-parallel rank 0 (this process), which "
                                   f"CUDA_VISIBLE_DEVICES={','.join(visible)} hides from it")
    return visible.index(str(gpu_id))
