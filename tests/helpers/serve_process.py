"""``llaisys serve`` (the installed command) as a child process, for tests that read what it prints or signal it.

    with ServeProcess(tmp_path, "--model", str(chat_model_dir)) as server:
        http_request(server.base_url, "GET", "/health")
        server.signal(signal.SIGINT)
        assert server.wait_exit() == 0

It binds a free port (``--port 0``, read back from its banner); everything it prints goes to a file (``log()``).
Started through ``child_process.popen``, so it gets SIGINT even under a test runner started in the background.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from helpers.child_process import popen
from helpers.serve_helpers import http_request, wait_until

START_TIMEOUT = 120  # seconds for the model to load and /health to answer, on a loaded machine


def llaisys_command() -> str:
    exe = Path(sys.executable).parent / "llaisys"  # this environment's command, else the one on PATH
    found = str(exe) if exe.exists() else shutil.which("llaisys")
    if found is None:
        pytest.skip("the llaisys command is not installed (pip install ./llaisys-core ./llaisys-models)")
    return found


class ServeProcess:
    """``llaisys serve --port 0 ARGS...``, its output in ``directory/serve.log``; ended (SIGTERM, then SIGKILL)
    on leaving the ``with`` block if it still runs."""

    def __init__(self, directory: Path, *args: str, env: dict | None = None):
        self.log_path = Path(directory) / "serve.log"
        self._log = open(self.log_path, "w")
        self.proc = popen([llaisys_command(), "serve", "--port", "0", *args], stdout=self._log,
                          stderr=subprocess.STDOUT, env={**os.environ, **(env or {})})
        self.base_url = None

    def __enter__(self) -> ServeProcess:
        try:
            self._wait_healthy()
        except BaseException:
            self.__exit__()
            raise
        return self

    def _wait_healthy(self) -> None:
        deadline = time.monotonic() + START_TIMEOUT
        while True:
            if self.proc.poll() is not None:
                pytest.fail(f"llaisys serve exited with {self.proc.returncode}:\n{self.log()}")
            if self.base_url is None:
                announced = re.search(r" at (http://127\.0\.0\.1:\d+)/", self.log())
                self.base_url = announced and announced.group(1)
            if self.base_url is not None:
                with contextlib.suppress(OSError):
                    if http_request(self.base_url, "GET", "/health", timeout=2).status == 200:
                        return
            if time.monotonic() > deadline:
                pytest.fail(f"llaisys serve did not answer /health within {START_TIMEOUT} s:\n{self.log()}")
            time.sleep(0.1)

    def __exit__(self, *exc) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self._log.close()

    def log(self) -> str:
        """All it printed so far."""
        return self.log_path.read_text(errors="replace")

    def wait_log(self, condition, timeout: float = 30.0) -> str:
        """The log once ``condition(log)`` holds (polled); fails the test, showing the log, if it does not."""
        assert wait_until(lambda: condition(self.log()), timeout), f"not in the server's log:\n{self.log()}"
        return self.log()

    def signal(self, sig) -> None:
        self.proc.send_signal(sig)

    def wait_exit(self, timeout: float = 30.0) -> int:
        """Its exit status, once it has exited; fails the test if it runs ``timeout`` seconds more."""
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            pytest.fail(f"llaisys serve still runs {timeout} s on:\n{self.log()}")
