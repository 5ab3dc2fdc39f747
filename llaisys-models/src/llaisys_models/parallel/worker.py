"""A rank other than 0: load this rank's part of the model, then run the steps rank 0 sends, until it says stop.

    python -m llaisys_models.parallel.worker     (a RankSpec as JSON on stdin: launcher.LocalProcesses)

``run(spec)`` is the whole life of a worker that rank 0's control store hands its part (a process of this
host, a process the user started with RANK / WORLD_SIZE / MASTER_ADDR / MASTER_PORT): say hello to the store,
join the group and load (``join``), say ready, follow (``follow_to_the_end``). A worker reports its own failure
to rank 0 over the store's connection and aborts the group (so that no rank waits for it); it leaves when rank 0
says stop, or aborts the group and leaves when rank 0's connection ends (rank 0 has gone). A Ray actor
(ray_ranks.py) calls ``join`` and ``follow_to_the_end`` itself: Ray carries what the store would.
"""

from __future__ import annotations

import base64
import contextlib
import sys
import threading
from multiprocessing.connection import Connection
from pathlib import Path

import llaisys

from ..engine.kv_cache import KV_CACHE_DTYPES, KVPool
from ..families.causal_lm import CausalLM
from ..lora.adapter import LoRAAdapter
from . import store
from .launcher import RankSpec
from .layout import Layout
from .messages import Channel, Op, decode, exchange_errors
from .options import LoadOptions


class Reported(Exception):
    """A failure this worker has told rank 0 about (rank 0 names it in the group's one-line error)."""


def run(spec: RankSpec) -> None:
    conn = store.connect(spec.host, spec.port, spec.authkey, store.STARTUP_TIMEOUT)
    try:
        store.send(conn, {"rank": spec.rank, "world_size": spec.world_size})
        reply = store.receive(conn, store.STARTUP_TIMEOUT)
        if "error" in reply:
            raise llaisys.LlaisysError(f"rank 0 refused rank {spec.rank}: {reply['error']}")
        unique_id = base64.b64decode(reply["unique_id"])
        if spec.unique_id is not None and unique_id != spec.unique_id:
            raise llaisys.LlaisysError(f"rank 0's store gave rank {spec.rank} another group's unique id")
        try:
            model, group = join(spec.rank, spec.world_size, unique_id, LoadOptions(**reply["load"]))
        except Exception as e:
            _report(conn, e)
            raise Reported() from e
        store.send(conn, {"ready": True})
        threading.Thread(target=_watch_rank_0, args=(conn, group), name="llaisys-tp-watch", daemon=True).start()
        try:
            follow_to_the_end(model, group)
        except Exception as e:  # (an abort by another rank included: rank 0 knows, or has gone)
            _report(conn, e)
            raise Reported() from e
    finally:
        conn.close()


def join(rank: int, world_size: int, unique_id: bytes, options: LoadOptions,
         device: str | None = None) -> tuple[CausalLM, llaisys.distributed.Group]:
    """(this rank's model, its group): the group joined (every rank within the group's timeout), then this
    rank's part loaded on ``device`` (default: ``options.device(rank)``)."""
    device = device or options.device(rank)
    group = llaisys.distributed.Group(unique_id, rank, world_size, device)
    try:
        return options.load(Layout(rank, world_size), group, device=device), group
    except BaseException:
        with contextlib.suppress(llaisys.LlaisysError):
            group.abort(f"rank {rank} could not load its part")
            group.destroy()
        raise


def follow_to_the_end(model: CausalLM, group: llaisys.distributed.Group) -> None:
    """``follow`` until rank 0 says stop; a failure aborts the group first (so that no rank waits for this one)
    and is raised. The group is left either way."""
    try:
        follow(model, group)
    except Exception as e:
        with contextlib.suppress(llaisys.LlaisysError):
            group.abort(f"rank {group.rank} failed: {e}".splitlines()[0])
        raise
    finally:
        group.destroy()


def _report(conn: Connection, error: Exception) -> None:
    with contextlib.suppress(OSError):
        store.send(conn, {"error": f"{type(error).__name__}: {error}".splitlines()[0]})


def _watch_rank_0(conn: Connection, group: llaisys.distributed.Group) -> None:
    """Rank 0's end (its connection closes) aborts the group: this rank's wait for its next step fails."""
    try:
        while True:
            store.receive(conn)
    except (EOFError, OSError, ValueError):
        with contextlib.suppress(llaisys.LlaisysError):
            group.abort("rank 0 has gone")


def follow(model: CausalLM, group: llaisys.distributed.Group) -> None:
    """Apply rank 0's messages (messages.py) to ``model`` until STOP."""
    channel = Channel(group)
    pools: dict[int, KVPool] = {}  # rank 0's pool ids -> this rank's pools
    adapters: dict[int, LoRAAdapter] = {}  # rank 0's LoRA adapters (their uids) -> this rank's parts of them
    while True:
        for op, args in decode(channel.receive()):
            if op == Op.STOP:
                return
            if op == Op.STEP:
                pool, host = args
                with model._step_lock:
                    model._forward(pools[pool], host)
            elif op == Op.NEW_POOL:
                pool, num_blocks, block_size, cache = args
                pools[pool] = model.new_kv_pool(num_blocks, block_size=block_size, prefix_caching=False,
                                                cache_dtype=KV_CACHE_DTYPES[cache])
            elif op == Op.GROW:
                pools[args[0]].grow(args[1])
            elif op == Op.COPY:
                pools[args[0]].copy_block(args[1], args[2])
            elif op == Op.DROP:
                if (pool := pools.pop(args[0], None)) is not None:
                    model.release_kv_pool(pool)
            elif op == Op.CLEAR:
                model.clear_decode_graphs()
            elif op == Op.LORA_ENABLE:
                model.enable_lora(*args)
            elif op == Op.LORA_LOAD:
                if (adapter := _load_lora(model, group, *args)) is not None:
                    adapters[adapter.uid] = adapter
            elif op == Op.LORA_PLACE:
                assert model.lora is not None  # (enabled before any adapter is loaded)
                model.lora.put(args[0], adapters[args[1]])  # where rank 0's LoRASlots.place put it
            elif op == Op.LORA_FORGET:
                if (adapter := adapters.pop(args[0], None)) is not None:
                    model.unload_lora(adapter.name)
            elif op == Op.LORA_MERGE:
                model.merge_lora(adapters.pop(args[0]).name)  # (and unloads it)


def _load_lora(model: CausalLM, group: llaisys.distributed.Group, uid: int, name: str,
               path: str) -> LoRAAdapter | None:
    """This rank's part of the adapter rank 0 loads, kept if every rank could read it (each says through one
    all-gather: a rank's failure fails rank 0's load_lora, naming the rank, and the group goes on)."""
    adapter, error = None, None
    try:
        adapter = model._read_lora(name, Path(path), uid)
    except Exception as e:
        error = f"{type(e).__name__}: {e}".splitlines()[0]
    errors = exchange_errors(group, error)  # (every rank takes part, whatever its own read did)
    if adapter is None or any(e is not None for e in errors):
        return None
    with model._step_lock:
        model._add_lora(adapter)
    return adapter


def main() -> int:
    spec = RankSpec.from_json(sys.stdin.read())
    try:
        run(spec)
    except Reported:  # rank 0 names this rank in its one line (or has gone)
        return 1
    except Exception as e:  # rank 0 could not be told
        print(f"llaisys tensor-parallel rank {spec.rank}: {type(e).__name__}: {e}".splitlines()[0], file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
