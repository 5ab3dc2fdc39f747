"""Starting the ranks 1 .. N-1 of a group: what each needs to know, and who starts them.

``RankLauncher`` is the interface for workers that rank 0's control store hands their part (store.py,
connected.py): ``start(specs)`` starts one worker per ``RankSpec`` (its rank, the world size, the group's unique
id, and where the store listens), ``exit_status`` and ``stop`` watch and end them. Such a worker calls
``worker.run(spec)``. ``LocalProcesses`` starts them as processes of this host (``python -m
llaisys_models.parallel.worker``, the spec on its stdin): the default. Ranks on Ray
(``distributed_executor="ray"``) need no store and no launcher of this kind: Ray itself starts them, carries
their part and tells of their end (ray_ranks.py).
"""

from __future__ import annotations

import base64
import dataclasses
import json
import os
import signal
import subprocess
import sys
import time
from typing import Protocol


@dataclasses.dataclass(frozen=True)
class RankSpec:
    rank: int
    world_size: int
    unique_id: bytes | None  # the group's communicator (llaisys.distributed.unique_id on rank 0); None: the store's
    host: str  # rank 0's control store (store.py): hello, ready, errors, liveness
    port: int
    authkey: bytes | None  # the store's shared secret (None: none, for ranks the user starts)
    threads: int | None = None  # CPU threads of the rank (OMP_NUM_THREADS); None: as its environment says

    def to_json(self) -> str:
        fields = dataclasses.asdict(self)
        for key in ("unique_id", "authkey"):
            fields[key] = None if fields[key] is None else base64.b64encode(fields[key]).decode()
        return json.dumps(fields)

    @classmethod
    def from_json(cls, text: str) -> RankSpec:
        fields = json.loads(text)
        for key in ("unique_id", "authkey"):
            fields[key] = None if fields[key] is None else base64.b64decode(fields[key])
        return cls(**fields)


def exit_description(returncode: int | None) -> str:
    """How a worker ended, from its exit status (None: unknown), after "rank r "."""
    if returncode is None:
        return "closed its connection"
    if returncode < 0:
        try:
            return f"was killed by {signal.Signals(-returncode).name}"
        except ValueError:
            return f"was killed by signal {-returncode}"
    return f"exited with status {returncode}"


class RankLauncher(Protocol):
    def start(self, specs: list[RankSpec]) -> None:
        """Start one worker per spec, each calling ``worker.run(spec)``."""

    def exit_status(self, rank: int, wait: float = 0.0) -> int | None:
        """The worker's exit status once it has ended (waiting up to ``wait`` seconds; negative: killed by
        that signal), None while it runs or where unknown."""

    def stop(self, grace: float = 5.0) -> None:
        """End every worker still running: ask (SIGTERM), then after ``grace`` seconds kill."""


class LocalProcesses:
    """Workers as child processes of this one, on this host."""

    def __init__(self) -> None:
        self.processes: dict[int, subprocess.Popen[bytes]] = {}

    def start(self, specs: list[RankSpec]) -> None:
        for spec in specs:
            env = dict(os.environ)
            if spec.threads is not None:
                env["OMP_NUM_THREADS"] = str(spec.threads)
            process = subprocess.Popen([sys.executable, "-m", "llaisys_models.parallel.worker"],
                                       stdin=subprocess.PIPE, env=env, start_new_session=True)
            assert process.stdin is not None  # (stdin=PIPE)
            process.stdin.write(spec.to_json().encode())
            process.stdin.close()
            self.processes[spec.rank] = process

    def exit_status(self, rank: int, wait: float = 0.0) -> int | None:
        process = self.processes.get(rank)
        if process is None:
            return None
        try:
            return process.wait(timeout=wait) if wait > 0 else process.poll()
        except subprocess.TimeoutExpired:
            return None

    def stop(self, grace: float = 5.0) -> None:
        for process in self.processes.values():
            if process.poll() is None:
                process.terminate()
        deadline = time.monotonic() + grace
        for process in self.processes.values():
            try:
                process.wait(timeout=max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
