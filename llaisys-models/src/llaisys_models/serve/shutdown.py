"""``llaisys serve``'s HTTP server: uvicorn's, ending on SIGINT (Ctrl+C) or SIGTERM in about a second, quietly.

uvicorn alone, on a signal, stops accepting, then waits up to its graceful timeout for open responses to end,
which a stream of thousands of tokens does not, then cancels them (a traceback each, the client a broken
connection), and raises the signal again once done (a KeyboardInterrupt's traceback, exit status -2). Here:

1. the first signal: stop accepting, print ``llaisys serve: shutting down (SIGINT)``, and stop the engine, which
   fails every open request once its step under way ends (``engine.Failed(shutdown=True)``). Each handler wakes
   up and answers: a stream's last events are an error object (``"code": "server_shutdown"``) then
   ``data: [DONE]`` (``/v1/responses``: ``response.failed``), a request not streamed gets a 503 in OpenAI's error
   shape, and one not yet queued a 503 too (``EngineUnavailable``);
2. uvicorn closes each connection once its response has ended, runs the app's shutdown, and ``run`` returns: the
   command exits with status 0;
3. a second signal while that hangs (a forward pass that does not end) exits at once, with status 1, one line
   and no traceback (but one within a second of the first: the terminal's SIGINT passed on by a wrapper).

An inherited SIG_IGN is kept (``nohup llaisys serve &`` ignores SIGINT), as Python itself does.
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import threading
import time
from collections.abc import Iterator
from types import FrameType
from typing import TYPE_CHECKING

import uvicorn

if TYPE_CHECKING:
    from socket import socket

    from .engine import Engine

SIGNALS = (signal.SIGINT, signal.SIGTERM)
ECHO_SECONDS = 1.0  # a second signal sooner than this is the first one again (a wrapper passing on Ctrl+C's SIGINT)


class HTTPServer(uvicorn.Server):
    """A ``uvicorn.Server`` whose shutdown first stops ``engine`` (see the module's docstring)."""

    def __init__(self, config: uvicorn.Config, engine: Engine) -> None:
        super().__init__(config)
        self.engine = engine
        self.signal_name: str | None = None  # the signal that asked for the shutdown
        self.signalled = 0.0  # when (time.monotonic)

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        # uvicorn's own raises the signal again after the shutdown, for its default action: KeyboardInterrupt
        if threading.current_thread() is not threading.main_thread():  # (only the main thread gets signals)
            yield
            return
        previous = {sig: signal.getsignal(sig) for sig in SIGNALS if signal.getsignal(sig) is not signal.SIG_IGN}
        for sig in previous:
            signal.signal(sig, self.handle_exit)
        try:
            yield
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)

    def handle_exit(self, sig: int, _frame: FrameType | None) -> None:
        # a signal handler: flags only (the event loop's main_loop sees should_exit within 0.1 s), but for a second
        # signal, which must end the process whatever the loop is doing
        name = signal.Signals(sig).name
        if self.should_exit:
            if time.monotonic() - self.signalled < ECHO_SECONDS:
                return
            os.write(2, f"llaisys serve: {name} again: exiting without waiting\n".encode())
            os._exit(1)
        self.signal_name, self.signalled = name, time.monotonic()
        self.should_exit = True

    async def shutdown(self, sockets: list[socket] | None = None) -> None:
        for server in getattr(self, "servers", ()):  # no new connections (uvicorn's shutdown closes them too)
            server.close()
        if self.signal_name is not None:
            print(f"llaisys serve: shutting down ({self.signal_name})", file=sys.stderr, flush=True)
        self.engine.stop(timeout=0)  # every open request fails now: its handler ends its response
        await super().shutdown(sockets)
