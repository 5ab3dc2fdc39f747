"""Running a hostile case in a fresh interpreter, so that a crash or a hang fails one test, not the run.

``run_isolated(code)`` runs ``code`` (with ``llaisys`` and ``np`` imported) in a child Python
and returns its stdout; a signal (segfault, abort), a non-zero exit or a timeout fails the test
with what the child printed. ``expect_error(code, error)`` runs ``code`` and returns the message
of the ``llaisys.<error>`` it must raise.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

TESTS = Path(__file__).resolve().parents[1]
PRELUDE = "import numpy as np\nimport llaisys\n"


def run_isolated(code: str, timeout: float = 120, env: dict | None = None) -> str:
    environ = {**os.environ, "PYTHONPATH": os.pathsep.join([str(TESTS), os.environ.get("PYTHONPATH", "")]),
               **(env or {})}
    try:
        result = subprocess.run([sys.executable, "-c", PRELUDE + textwrap.dedent(code)], capture_output=True,
                                text=True, timeout=timeout, env=environ)
    except subprocess.TimeoutExpired as e:
        pytest.fail(f"hung: no exit after {timeout} s\n{e.stdout or ''}\n{e.stderr or ''}")
    if result.returncode < 0:
        pytest.fail(f"crashed with {signal.Signals(-result.returncode).name}\n{result.stdout}\n{result.stderr[-3000:]}")
    assert result.returncode == 0, f"exit {result.returncode}\n{result.stdout}\n{result.stderr[-3000:]}"
    return result.stdout


def expect_error(code: str, error: str = "LlaisysValueError", **kwargs) -> str:
    """The message of the ``llaisys.<error>`` that ``code`` raises (fails if it raises nothing or crashes)."""
    body = textwrap.indent(textwrap.dedent(code), "    ")
    out = run_isolated(f"try:\n{body}\nexcept llaisys.{error} as e:\n    print('RAISED:', e)\n"
                       f"else:\n    print('NO ERROR')\n", **kwargs)
    last = out.strip().splitlines()[-1] if out.strip() else ""
    assert last.startswith("RAISED:"), f"expected llaisys.{error}, got: {out[-2000:]}"
    return last.removeprefix("RAISED: ")
