"""Hostile GGUF files, loaded in a child process with capped memory and time.

A size a GGUF file declares must be bounded before work or memory depends on it: a 280 KB file
claiming 2**40 layers used to build a per-layer plan until memory ran out. Each case here is a
valid tiny file with one declared size made huge, and a byte fuzz of the header; every outcome
must be a ``ModelLoadError`` of one line naming the file (or a model that loads and runs), never
another exception, a crash, a hang or a runaway allocation. The exact message of each field's
refusal is tested in tests/models/test_gguf_reader.py.
"""

from __future__ import annotations

import resource
import subprocess
import sys
import textwrap
from pathlib import Path

MEMORY_CAP = 3 << 30  # address space of the child: far above what a tiny model needs, far below a runaway plan
TESTS = Path(__file__).resolve().parent.parent  # helpers/gguf_files.py is under it
HUGE = 2 ** 40

CHILD = textwrap.dedent("""
    import random, sys
    from pathlib import Path
    sys.path.insert(0, sys.argv[2])
    from gguf import GGUFValueType as V
    import llaisys, llaisys_models
    from llaisys_models.loading.gguf.reader import GGUFFile
    from helpers.gguf_files import write_tiny_gguf

    root, huge = Path(sys.argv[1]), int(sys.argv[3])

    def attempt(case, path):
        try:
            model = llaisys_models.load(path, device="cpu")
            try:
                model.generate([1, 2, 3], 2)
                outcome = "ran"
            except llaisys.LlaisysError as e:
                outcome = "refused at generate: " + str(e).splitlines()[0]
        except llaisys_models.ModelLoadError as e:
            outcome = ("error: " if str(path) in str(e) else "UNNAMED ") + str(e)
        except Exception as e:
            outcome = f"UNEXPECTED {type(e).__name__}: {e}"
        print(case + "|" + outcome.replace("\\n", " ")[:400], flush=True)

    keys = ["block_count", "embedding_length", "feed_forward_length", "attention.head_count",
            "attention.head_count_kv", "attention.key_length", "context_length", "vocab_size"]
    for key in keys:
        attempt(f"huge {key}", write_tiny_gguf(root / "huge.gguf", extra={f"qwen2.{key}": (huge, V.UINT64)}))

    base = write_tiny_gguf(root / "base.gguf")
    data = base.read_bytes()
    header_end = GGUFFile(base).tensors["token_embd.weight"].offset
    rng = random.Random(2027)
    fuzzed = root / "fuzz.gguf"
    for i in range(200):
        blob = bytearray(data)
        if i % 2:  # overwrite a few bytes of the header with random ones
            for _ in range(rng.randint(1, 3)):
                blob[rng.randrange(8, header_end)] = rng.randrange(256)
        else:  # a u64-sized run of 0xff (a count or length at its largest) somewhere in the header
            at = rng.randrange(8, header_end - 8)
            blob[at:at + 8] = bytes([255]) * 8
        fuzzed.write_bytes(blob)
        attempt(f"fuzz {i}", fuzzed)
""")


def cap_memory():
    resource.setrlimit(resource.RLIMIT_AS, (MEMORY_CAP, MEMORY_CAP))
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))


def test_hostile_sizes_and_header_fuzz(tmp_path):
    proc = subprocess.run([sys.executable, "-c", CHILD, str(tmp_path), str(TESTS), str(HUGE)],
                          capture_output=True, text=True, timeout=600, preexec_fn=cap_memory)
    lines = proc.stdout.splitlines()
    assert proc.returncode == 0, f"the child died ({proc.returncode}) after {lines[-1:]}: {proc.stderr[-3000:]}"
    results = dict(line.split("|", 1) for line in lines)
    assert len(results) == 8 + 200, "cases are missing"
    bad = {case: outcome for case, outcome in results.items() if outcome.startswith(("UNEXPECTED", "UNNAMED"))}
    assert not bad, bad
    # llama.cpp's limits: 512 layers, uint32_t sizes
    assert results["huge block_count"].endswith(f"qwen2.block_count must be an integer in [1, 512], got {HUGE}")
    for key in ("embedding_length", "attention.head_count", "context_length", "vocab_size"):
        assert results[f"huge {key}"].endswith(f"qwen2.{key} must be an integer in [1, 4294967295], got {HUGE}")
    errors = sum(outcome.startswith("error: ") for outcome in results.values())
    assert errors > 100, "the fuzz hardly hit anything; is it mutating the files?"
