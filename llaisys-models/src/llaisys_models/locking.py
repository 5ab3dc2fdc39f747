"""One generation at a time per model: a model owns one KV cache and one set of work buffers.

Threads take turns: a call waits while another thread's call (or its open stream) holds
the model. The thread that holds it cannot wait for itself, so a second call from it (a
``generate`` while its own ``stream_generate`` is still open) raises ``ModelBusyError``
instead of deadlocking or mixing two sequences in one cache.
"""

from __future__ import annotations

import contextlib
import threading

from llaisys import LlaisysError


class ModelBusyError(LlaisysError, RuntimeError):
    """The calling thread already runs this model (an unfinished ``stream_generate``)."""


class ModelLock:
    def __init__(self):
        self._lock = threading.Lock()
        self._owner: int | None = None  # the thread holding the model
        self._holder = ""  # what it is running, for the message

    @contextlib.contextmanager
    def hold(self, what: str):
        me = threading.get_ident()
        if self._owner == me:
            raise ModelBusyError(f"{what}: this thread is already running the model ({self._holder} not finished); "
                                 f"a model runs one sequence at a time: finish or close() the stream first, "
                                 f"or load a second model")
        with self._lock:
            self._owner, self._holder = me, what
            try:
                yield
            finally:
                self._owner, self._holder = None, ""
