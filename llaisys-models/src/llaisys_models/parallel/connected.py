"""Ranks that rank 0's control store connected (store.py), started by a ``RankLauncher`` (processes of this host)
or by the user (RANK / WORLD_SIZE / MASTER_ADDR / MASTER_PORT): ``followers.Ranks`` over their connections.

A rank's control connection carries its "ready", its errors (one line each) and nothing else; its end (EOF) is
the rank's end, seen at once; the launcher, where there is one, says how it ended (its exit status).
"""

from __future__ import annotations

import contextlib
import json
from multiprocessing.connection import Connection, wait

import llaisys

from . import store
from .launcher import RankLauncher, exit_description


class ConnectedRanks:
    def __init__(self, connections: dict[int, Connection], launcher: RankLauncher | None):
        self.connections, self.launcher = connections, launcher  # launcher None: the user started the ranks
        self._rank_of = {conn: rank for rank, conn in connections.items()}
        self._live = list(self._rank_of)

    def wait_ready(self) -> None:
        for rank, conn in sorted(self.connections.items()):
            while True:
                try:
                    message = store.receive(conn, timeout=1.0)
                except TimeoutError:
                    continue
                except (EOFError, OSError, ValueError):
                    raise llaisys.LlaisysError(f"tensor-parallel rank {rank} {self._how_it_ended(rank, 1.0)} while "
                                               f"loading") from None
                if "error" in message:
                    raise llaisys.LlaisysError(f"tensor-parallel rank {rank} could not load: {message['error']}")
                if message.get("ready"):
                    break

    def watching(self) -> bool:
        return bool(self._live)

    def watch(self, timeout: float) -> list[str]:
        try:
            ready = wait(self._live, timeout=timeout)
        except OSError:  # closed under us (the group is closing or has failed)
            self._live.clear()
            return []
        failures = []
        for conn in [c for c in self._live if c in ready]:  # (wait() returns them as its wider type)
            rank = self._rank_of[conn]
            try:
                message = json.loads(conn.recv_bytes())
            except (EOFError, OSError, ValueError):
                self._live.remove(conn)
                failures.append(f"rank {rank} {self._how_it_ended(rank, 1.0)}")
                continue
            if "error" in message:
                failures.append(f"rank {rank}: {message['error']}")
        return failures

    def ended(self, wait: float) -> str | None:
        for rank in sorted(self.connections):
            if self.launcher is not None and (status := self.launcher.exit_status(rank, wait=wait)) is not None:
                return f"rank {rank} {exit_description(status)}"
        return None

    def stop(self, grace: float) -> None:
        if self.launcher is not None:
            self.launcher.stop(grace=grace)
        for conn in self.connections.values():
            with contextlib.suppress(OSError):
                conn.close()

    def _how_it_ended(self, rank: int, wait: float) -> str:
        status = self.launcher.exit_status(rank, wait=wait) if self.launcher is not None else None
        return exit_description(status)
