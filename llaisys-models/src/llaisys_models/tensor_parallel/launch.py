"""``llaisys_models.load(path, tensor_parallel=N)``: N ranks, one device each, this process rank 0.

Rank 0 makes the group's unique id, listens with its control store, starts ranks 1 .. N-1 (a RankLauncher:
processes of this host by default), hands each the id and what to load, joins the group, loads its own part
and waits until every rank is ready; it returns its model, which drives the others (followers.py).

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
import weakref

import llaisys

from ..errors import ModelLoadError
from . import store, worker
from .followers import Followers, exit_description
from .launcher import LocalProcesses, RankLauncher, RankSpec
from .layout import Layout
from .options import LoadOptions


@dataclasses.dataclass(frozen=True)
class ExternalRank:
    """A rank the user started, as the environment describes it."""
    rank: int
    world_size: int
    host: str
    port: int
    local_rank: int

    @classmethod
    def from_environment(cls, environ=os.environ) -> ExternalRank | None:
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


def read_config(path):
    """The ModelConfig of a HuggingFace directory or GGUF file (to check the split before starting anything)."""
    from ..config import ModelConfig
    from ..files import is_gguf, model_directory
    from ..registry import MODEL_CLASSES

    if is_gguf(path):
        from ..gguf.config import model_config
        from ..gguf.reader import GGUFFile

        return model_config(GGUFFile(path))
    return ModelConfig.from_file(model_directory(path), supported=MODEL_CLASSES)


def load_parallel(path, world_size: int, device=None, dtype=None, *, progress: bool | None = None,
                  numerics: str | None = None, quantize: str | None = None, launcher: RankLauncher | None = None):
    """Rank 0's model of a group of ``world_size`` ranks (see the module docstring)."""
    from ..hub import resolve
    from ..loading import pick_device
    from ..quantize import resolve as resolve_quantize

    external = ExternalRank.from_environment()
    if external is not None and external.world_size != world_size:
        raise ModelLoadError(f"tensor_parallel={world_size}, but the environment says WORLD_SIZE="
                             f"{external.world_size}")
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
    options = LoadOptions(str(path), first.type, first.index, dtype_name, numerics, quantize)
    if first.type != "cpu":  # every rank's device must be there (the CPU: all ranks share it)
        for rank in range(world_size):
            llaisys.empty((0,), llaisys.float32, options.device(rank))

    unique_id = llaisys.distributed.unique_id(first)
    if external is not None:
        host, port, launcher = external.host, external.port, None
    else:
        host, port, authkey = "127.0.0.1", 0, secrets.token_bytes(32)
        launcher = launcher or LocalProcesses()
    control = store.Store(host, port, authkey)
    connections: dict = {}
    group = None
    try:
        if launcher is not None:
            threads = None
            if first.type == "cpu" and "OMP_NUM_THREADS" not in os.environ:
                threads = max(1, len(os.sched_getaffinity(0)) // world_size)
            launcher.start([RankSpec(rank, world_size, unique_id, *control.address, authkey, threads)
                            for rank in range(1, world_size)])

        def ended() -> str | None:
            for rank in range(1, world_size):
                if launcher is not None and (status := launcher.exit_status(rank)) is not None:
                    return f"tensor-parallel rank {rank} {exit_description(status)} before it connected"
            return None

        connections = control.gather(world_size, unique_id, dataclasses.asdict(options), store.STARTUP_TIMEOUT, ended)
        group = llaisys.distributed.Group(unique_id, 0, world_size, options.device(0))
        model = options.load(Layout(0, world_size), group, progress)
        _wait_ready(connections, launcher)
    except BaseException:
        for conn in connections.values():
            conn.close()
        if launcher is not None:
            launcher.stop(grace=2.0)
        if group is not None:
            with contextlib.suppress(llaisys.LlaisysError):
                group.destroy()
        raise
    finally:
        control.close()
    model.followers = Followers(group, connections, launcher)
    weakref.finalize(model, model.followers.close)  # a model dropped without close() still ends its ranks
    return model


def _wait_ready(connections: dict, launcher) -> None:
    """Every rank's "ready" (loading may take minutes: there is no deadline, but a rank's error or end is
    seen at once)."""
    for rank, conn in sorted(connections.items()):
        while True:
            try:
                message = store.receive(conn, timeout=1.0)
            except TimeoutError:
                continue
            except (EOFError, OSError, ValueError):
                status = launcher.exit_status(rank, wait=1.0) if launcher is not None else None
                raise llaisys.LlaisysError(f"tensor-parallel rank {rank} {exit_description(status)} while loading") \
                    from None
            if "error" in message:
                raise llaisys.LlaisysError(f"tensor-parallel rank {rank} could not load: {message['error']}")
            if message.get("ready"):
                break
