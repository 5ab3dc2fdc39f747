"""Rank 0's control store: where the other ranks say hello, get the group's unique id and what to load,
report that they are ready (or why not), and stay connected, so that a rank's end is seen at once.

A TCP listener of the standard library (``multiprocessing.connection``, with its HMAC challenge when there
is an authkey); messages are JSON objects sent with ``send_bytes`` (nothing is ever unpickled). It carries
no per-step data: steps go through the group's own broadcast (messages.py).

    worker -> rank 0   {"rank": r, "world_size": n}
    rank 0 -> worker   {"unique_id": base64, "load": {...}}   (or {"error": "..."})
    worker -> rank 0   {"ready": true}  |  {"error": "one line"}    (an error may also come later)
"""

from __future__ import annotations

import base64
import json
import queue
import threading
import time
from collections.abc import Callable
from multiprocessing.connection import Client, Connection, Listener
from typing import Any

from llaisys import LlaisysError

STARTUP_TIMEOUT = 120.0  # seconds for every rank to say hello (interpreters start slowly on a busy machine)


def send(conn: Connection, message: dict[str, Any]) -> None:
    conn.send_bytes(json.dumps(message).encode())


def receive(conn: Connection, timeout: float | None = None) -> dict[str, Any]:
    """The next message; EOFError when the other side has gone, TimeoutError after ``timeout`` seconds."""
    if timeout is not None and not conn.poll(max(0.0, timeout)):
        raise TimeoutError(f"no answer within {timeout:.0f} s")
    message = json.loads(conn.recv_bytes())
    if not isinstance(message, dict):
        raise ValueError(f"a control message must be a JSON object, got {message!r}")
    return message


class Store:
    """Listens on (host, port) (port 0: any free one; ``address`` says which)."""

    def __init__(self, host: str, port: int, authkey: bytes | None):
        try:
            self._listener = Listener((host, port), authkey=authkey)
        except OSError as e:
            raise LlaisysError(f"the tensor-parallel control store cannot listen on {host}:{port}: {e}") from None
        self.address: tuple[str, int] = self._listener.address
        self._hellos: queue.Queue[Connection] = queue.Queue()
        self._accepting = threading.Thread(target=self._accept, name="llaisys-tp-store", daemon=True)
        self._accepting.start()

    def _accept(self) -> None:
        while True:
            try:
                conn = self._listener.accept()
            except OSError:  # closed: no more ranks expected
                return
            except Exception:  # a client that failed the challenge, or hung up: not one of ours
                continue
            self._hellos.put(conn)

    def gather(self, world_size: int, unique_id: bytes, load: dict[str, Any], timeout: float,
               alive: Callable[[], str | None] | None = None) -> dict[int, Connection]:
        """The control connections of ranks 1 .. world_size-1, each answered with the unique id and ``load``;
        waits at most ``timeout`` seconds, and stops early when ``alive()`` (the launcher's view) says a rank
        has already ended (returns a message)."""
        deadline = time.monotonic() + timeout
        ranks: dict[int, Connection] = {}
        try:
            while len(ranks) < world_size - 1:
                left = deadline - time.monotonic()
                if left <= 0:
                    missing = sorted(set(range(1, world_size)) - set(ranks))
                    raise LlaisysError(f"tensor-parallel rank(s) {missing} did not connect to rank 0 within "
                                       f"{timeout:.0f} s")
                if alive is not None and (why := alive()):
                    raise LlaisysError(why)
                try:
                    conn = self._hellos.get(timeout=min(left, 0.2))
                except queue.Empty:
                    continue
                try:
                    hello = receive(conn, timeout=max(1.0, deadline - time.monotonic()))
                    rank = hello.get("rank")
                    problem = None
                    if hello.get("world_size") != world_size:
                        problem = f"world size {hello.get('world_size')} is not rank 0's {world_size}"
                    elif not isinstance(rank, int) or not 1 <= rank < world_size:
                        problem = f"rank {rank!r} is not in [1, {world_size})"
                    elif rank in ranks:
                        problem = f"rank {rank} connected twice"
                    else:
                        ranks[rank] = conn
                    if problem:
                        send(conn, {"error": problem})
                        conn.close()
                        raise LlaisysError(f"a tensor-parallel rank said hello wrongly: {problem}")
                except (EOFError, OSError, TimeoutError, ValueError):
                    conn.close()
            for conn in ranks.values():  # all at once: the ranks then join the group within moments of each other
                send(conn, {"unique_id": base64.b64encode(unique_id).decode(), "load": load})
        except BaseException:
            for conn in ranks.values():
                conn.close()
            raise
        return ranks

    def close(self) -> None:
        self._listener.close()


def connect(host: str, port: int, authkey: bytes | None, timeout: float) -> Connection:
    """A connection to rank 0's store, retried until it listens (ranks the user starts may come first)."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            return Client((host, port), authkey=authkey)
        except (ConnectionRefusedError, FileNotFoundError):
            if time.monotonic() > deadline:
                raise LlaisysError(f"no tensor-parallel rank 0 listens on {host}:{port} (waited {timeout:.0f} s)") \
                    from None
            time.sleep(0.1)
