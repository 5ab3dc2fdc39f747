"""The documented limit of memory-mapped weights (README "Limits"), each case in a child process.

Weights stored in the compute dtype are used straight from the mapped file. A file
truncated in place under a loaded model then ends the process with SIGBUS at the next read
of a lost page; ``load(..., mmap=False)`` copies the weights and is immune.
"""

from __future__ import annotations

import os
import resource
import shutil
import signal

import pytest

import llaisys_models
from helpers.child_process import run_in_child

DEMO = llaisys_models.DEMO_MODEL_DIR

def truncate_in_child(path: str, mode: str) -> None:
    """The child: load (mapped or copied), generate, truncate the weights file in place, generate again."""
    model = llaisys_models.load(path, device="cpu", mmap=mode == "mmap")
    before = model.generate([1, 2, 10, 3, 4, 11], 4)
    os.truncate(os.path.join(path, "model.safetensors"), 0)  # rewritten in place, as `cp new old` does
    after = model.generate([1, 2, 10, 3, 4, 11], 4)
    print("same" if after == before else "different", flush=True)


def no_core_dump():
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))


@pytest.mark.parametrize("mode", ["mmap", "copy"])
def test_truncating_the_weights_under_a_loaded_model(tmp_path, mode):
    if not (DEMO / "config.json").is_file():
        pytest.skip("the demo model is not in this checkout yet")
    path = shutil.copytree(DEMO, tmp_path / "demo")
    proc = run_in_child(truncate_in_child, path, mode, timeout=120, preexec_fn=no_core_dump)
    if mode == "mmap":
        assert proc.returncode == -signal.SIGBUS, (proc.returncode, proc.stdout, proc.stderr[-2000:])
    else:
        assert proc.returncode == 0 and proc.stdout.strip() == "same", proc.stderr[-2000:]


def write_through_torch_in_child() -> None:
    """The child: a mapped weight written through torch.from_dlpack."""
    import torch

    model = llaisys_models.load(llaisys_models.DEMO_MODEL_DIR, device="cpu", mmap=True)
    weight = torch.from_dlpack(model.weights.layers[0].q_proj)  # exported read-only; torch ignores the flag
    weight.zero_()
    print("written", flush=True)


def test_torch_ignores_the_read_only_flag_of_mapped_weights():
    """README "Limits": writing a mapped weight through torch.from_dlpack is a segfault (the pages are
    read-only), since torch does not honour DLPack's read-only flag. If torch starts refusing the write,
    this test fails: update the README."""
    pytest.importorskip("torch")
    if not (DEMO / "config.json").is_file():
        pytest.skip("the demo model is not in this checkout yet")
    proc = run_in_child(write_through_torch_in_child, timeout=120, preexec_fn=no_core_dump)
    assert proc.returncode == -signal.SIGSEGV, (proc.returncode, proc.stdout, proc.stderr[-2000:])
