"""A safetensors header's shapes are bounded before their element counts are computed.

A 21 MB header can give one tensor a million sizes of 2**62: multiplying them out used to take
hours (a product of ever-growing integers). The header is read in a child process with capped
memory and time, so a regression is a named failure, not a hung run.
"""

from __future__ import annotations

import json
import resource
import struct
import subprocess
import sys
import textwrap

MEMORY_CAP = 3 << 30

CHILD = textwrap.dedent("""
    import sys
    import llaisys_models
    from llaisys_models.loading.safetensors import SafetensorsFile
    for path in sys.argv[1:]:
        try:
            f = SafetensorsFile(path)
            print(f"{path}|read {len(f.infos)} tensors", flush=True)
        except llaisys_models.ModelLoadError as e:
            print(f"{path}|error: {e}", flush=True)
""")


def cap_memory():
    resource.setrlimit(resource.RLIMIT_AS, (MEMORY_CAP, MEMORY_CAP))
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))


def write(path, dtype: str, shape: list[int], nbytes: int):
    header = json.dumps({"x": {"dtype": dtype, "shape": shape, "data_offsets": [0, nbytes]}}).encode()
    path.write_bytes(struct.pack("<Q", len(header)) + header + bytes(nbytes))
    return str(path)


def test_shapes_are_bounded(tmp_path):
    cases = {
        write(tmp_path / "many.safetensors", "F32", [2 ** 62 + 1] * 1_000_000, 4): "has an invalid shape",
        write(tmp_path / "65.safetensors", "F32", [1] * 65, 4): "(at most 64 sizes, each >= 0)",
        write(tmp_path / "64.safetensors", "F32", [1] * 64, 4): "read 1 tensors",
        write(tmp_path / "unknown.safetensors", "F8_E4M3", [2 ** 62] * 3, 4): "4 bytes cannot hold shape",
        write(tmp_path / "unknown_ok.safetensors", "F8_E4M3", [2, 2], 4): "read 1 tensors",
    }
    proc = subprocess.run([sys.executable, "-c", CHILD, *cases], capture_output=True, text=True, timeout=300,
                          preexec_fn=cap_memory)
    assert proc.returncode == 0, proc.stderr[-3000:]
    results = dict(line.split("|", 1) for line in proc.stdout.splitlines())
    assert results.keys() == cases.keys()
    for path, want in cases.items():
        assert want in results[path], (path, results[path])
        assert "\n" not in results[path] and len(results[path]) < 400, "the message must be one short line"
