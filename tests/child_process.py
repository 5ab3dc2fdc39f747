"""Child processes that behave the same however the test runner itself was started.

A runner started in the background by a non-interactive shell (``cmd &``, ``nohup``, many CI agents and job
schedulers) inherits SIGINT as ignored, and exec keeps an ignored signal ignored, so a child started plainly
never sees the SIGINT a test sends it (Python leaves an inherited SIG_IGN alone, as a CLI should:
``nohup llaisys serve &`` means it). Tests that signal a child start it through ``popen``.
"""

from __future__ import annotations

import signal
import subprocess

SIGNALS_SENT = (signal.SIGINT, signal.SIGTERM)  # what tests send to their children


def default_signals() -> None:
    """``preexec_fn``: the child reacts to SIGINT / SIGTERM as a program started from a terminal does."""
    for sig in SIGNALS_SENT:
        signal.signal(sig, signal.SIG_DFL)


def popen(args, **kwargs) -> subprocess.Popen:
    """``subprocess.Popen`` with the default disposition of the signals tests send."""
    return subprocess.Popen(args, preexec_fn=default_signals, **kwargs)
