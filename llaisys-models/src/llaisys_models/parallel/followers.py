"""Rank 0's side of a tensor-parallel group: the other ranks follow what its model does.

Rank 0 runs the engine (the scheduler, sampling, the KV blocks' bookkeeping). Before each forward it
sends the others the step's inputs and every change to its KV pools since the last step (messages.py);
each then runs the same forward on its own part of the weights, the collectives meeting inside it.

The other ranks are a ``Ranks``: processes that rank 0's control store connected (connected.py), or Ray
actors (ray_ranks.py). Failures end the whole group, once, with one line naming the rank:
  * a rank that exits (crash, kill) is seen at once by the supervisor thread (its control connection closes,
    or Ray says its actor died): it aborts the group (the collectives every rank waits in fail at once) and
    ends the others;
  * a rank that hangs leaves its peers waiting in a collective, which fails after the group's timeout
    naming the late rank (the CPU's shared memory); where the collectives cannot tell (NCCL: the GPU waits,
    the host only sees a step that does not end), the supervisor ends a step still running after
    STEP_TIMEOUTS group timeouts;
  * a step that fails on rank 0 (its forward may have stopped between two collectives) ends the group too.
After that every call of the model raises RankFailedError with the first failure's line; ``on_failure``
callbacks run once (the server uses one to shut down).
"""

from __future__ import annotations

import atexit
import contextlib
import itertools
import threading
import time
import weakref
from collections import deque
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Protocol

import numpy as np

import llaisys

from ..engine.kv_cache import KV_CACHE_DTYPES, KVPool
from ..engine.step_inputs import HostStep
from ..errors import ModelLoadError, RankFailedError
from .messages import Channel, Op, command, exchange_errors, lora_load_command, step_command

if TYPE_CHECKING:
    from ..lora.adapter import LoRAAdapter
    from ..lora.slots import LoRASlots

STEP_TIMEOUTS = 3  # an accelerator step running this many group timeouts is taken as a hung rank
Forward = Callable[[KVPool, HostStep], llaisys.Tensor]  # rank 0's model's step (CausalLM._forward)


class Ranks(Protocol):
    """Rank 0's hold on ranks 1 .. N-1 once each has been told what to load."""

    def wait_ready(self) -> None:
        """Return once every rank has loaded its part (no deadline: a rank's error or end raises at once)."""

    def watching(self) -> bool:
        """Whether a rank is left to watch."""

    def watch(self, timeout: float) -> list[str]:
        """The failures seen within ``timeout`` seconds, one line each naming its rank ("rank 1 was killed by
        SIGKILL", "rank 1: LlaisysError: ...")."""

    def ended(self, wait: float) -> str | None:
        """A rank that has ended ("rank 1 ..."), looking for up to ``wait`` seconds; None if none has."""

    def stop(self, grace: float) -> None:
        """End the ranks still running, after ``grace`` seconds to leave by themselves."""


class Followers:
    """The ranks 1 .. world-1 of ``group`` as rank 0 drives them (``ranks``: their liveness, errors, end)."""

    def __init__(self, group: llaisys.distributed.Group, ranks: Ranks):
        self.group, self.ranks = group, ranks
        self.channel = Channel(group)
        self.failure: str | None = None
        self.on_failure: list[Callable[[str], object]] = []  # callbacks(message), run once when the group fails
        self._pending: deque[np.ndarray] = deque()  # commands for the next message (appends are thread-safe)
        self._pool_ids = itertools.count(1)
        self._lock = threading.Lock()
        self._sending = threading.Lock()  # one message and its step at a time (a step, or close's STOP)
        self._closing = False
        self._step_started: float | None = None  # monotonic time of the running step's start
        self._watch_steps = not group.device.type == "cpu"
        self._lora: LoRASlots | None = None  # rank 0's LoRA slots, once enabled
        self._told: list[int | None] = []  # the adapter (uid) the others were told each slot holds
        self._supervisor = threading.Thread(target=self._supervise, name="llaisys-tp-supervisor", daemon=True)
        self._supervisor.start()
        atexit.register(self.close)

    # -- what rank 0's model tells the others -------------------------------------------------------

    def new_pool(self, pool: KVPool) -> None:
        pool.followers, pool.follower_id = self, next(self._pool_ids)
        self._pending.append(command(Op.NEW_POOL, pool.follower_id, pool.num_blocks, pool.block_size,
                                     KV_CACHE_DTYPES.index(pool.shape.cache_dtype)))
        weakref.finalize(pool, self._pending.append, command(Op.DROP, pool.follower_id))

    def grow(self, pool: KVPool, num_blocks: int) -> None:
        self._pending.append(command(Op.GROW, pool.follower_id, num_blocks))

    def copy_block(self, pool: KVPool, dst: int, src: int) -> None:
        self._pending.append(command(Op.COPY, pool.follower_id, dst, src))

    def clear_graphs(self) -> None:
        self._pending.append(command(Op.CLEAR))

    def enable_lora(self, slots: LoRASlots) -> None:
        """Rank 0's model made its LoRA slots: the others make theirs; ``slots`` is then watched for placements."""
        self._lora, self._told = slots, [None] * slots.max_loras
        self._pending.append(command(Op.LORA_ENABLE, slots.max_loras, slots.max_rank))

    def load_lora(self, adapter: LoRAAdapter) -> None:
        """Every other rank reads the adapter rank 0 has read (``adapter``: rank 0's part), and keeps its part if
        every rank could; else a ModelLoadError names the first rank that could not and its error (the group goes
        on, no rank keeping the adapter). The caller holds the model's step lock."""
        with self._sending, self._failing("adapter load"):
            self.channel.send(self._message(lora_load_command(adapter.uid, adapter.name, str(adapter.path))))
            errors = exchange_errors(self.group, None)
        for rank, error in enumerate(errors):
            if error is not None:
                raise ModelLoadError(f"adapter {adapter.name!r}: rank {rank} of the tensor-parallel group could not "
                                     f"read {adapter.path}: {error}")

    def forget_lora(self, adapter: LoRAAdapter) -> None:
        self._pending.append(command(Op.LORA_FORGET, adapter.uid))

    def merge_lora(self, adapter: LoRAAdapter) -> None:
        self._pending.append(command(Op.LORA_MERGE, adapter.uid))

    def run_step(self, pool: KVPool, host: HostStep, forward: Forward) -> llaisys.Tensor:
        """``forward(pool, host)`` on rank 0, the others sent the same step first; any failure ends the group."""
        with self._sending, self._failing("step"):
            self.channel.send(self._message(step_command(pool.follower_id, host)))
            logits = forward(pool, host)
            if self._watch_steps:
                llaisys.synchronize(self.group.device)  # (the step is over when the device is done with it)
            return logits

    def _message(self, last: np.ndarray) -> np.ndarray:
        """The commands pending, the LoRA slots' new adapters (placed by rank 0 for the step: LoRASlots.place),
        then ``last``."""
        words = [self._pending.popleft() for _ in range(len(self._pending))]
        if self._lora is not None:
            for slot, held in enumerate(self._lora.slots):
                uid = None if held.adapter is None else held.adapter.uid
                if uid is not None and uid != self._told[slot]:
                    words.append(command(Op.LORA_PLACE, slot, uid))
                    self._told[slot] = uid
        return np.concatenate([*words, last])

    @contextlib.contextmanager
    def _failing(self, what: str) -> Iterator[None]:
        """Around what every rank must take part in (a step, an adapter's load): any failure ends the group (a
        LlaisysError is raised as RankFailedError with the group's one line); a step not ending is watched."""
        self.check()
        self._step_started = time.monotonic()
        try:
            yield
        except BaseException as e:
            # a rank that has ended is the cause (rank 0's collective may see it before the supervisor does)
            self.fail(self.failure or self._ended_rank() or
                      f"rank 0's {what} failed: {type(e).__name__}: {e}".splitlines()[0])
            if isinstance(e, llaisys.LlaisysError):
                raise RankFailedError(self.failure) from None
            raise
        finally:
            self._step_started = None

    def check(self) -> None:
        if self.failure is not None:
            raise RankFailedError(self.failure)
        if self._closing:
            raise RankFailedError(f"the tensor-parallel group of {self.group.world_size} ranks was closed "
                                  f"(model.close())")

    # -- failures and the end -------------------------------------------------------------------------

    def fail(self, message: str) -> None:
        """End the group with ``message`` (the first failure wins): abort it, stop the other ranks."""
        with self._lock:
            if self.failure is not None or self._closing:
                return
            self.failure = f"tensor-parallel group of {self.group.world_size} ranks closed: {message}"
        with contextlib.suppress(llaisys.LlaisysError):
            self.group.abort(message)
        self._stop_ranks(grace=0.0)  # a rank that hangs may not answer SIGTERM (stopped, stuck in a call)
        for callback in self.on_failure:
            with contextlib.suppress(Exception):
                callback(self.failure)

    def close(self) -> None:
        """Tell the other ranks to leave, wait for them (a few seconds at most), and leave the group."""
        with self._lock:
            if self._closing:
                return
            self._closing = True
        atexit.unregister(self.close)
        # after the step running now, if any (a step that does not end within the timeout: the ranks are killed)
        if self.failure is None and self._sending.acquire(timeout=STEP_TIMEOUTS * self.group.timeout):
            try:
                with contextlib.suppress(llaisys.LlaisysError):
                    self.channel.send(command(Op.STOP))
            finally:
                self._sending.release()
        self._stop_ranks(grace=5.0)
        with contextlib.suppress(llaisys.LlaisysError):
            self.group.destroy()

    def _ended_rank(self) -> str | None:
        # (a moment's wait: the supervisor thread may be reaping the same process, and a poll meanwhile says
        # nothing)
        return self.ranks.ended(wait=0.5)

    def _stop_ranks(self, grace: float) -> None:
        self.ranks.stop(grace=grace)

    def _supervise(self) -> None:
        """Watch the other ranks: an error they report or their end fails the group."""
        while self.ranks.watching() and not self._closing and self.failure is None:
            failures = self.ranks.watch(timeout=1.0)
            started, limit = self._step_started, STEP_TIMEOUTS * self.group.timeout
            if self._watch_steps and started is not None and time.monotonic() - started > limit:
                self.fail(f"a step has not ended within {limit:.0f} s: a rank is hung (or its device is)")
            for message in failures:
                self.fail(message)  # (nothing while closing: the ranks are leaving)
