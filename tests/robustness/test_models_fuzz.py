"""config.json and safetensors-header fuzz, in a child process with capped memory and time.

Every hostile value a careless or malicious writer can put in a model directory must end in
a ``ModelLoadError`` naming the file (or a model that loads and runs): never another
exception, a crash, a hang or an allocation sized by the file's say-so.
"""

from __future__ import annotations

import json
import random
import resource
import shutil
import struct
from pathlib import Path

import pytest

import llaisys
import llaisys_models
from helpers.child_process import run_in_child

DEMO = llaisys_models.DEMO_MODEL_DIR
MEMORY_CAP = 3 << 30  # address space of the child: far above what the demo needs, far below a runaway plan


def fuzz_in_child(folder: str) -> None:
    """The child: one line "case|outcome" per hostile file, loaded in place of the good one."""
    root = Path(folder)
    base = root / "base"
    config = json.loads((base / "config.json").read_text())
    weights = (base / "model.safetensors").read_bytes()
    (header_len,) = struct.unpack("<Q", weights[:8])
    header, data = weights[8:8 + header_len], weights[8 + header_len:]

    path = root / "case"
    shutil.copytree(base, path)

    def attempt(case, name, content):  # load with the file `name` replaced by `content`, then put it back
        (path / name).write_bytes(content if isinstance(content, bytes) else content.encode())
        try:
            model = llaisys_models.load(path, device="cpu")
            try:
                model.generate([1, 2, 10, 3, 4, 11], 2)
                outcome = "ran"
            except llaisys.LlaisysError as e:
                outcome = "refused at generate: " + str(e).splitlines()[0]
        except llaisys_models.ModelLoadError as e:
            outcome = "error: " + str(e)
        except Exception as e:
            outcome = f"UNEXPECTED {type(e).__name__}: {e}"
        print(case + "|" + outcome.replace("\n", " ")[:300], flush=True)
        shutil.copy(base / name, path / name)

    DEEP = "[" * 100_000 + "]" * 100_000  # nesting beyond the recursion limit, written as text
    hostile = [None, -1, 0, 10**9, 10**30, 1e308, float("inf"), float("nan"), "x", "false", [], {}, True, [5], "DEEP"]
    for key in sorted(config):
        for i, value in enumerate(hostile):
            attempt(f"config {key}={i}", "config.json", json.dumps(dict(config, **{key: value})).replace('"DEEP"', DEEP))
    attempt("config 5000 digits", "config.json", '{"vocab_size": ' + "7" * 5000 + "}")

    rng = random.Random(2026)
    for i in range(150):
        h = bytearray(header)
        kind = i % 3
        if kind == 0:  # flip bytes
            for _ in range(rng.randint(1, 4)):
                h[rng.randrange(len(h))] = rng.randrange(256)
        elif kind == 1:  # cut the header short (keeping its declared length or not)
            h = h[:rng.randrange(len(h))]
        else:  # digits where a number was
            at = h.find(b"[", rng.randrange(len(h)))
            h[at + 1:at + 1] = rng.choice(["1" + "0" * 20, str(2**64), str(2**63 - 1), "9" * 5000]).encode()
        declared = len(h) if kind != 1 or i % 2 else header_len
        blob = struct.pack("<Q", declared) + bytes(h) + data
        attempt(f"header {i}", "model.safetensors", blob)


def cap_memory():
    resource.setrlimit(resource.RLIMIT_AS, (MEMORY_CAP, MEMORY_CAP))
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))


def test_config_and_header_fuzz(tmp_path):
    if not (DEMO / "config.json").is_file():
        pytest.skip("the demo model is not in this checkout yet")
    shutil.copytree(DEMO, tmp_path / "base")
    proc = run_in_child(fuzz_in_child, tmp_path, timeout=600, preexec_fn=cap_memory)
    lines = proc.stdout.splitlines()
    assert proc.returncode == 0, f"the child died ({proc.returncode}) after {lines[-1:]}: {proc.stderr[-3000:]}"
    results = dict(line.split("|", 1) for line in lines)
    config_keys = len(json.loads((DEMO / "config.json").read_text()))
    assert len(results) == config_keys * 15 + 1 + 150, "cases are missing"
    unexpected = {case: outcome for case, outcome in results.items() if outcome.startswith("UNEXPECTED")}
    assert not unexpected, unexpected
    for case, outcome in results.items():
        if outcome.startswith("error: ") and case.startswith("config"):
            assert "config.json" in outcome, (case, outcome)
        if outcome.startswith("error: ") and case.startswith("header"):  # the file, or a name it lost
            assert "model.safetensors" in outcome or "missing from the checkpoint" in outcome, (case, outcome)
    errors = sum(outcome.startswith("error: ") for outcome in results.values())
    assert errors > len(results) // 3, "the fuzz hardly hit anything; is it mutating the files?"
