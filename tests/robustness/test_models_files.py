"""Special files in a model directory: llaisys opens only regular files.

A FIFO named model.safetensors (or config.json, tokenizer.json, a shard) used to block the
loader forever in open(); a device would be read as if it were a file. Each case runs in
one child process with a deadline, so a regression shows as a named failure, not a hung run.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest

import llaisys_models
from helpers.child_process import run_in_child

DEMO = llaisys_models.DEMO_MODEL_DIR

def load_in_child(*cases: str) -> None:
    """The child: each "case|path|what" loaded (a model, or its tokenizer); prints "case|outcome"."""
    for case, path, what in [line.split("|") for line in cases]:
        try:
            if what == "tokenizer":
                llaisys_models.load_tokenizer(path)
            else:
                llaisys_models.load(path, device="cpu")
            print(f"{case}|loaded", flush=True)
        except llaisys_models.ModelLoadError as e:
            print(f"{case}|{e}", flush=True)


def demo_copy(root: Path, name: str) -> Path:
    target = root / name
    shutil.copytree(DEMO, target)
    return target


@pytest.fixture
def special_dirs(tmp_path):
    if not (DEMO / "config.json").is_file():
        pytest.skip("the demo model is not in this checkout yet")
    if not hasattr(os, "mkfifo"):
        pytest.skip("no FIFOs on this platform")
    cases = {}

    def fifo_in_place_of(name: str, what: str = "model"):
        path = demo_copy(tmp_path, f"fifo_{name}")
        (path / name).unlink()
        os.mkfifo(path / name)
        cases[f"fifo as {name}"] = (path, what, "a FIFO")

    fifo_in_place_of("model.safetensors")
    fifo_in_place_of("config.json")
    fifo_in_place_of("generation_config.json")
    fifo_in_place_of("tokenizer.json", "tokenizer")
    extra = demo_copy(tmp_path, "fifo_beside")  # a stray FIFO beside the real weights
    os.mkfifo(extra / "extra.safetensors")
    cases["fifo beside the weights"] = (extra, "model", "a FIFO")
    sharded = demo_copy(tmp_path, "fifo_shard")
    names = json.loads((sharded / "model.safetensors").read_bytes()[8:][:int.from_bytes(
        (sharded / "model.safetensors").read_bytes()[:8], "little")])
    names.pop("__metadata__", None)
    (sharded / "model.safetensors.index.json").write_text(json.dumps({"weight_map": dict.fromkeys(names, "s.safetensors")}))
    os.mkfifo(sharded / "s.safetensors")
    cases["fifo as a shard"] = (sharded, "model", "a FIFO")
    os.mkfifo(tmp_path / "model")  # the model path itself (a GGUF file is recognised by its first bytes)
    cases["fifo as the model path"] = (tmp_path / "model", "model", "a FIFO")
    if Path("/dev/zero").exists():
        device = demo_copy(tmp_path, "device")
        (device / "model.safetensors").unlink()
        (device / "model.safetensors").symlink_to("/dev/zero")
        cases["/dev/zero as model.safetensors"] = (device, "model", "a character device")
    return cases


def test_special_files_are_refused_without_blocking(special_dirs):
    args = [f"{case}|{path}|{what}" for case, (path, what, _) in special_dirs.items()]
    try:
        proc = run_in_child(load_in_child, *args, timeout=120)
    except subprocess.TimeoutExpired as e:
        done = (e.stdout or b"").decode() if isinstance(e.stdout, bytes) else (e.stdout or "")
        pytest.fail(f"the loader blocked; cases finished before that: {done.splitlines()}")
    assert proc.returncode == 0, proc.stderr
    results = dict(line.split("|", 1) for line in proc.stdout.splitlines())
    for case, (_, _, kind) in special_dirs.items():
        outcome = results.get(case, "")
        assert kind in outcome and ("not a regular file" in outcome or "not a model directory" in outcome), (case, outcome)
