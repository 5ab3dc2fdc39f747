"""Collectives between processes, one device each: sums, gathers and broadcasts of llaisys tensors.

    uid = llaisys.distributed.unique_id("cpu")         # on one rank; hand the bytes to the others
    group = llaisys.distributed.init(uid, rank, world_size, device="cpu")
    llaisys.distributed.all_reduce(t)                  # in place: the sum over the ranks
    llaisys.distributed.all_gather(out, t)             # out [world_size, *t.shape]: every rank's t
    llaisys.distributed.broadcast(t, root=0)           # rank root's t on every rank
    llaisys.distributed.destroy()

Each function takes ``group`` (a ``Group``; default: the one ``init`` made). A group is a communicator of the
device's backend (backend.h "collectives": shared memory between processes of one host on the CPU, NCCL on
CUDA); a backend without collectives raises NotSupportedError. ``local_group(device)`` is a group of this
process alone, whose collectives do nothing (all_gather copies): a model holds one when it is not split.

Collectives are queued on the current stream like ops, so a graph captures them (every rank must then
replay the same graphs). A collective whose peers do not arrive within the group's ``timeout`` (default 20 s,
``$LLAISYS_DIST_TIMEOUT``) fails with a LlaisysError naming this rank, the collective and the late rank; a
rank waiting in ``broadcast`` for its root waits until the root comes or the group is aborted (``abort``,
from any thread: every rank's pending collectives then fail with the reason).
"""

from __future__ import annotations

import os

from . import abi
from .device import Device, as_device
from .errors import LlaisysError, LlaisysValueError
from .plugins import registry
from .stream import current_stream_handle
from .tensor import Tensor

__all__ = ["DEFAULT_TIMEOUT", "Group", "all_gather", "all_reduce", "barrier", "broadcast", "destroy", "init",
           "is_initialized", "local_group", "unique_id"]

DEFAULT_TIMEOUT = 20.0  # seconds; below the 30 s in which a dead or stuck rank must end a tensor-parallel group
TIMEOUT_ENV = "LLAISYS_DIST_TIMEOUT"
_REDUCIBLE = ("float32", "float16", "bfloat16")


def default_timeout() -> float:
    text = os.environ.get(TIMEOUT_ENV, "").strip()
    if not text:
        return DEFAULT_TIMEOUT
    try:
        value = float(text)
    except ValueError:
        value = 0.0
    if not value > 0:
        raise LlaisysValueError(f"{TIMEOUT_ENV} must be a positive number of seconds, got {text!r}")
    return value


def unique_id(device="cpu") -> bytes:
    """A new id (abi.UNIQUE_ID_BYTES bytes) for a group on devices of ``device``'s backend: make it on one rank
    and give every rank the same bytes."""
    device = as_device(device)
    return registry().backend(device).comm_unique_id(device.index)


class Group:
    """This process's member of a communicator: rank ``rank`` of ``world_size``, on ``device``.

    Construction waits (at most ``timeout`` seconds) until every rank has joined with the same ``unique_id``."""

    def __init__(self, unique_id: bytes, rank: int, world_size: int, device="cpu", timeout: float | None = None):
        self.device: Device = as_device(device)
        for name, value in (("rank", rank), ("world_size", world_size)):
            if isinstance(value, bool) or not isinstance(value, int):
                raise LlaisysValueError(f"{name} must be an int, got {value!r}")
        if not 0 <= rank < world_size:
            raise LlaisysValueError(f"rank {rank} is not in [0, world_size = {world_size})")
        if not isinstance(unique_id, (bytes, bytearray)) or len(unique_id) != abi.UNIQUE_ID_BYTES:
            raise LlaisysValueError(f"unique_id must be the {abi.UNIQUE_ID_BYTES} bytes of "
                                    f"llaisys.distributed.unique_id(), got {type(unique_id).__name__}")
        self.rank, self.world_size = rank, world_size
        self.timeout = default_timeout() if timeout is None else float(timeout)
        if not self.timeout > 0:
            raise LlaisysValueError(f"timeout must be > 0 seconds, got {timeout!r}")
        self._backend = registry().backend(self.device)
        self._comm = 0
        self._comm = self._call("init", self._backend.comm_create, self.device.index, bytes(unique_id), rank,
                                world_size, max(1, int(self.timeout * 1000)))

    def __repr__(self) -> str:
        return f"llaisys.distributed.Group(rank={self.rank}, world_size={self.world_size}, device={self.device})"

    def _call(self, what: str, fn, *args):
        try:
            return fn(*args)
        except LlaisysError as e:
            raise type(e)(f"rank {self.rank} of {self.world_size}: {what}: {e}") from None

    def _handle(self, what: str) -> int:
        if not self._comm:
            raise LlaisysError(f"rank {self.rank} of {self.world_size}: {what} on a destroyed group")
        return self._comm

    def _check(self, name: str, t, *, reducible: bool = False) -> None:
        if not isinstance(t, Tensor):
            raise LlaisysValueError(f"{name} must be a llaisys.Tensor, got {type(t).__name__}")
        if t.device != self.device:
            raise LlaisysValueError(f"{name} is on {t.device}, but the group's rank {self.rank} is on {self.device}")
        if not t.is_contiguous():
            raise LlaisysValueError(f"{name} must be contiguous")
        if reducible and t.dtype.name not in _REDUCIBLE:
            raise LlaisysValueError(f"{name} has dtype {t.dtype.name}; all_reduce sums float32, float16 or bfloat16")

    def all_reduce(self, t: Tensor) -> None:
        """t = the sum of every rank's t (ranks 0, 1, ... in order), in place."""
        self._check("t", t, reducible=True)
        comm = self._handle("all_reduce")
        stream = current_stream_handle(self.device)
        self._call("all_reduce", self._backend.comm_all_reduce, self.device.index, stream, comm, t.dtype.code,
                   t.numel(), t.data_ptr(), t.data_ptr())

    def all_gather(self, out: Tensor, t: Tensor) -> None:
        """out [world_size, *t.shape] = every rank's t, rank r's at out[r]."""
        self._check("out", out)
        self._check("t", t)
        if out.dtype != t.dtype or out.shape != (self.world_size, *t.shape):
            raise LlaisysValueError(f"out must be {t.dtype.name} {(self.world_size, *t.shape)} (world_size, *t.shape), "
                                    f"got {out.dtype.name} {out.shape}")
        if t.nbytes and out.data_ptr() < t.data_ptr() + t.nbytes and t.data_ptr() < out.data_ptr() + out.nbytes:
            raise LlaisysValueError("out and t overlap")
        comm = self._handle("all_gather")
        stream = current_stream_handle(self.device)
        self._call("all_gather", self._backend.comm_all_gather, self.device.index, stream, comm, t.nbytes,
                   out.data_ptr(), t.data_ptr())

    def broadcast(self, t: Tensor, root: int = 0) -> None:
        """t = rank ``root``'s t, on every rank (any dtype)."""
        self._check("t", t)
        if isinstance(root, bool) or not isinstance(root, int) or not 0 <= root < self.world_size:
            raise LlaisysValueError(f"root must be a rank in [0, {self.world_size}), got {root!r}")
        comm = self._handle("broadcast")
        stream = current_stream_handle(self.device)
        self._call("broadcast", self._backend.comm_broadcast, self.device.index, stream, comm, t.nbytes,
                   t.data_ptr(), root)

    def barrier(self) -> None:
        """Returns when every rank has called it (an all-reduce of one value)."""
        from .tensor import zeros

        self.all_reduce(zeros((1,), "float32", self.device))

    def abort(self, reason: str = "aborted") -> None:
        """Make every pending and later collective of the group fail, on every rank, naming ``reason`` (any
        thread may call it, also while another waits in a collective); ``destroy`` must still follow."""
        if self._comm:
            self._call("abort", self._backend.comm_abort, self._comm, f"{reason}")

    def destroy(self) -> None:
        """Leave the group and free its resources (no collective of it may still run on this rank)."""
        comm, self._comm = self._comm, 0
        if comm:
            self._call("destroy", self._backend.comm_destroy, comm)

    def __del__(self):
        try:
            self.destroy()
        except Exception:
            pass


class LocalGroup(Group):
    """A group of this process alone (``local_group``): rank 0 of 1, no communicator; all_reduce and broadcast
    leave the tensor as it is, all_gather copies it."""

    def __init__(self, device="cpu"):  # (no communicator to join)
        self.device = as_device(device)
        self.rank, self.world_size, self.timeout, self._comm = 0, 1, 0.0, 0

    def __repr__(self) -> str:
        return f"llaisys.distributed.local_group({str(self.device)!r})"

    def all_reduce(self, t: Tensor) -> None:
        pass

    def broadcast(self, t: Tensor, root: int = 0) -> None:
        pass

    def all_gather(self, out: Tensor, t: Tensor) -> None:
        from . import ops

        ops.rearrange(out.view(*t.shape), t)

    def barrier(self) -> None:
        pass

    def abort(self, reason: str = "aborted") -> None:
        pass

    def destroy(self) -> None:
        pass


def local_group(device="cpu") -> Group:
    """The group of this process alone on ``device`` (world size 1): its collectives cost nothing."""
    return LocalGroup(device)


_default: Group | None = None


def init(unique_id: bytes, rank: int, world_size: int, device="cpu", timeout: float | None = None) -> Group:
    """Join the group ``unique_id`` as ``rank`` of ``world_size`` and make it the default group."""
    global _default
    if _default is not None:
        raise LlaisysError("llaisys.distributed is already initialized in this process (call destroy() first)")
    _default = Group(unique_id, rank, world_size, device, timeout)
    return _default


def is_initialized() -> bool:
    return _default is not None


def _group(group: Group | None) -> Group:
    if group is not None:
        return group
    if _default is None:
        raise LlaisysError("no default group: call llaisys.distributed.init(unique_id, rank, world_size) first")
    return _default


def all_reduce(t: Tensor, group: Group | None = None) -> None:
    """t = the sum over the ranks of ``group`` (default: init's) of their t, in place."""
    _group(group).all_reduce(t)


def all_gather(out: Tensor, t: Tensor, group: Group | None = None) -> None:
    """out [world_size, *t.shape] = every rank's t."""
    _group(group).all_gather(out, t)


def broadcast(t: Tensor, root: int = 0, group: Group | None = None) -> None:
    """t = rank ``root``'s t on every rank."""
    _group(group).broadcast(t, root)


def barrier(group: Group | None = None) -> None:
    _group(group).barrier()


def destroy(group: Group | None = None) -> None:
    """Leave ``group`` (default: init's, which is then forgotten)."""
    global _default
    target = _group(group)
    target.destroy()
    if target is _default:
        _default = None
