"""Child processes: a function of a test module run in a fresh interpreter, and children that behave the same
however the test runner itself was started.

``run_in_child(function, *args)`` runs a module-level function of a test module in a new Python process
(``python tests/helpers/child_process.py MODULE FUNCTION ARGS...``): for what must not share the runner's process (a crash,
a memory cap, environment read at import, a thread count fixed at start-up). The child's code is an ordinary
function, which ruff reads and a reader can follow, instead of a string of code.

A runner started in the background by a non-interactive shell (``cmd &``, ``nohup``, many CI agents and job
schedulers) inherits SIGINT as ignored, and exec keeps an ignored signal ignored, so a child started plainly
never sees the SIGINT a test sends it (Python leaves an inherited SIG_IGN alone, as a CLI should:
``nohup llaisys serve &`` means it). Tests that signal a child start it through ``popen``.
"""

from __future__ import annotations

import importlib
import os
import signal
import subprocess
import sys
from pathlib import Path

TESTS = Path(__file__).resolve().parent.parent  # tests/ (this file is in tests/helpers/)
SIGNALS_SENT = (signal.SIGINT, signal.SIGTERM)  # what tests send to their children


def default_signals() -> None:
    """``preexec_fn``: the child reacts to SIGINT / SIGTERM as a program started from a terminal does."""
    for sig in SIGNALS_SENT:
        signal.signal(sig, signal.SIG_DFL)


def popen(args, **kwargs) -> subprocess.Popen:
    """``subprocess.Popen`` with the default disposition of the signals tests send."""
    return subprocess.Popen(args, preexec_fn=default_signals, **kwargs)


def run_in_child(function, *args, env: dict | None = None, **kwargs) -> subprocess.CompletedProcess:
    """``function(*args)`` (a module-level function; its arguments as strings) in a fresh interpreter, with
    ``env`` (default: this process's environment); its output captured as text. Keyword arguments go to
    ``subprocess.run`` (timeout, preexec_fn, ...)."""
    module = sys.modules[function.__module__]
    path = [str(TESTS), str(Path(module.__file__).resolve().parent), (env or os.environ).get("PYTHONPATH", "")]
    environ = {**(os.environ if env is None else env), "PYTHONPATH": os.pathsep.join(filter(None, path))}
    # run as a script, not ``-m helpers.child_process``: importing the helpers package would import torch first
    command = [sys.executable, str(Path(__file__).resolve()), module.__name__, function.__name__, *map(str, args)]
    return subprocess.run(command, env=environ, capture_output=True, text=True, **kwargs)


if __name__ == "__main__":
    module_name, function_name, *arguments = sys.argv[1:]
    getattr(importlib.import_module(module_name), function_name)(*arguments)
