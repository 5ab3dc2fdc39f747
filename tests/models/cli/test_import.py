"""``import llaisys_models`` in a process without torch (the README's Python snippet)."""

from __future__ import annotations

import os
import subprocess
import sys

ADVISORY = "PyTorch was not found"
# sys.modules["torch"] = None makes torch unimportable, as on a machine without it
SNIPPET = "import sys; sys.modules['torch'] = None; {first}from transformers import AutoTokenizer"


def run(code: str) -> str:
    env = {k: v for k, v in os.environ.items() if not k.startswith("TRANSFORMERS_")}  # transformers' defaults
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, env=env)
    assert proc.returncode == 0, proc.stderr
    return proc.stdout + proc.stderr


def test_import_keeps_transformers_torch_advisory_off():
    assert ADVISORY in run(SNIPPET.format(first="")), "transformers no longer prints the advisory: drop this"
    assert ADVISORY not in run(SNIPPET.format(first="import llaisys_models; "))
