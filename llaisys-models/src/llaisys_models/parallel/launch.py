"""``llaisys_models.load(path, tensor_parallel=N)``: N ranks, one device each, this process rank 0.

Rank 0 makes the group's unique id, listens with its control store, starts ranks 1 .. N-1 (a RankLauncher:
processes of this host by default), hands each the id and what to load, joins the group, loads its own part
and waits until every rank is ready; it returns its model, which drives the others (followers.py).
With ``distributed_executor="ray"`` Ray starts ranks 1 .. N-1 as actors in a placement group, possibly on
other machines, and carries the id, what to load and their end instead of the store (ray_ranks.py).

Ranks the user starts: with RANK, WORLD_SIZE, MASTER_ADDR and MASTER_PORT in the environment (torchrun's
names; LLAISYS_MASTER_PORT wins over MASTER_PORT, for launchers such as torchrun whose own agent holds
MASTER_PORT; LOCAL_RANK picks the device where set), each process calls the same ``load``: rank 0's store
listens on MASTER_ADDR:MASTER_PORT, the others connect to it, get the unique id and what to load from it,
and serve inside ``load`` until rank 0 closes the group, then leave the process (SystemExit(0)).
LLAISYS_DIST_AUTHKEY, when set on every rank, authenticates them to the store.

On the CPU every rank runs on the cpu device, the cores split between them: ranks this process starts get
OMP_NUM_THREADS = cores / N unless OMP_NUM_THREADS is set (then each rank gets that); rank 0 keeps this
process's threads (``llaisys generate|serve --tensor-parallel N`` sets them before the CPU backend starts).
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import secrets
import sys
import weakref
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING

import llaisys

from ..errors import ModelLoadError
from ..families.causal_lm import CausalLM
from ..families.config import ModelConfig
from ..loading import loader
from ..loading.device import pick_device
from ..loading.hub import resolve
from ..loading.quantize import resolve as resolve_quantize
from . import store, worker
from .connected import ConnectedRanks
from .followers import Followers, Ranks
from .launcher import LocalProcesses, RankLauncher, RankSpec, exit_description
from .layout import Layout
from .options import LoadOptions

if TYPE_CHECKING:  # (imported when asked for: it imports Ray)
    from .ray_ranks import RayRanks


@dataclasses.dataclass(frozen=True)
class ExternalRank:
    """A rank the user started, as the environment describes it."""
    rank: int
    world_size: int
    host: str
    port: int
    local_rank: int

    @classmethod
    def from_environment(cls, environ: Mapping[str, str] = os.environ) -> ExternalRank | None:
        if "RANK" not in environ or "WORLD_SIZE" not in environ:
            return None
        try:
            rank, world = int(environ["RANK"]), int(environ["WORLD_SIZE"])
            port = int(environ.get("LLAISYS_MASTER_PORT") or environ.get("MASTER_PORT") or "29500")
            local = int(environ.get("LOCAL_RANK", rank))
        except ValueError as e:
            raise ModelLoadError(f"RANK, WORLD_SIZE, LOCAL_RANK and MASTER_PORT must be integers: {e}") from None
        if world < 2:
            return None
        return cls(rank, world, environ.get("MASTER_ADDR", "127.0.0.1"), port, local)


def read_config(path: str | Path) -> ModelConfig:
    """The ModelConfig of a HuggingFace directory or GGUF file (to check the split before starting anything)."""
    return loader.model_config(path)


EXECUTORS = ("local", "ray")  # who starts ranks 1 .. N-1: processes of this host (the default), or Ray


def load(path: str | Path, device: str | llaisys.Device | None = None, dtype: str | llaisys.DType | None = None, *,
         tensor_parallel: int | None = None, distributed_executor: str | None = None, progress: bool | None = None,
         mmap: bool | None = None, numerics: str | None = None, quantize: str | None = None,
         dequantize: bool = False) -> CausalLM:
    """``llaisys_models.load`` given ``tensor_parallel`` or ``distributed_executor``: both checked; N > 1 ranks
    started (this process rank 0: ``load_parallel``), else this process's model alone (loading/loader.py)."""
    if tensor_parallel is not None and (isinstance(tensor_parallel, bool) or not isinstance(tensor_parallel, int)
                                        or tensor_parallel < 1):
        raise ModelLoadError(f"tensor_parallel must be a number of ranks >= 1, got {tensor_parallel!r}")
    if check_executor(distributed_executor) == "ray" and tensor_parallel in (None, 1):
        raise ModelLoadError("distributed_executor='ray' places tensor-parallel ranks: give tensor_parallel=N (N > 1)")
    if tensor_parallel in (None, 1):
        return loader.load(path, device, dtype, progress=progress, mmap=mmap, numerics=numerics, quantize=quantize,
                           dequantize=dequantize)
    if mmap is False:
        raise ModelLoadError("tensor_parallel needs the checkpoint mapped (each rank reads its part from the "
                             "mapping): leave mmap unset")
    return load_parallel(path, tensor_parallel, device, dtype, progress=progress, numerics=numerics, quantize=quantize,
                         distributed_executor=distributed_executor)


def load_parallel(path: str | Path, world_size: int, device: str | llaisys.Device | None = None,
                  dtype: str | llaisys.DType | None = None, *, progress: bool | None = None,
                  numerics: str | None = None, quantize: str | None = None, launcher: RankLauncher | None = None,
                  distributed_executor: str | None = None) -> CausalLM:
    """Rank 0's model of a group of ``world_size`` ranks (see the module docstring); ``distributed_executor``
    "ray": ranks 1 .. N-1 are Ray actors (ray_ranks.py)."""
    executor = check_executor(distributed_executor)
    external = ExternalRank.from_environment()
    if external is not None and external.world_size != world_size:
        raise ModelLoadError(f"tensor_parallel={world_size}, but the environment says WORLD_SIZE="
                             f"{external.world_size}")
    if external is not None and executor == "ray":
        raise ModelLoadError("distributed_executor='ray' starts the ranks on Ray, but RANK and WORLD_SIZE say that "
                             "this process is a rank started by the user: give one or the other")
    authkey = os.environ.get("LLAISYS_DIST_AUTHKEY", "").encode() or None
    if external is not None and external.rank != 0:
        worker.run(RankSpec(external.rank, world_size, None, external.host, external.port, authkey))
        raise SystemExit(0)
    path = resolve(path)
    Layout.check(read_config(path), world_size)
    quantize = resolve_quantize(quantize)
    first = pick_device(device, quantize)
    if external is not None and first.type != "cpu":
        first = llaisys.Device(first.type, external.local_rank)
    dtype_name = None if dtype is None else llaisys.as_dtype(dtype).name
    threads = None  # ranks this process starts on the CPU: their cores (None: OMP_NUM_THREADS, inherited)
    if first.type == "cpu" and "OMP_NUM_THREADS" not in os.environ:
        threads = max(1, len(os.sched_getaffinity(0)) // world_size)

    ray_ranks = None
    if executor == "ray":  # the placement first: on accelerators it says which device rank 0 has
        ray_ranks = _ray_ranks().place(world_size, first, threads)
        first = ray_ranks.rank_0_device
    options = LoadOptions(str(path), first.type, first.index, dtype_name, numerics, quantize)
    if first.type != "cpu":  # every rank's device must be there (the CPU: all ranks share it; Ray: each checks its own)
        for rank in range(1 if ray_ranks else world_size):
            llaisys.empty((0,), llaisys.float32, options.device(rank))

    ranks: Ranks | None = ray_ranks
    group = None
    try:
        unique_id = llaisys.distributed.unique_id(first)
        if ray_ranks is not None:
            ray_ranks.hand_out(unique_id, options)
        else:
            ranks = _connect(world_size, unique_id, options, external, launcher, authkey, threads)
        group = llaisys.distributed.Group(unique_id, 0, world_size, options.device(0))
        model = options.load(Layout(0, world_size), group, progress)
        assert ranks is not None  # Ray's, or those just connected
        ranks.wait_ready()
    except BaseException:
        if ranks is not None:
            ranks.stop(grace=2.0)
        if group is not None:
            with contextlib.suppress(llaisys.LlaisysError):
                group.destroy()
        raise
    model.followers = Followers(group, ranks)
    weakref.finalize(model, model.followers.close)  # a model dropped without close() still ends its ranks
    return model


def check_executor(name: str | None) -> str:
    if name is None:
        return "local"
    if name not in EXECUTORS:
        raise ModelLoadError(f"distributed_executor must be one of {', '.join(map(repr, EXECUTORS))}, got {name!r}")
    return name


def _ray_ranks() -> type[RayRanks]:
    if "ray" not in sys.modules and not os.environ.get("RAY_ADDRESS"):
        # the cluster ray_ranks.connect() may start is this machine's, for this process alone: no usage reports,
        # and its ports on 127.0.0.1 (read when Ray is imported; else Ray takes the machine's outward address)
        os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
        os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")
    try:
        from .ray_ranks import RayRanks
    except ImportError as e:
        if not (e.name or "").startswith("ray"):
            raise
        raise ModelLoadError(f"distributed_executor='ray' needs Ray ({e.name} is missing): "
                             f"pip install 'llaisys-models[ray]'") from None
    return RayRanks


def _connect(world_size: int, unique_id: bytes, options: LoadOptions, external: ExternalRank | None,
             launcher: RankLauncher | None, authkey: bytes | None, threads: int | None) -> ConnectedRanks:
    """Ranks 1 .. N-1 connected to rank 0's control store (started here by ``launcher``, or by the user), each
    given the unique id and what to load."""
    if external is not None:
        host, port, launcher = external.host, external.port, None
    else:
        host, port, authkey = "127.0.0.1", 0, secrets.token_bytes(32)
        launcher = launcher or LocalProcesses()
    control = store.Store(host, port, authkey)
    try:
        if launcher is not None:
            launcher.start([RankSpec(rank, world_size, unique_id, *control.address, authkey, threads)
                            for rank in range(1, world_size)])

        def ended() -> str | None:
            for rank in range(1, world_size):
                if launcher is not None and (status := launcher.exit_status(rank)) is not None:
                    return f"tensor-parallel rank {rank} {exit_description(status)} before it connected"
            return None

        connections = control.gather(world_size, unique_id, dataclasses.asdict(options), store.STARTUP_TIMEOUT, ended)
    except BaseException:
        if launcher is not None:
            launcher.stop(grace=2.0)
        raise
    finally:
        control.close()
    return ConnectedRanks(connections, launcher)
