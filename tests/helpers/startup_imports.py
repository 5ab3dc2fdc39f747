"""Which heavy packages a step imports first, measured in a fresh interpreter."""

from __future__ import annotations

import json
import subprocess
import sys

HEAVY = ["ml_dtypes", "torch", "transformers", "tokenizers", "jinja2", "fastapi", "uvicorn", "gguf"]

MARK = "heavy imports:"

CHILD = """
import json, sys
from contextlib import redirect_stdout
from io import StringIO


def cli(*argv):
    from llaisys.cli import main
    try:
        return main(list(argv))
    except SystemExit as e:  # --help and --version
        return e.code

steps, out = {{}}, StringIO()
for step in {steps!r}:
    with redirect_stdout(out):
        exec(step)
    steps[step] = [name for name in {heavy!r} if sys.modules.get(name) is not None and name not in sum(steps.values(), [])]
print(out.getvalue() + {mark!r} + json.dumps(steps))
"""


def heavy_imports(*steps: str) -> tuple[dict[str, list[str]], str]:
    """{step: the heavy packages it imported first} for ``steps`` run in order in a fresh interpreter, and what
    they printed."""
    code = CHILD.format(steps=steps, heavy=HEAVY, mark=MARK)
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    out, _, report = proc.stdout.rpartition(MARK)
    return json.loads(report), out
