"""Where a rank runs, and whether ranks on the CPU can reach each other.

The CPU's communicator is shared memory between processes of one host (llaisys-backend-cpu/csrc/comm): its
ranks map one POSIX shared-memory segment (/dev/shm) and watch each other's process ids (/proc). So CPU ranks
must share a kernel, a /dev/shm and a pid namespace; ``host_key`` names exactly that. Two Ray nodes (raylets)
of one machine share it, so ranks may sit one on each; two machines, or two containers with their own /dev/shm,
do not (a network collective library, e.g. gloo or MPI, would be needed there: not built). On GPUs the
collectives are NCCL's, which spans machines: any placement goes.
"""

from __future__ import annotations

import dataclasses
import os
import socket

from llaisys import LlaisysError


def host_key() -> str:
    """What processes that can share the CPU communicator have in common: the kernel's boot id, the /dev/shm
    mount and the pid namespace (Linux; elsewhere the host name)."""
    try:
        with open("/proc/sys/kernel/random/boot_id") as f:
            boot = f.read().strip()
        return f"{boot}/shm:{os.stat('/dev/shm').st_dev}/pid:{os.stat('/proc/self/ns/pid').st_ino}"
    except OSError:
        return socket.gethostname()


@dataclasses.dataclass(frozen=True)
class Place:
    """Where a rank runs: its Ray node (id and address), its host (``host_key``) and its process."""
    node: str
    address: str
    host: str
    pid: int


def check_one_host(places: dict[int, Place]) -> None:
    """A LlaisysError naming the first rank whose host is not rank 0's (CPU ranks: see the module docstring)."""
    home = places[0]
    for rank, place in sorted(places.items()):
        if place.host != home.host:
            raise LlaisysError(
                f"tensor-parallel rank {rank} was placed on Ray node {place.node[:8]} ({place.address}), another "
                f"host than rank 0's ({home.node[:8]}, {home.address}): ranks on the CPU share one host's memory "
                f"(their collectives are shared memory, not a network), so every rank must fit on rank 0's host: "
                f"give that node the cores of all {len(places)} ranks, or run the ranks on GPUs (NCCL spans hosts)")
