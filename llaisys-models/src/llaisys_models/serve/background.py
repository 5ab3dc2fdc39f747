"""The server on a background thread of this process, for scripts, notebooks, benchmarks and tests.

    with BackgroundServer(Server(Engine(model, tokenizer), tokenizer2, "my-model")) as s:
        openai.OpenAI(base_url=s.base_url + "/v1", api_key="-").chat.completions.create(...)

It binds a free port on 127.0.0.1 (or the given one) before uvicorn starts, so there is no race
for the port, tells the ``Server`` the address (it checks requests' Host header against it), and
returns from ``__enter__`` once the engine runs and the port accepts requests.
"""

from __future__ import annotations

import socket
import threading
import time

from .app import create_app
from .server import Server


class BackgroundServer:
    def __init__(self, server: Server, host: str = "127.0.0.1", port: int = 0, startup_timeout: float = 60.0):
        import uvicorn

        self.server = server
        self.startup_timeout = startup_timeout
        self._socket = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET)
        self._socket.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._socket.bind((host, port))
        self.port = self._socket.getsockname()[1]
        server.host, server.port = host, self.port
        self.base_url = f"http://{f'[{host}]' if ':' in host else host}:{self.port}"
        self._uvicorn = uvicorn.Server(uvicorn.Config(create_app(server), log_level="warning",
                                                      timeout_graceful_shutdown=5))
        self._thread = threading.Thread(target=self._uvicorn.run, kwargs={"sockets": [self._socket]},
                                        name="llaisys-http", daemon=True)

    def __enter__(self) -> BackgroundServer:
        self._thread.start()
        deadline = time.monotonic() + self.startup_timeout
        while not self._uvicorn.started:
            if not self._thread.is_alive() or time.monotonic() > deadline:
                self.__exit__()
                raise RuntimeError("the HTTP server did not start")
            time.sleep(0.02)
        return self

    def __exit__(self, *exc: object) -> None:
        self._uvicorn.should_exit = True
        if self._thread.is_alive():
            self._thread.join(30)
        self._socket.close()
