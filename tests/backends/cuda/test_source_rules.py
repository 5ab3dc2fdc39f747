"""The rules of DESIGN §4 for the kernel sources that CUDA and Iluvatar CoreX share, checked on the text.

A violation here would build and pass on NVIDIA and break (or silently compute garbage) on CoreX, whose
warps have 64 threads and whose clang rejects PTX-level constructs.
"""

import re
from pathlib import Path

import pytest

CSRC = Path(__file__).resolve().parents[3] / "llaisys-backend-cuda" / "csrc"
SOURCES = sorted([*CSRC.rglob("*.cu"), *CSRC.rglob("*.cuh"), *CSRC.rglob("*.h")])
COMPAT = CSRC / "compat.h"

RULES = {  # pattern -> why it is not allowed
    r"\basm\s*(volatile\s*)?\(": "inline PTX (CoreX rejects it)",
    r"__ld(g|cs|cg|ca|lu|cv)\s*\(": "cache-hint load intrinsics (lower to PTX CoreX rejects)",
    r"cublasLt": "cublasLt (not on CoreX)",
    r"cublasComputeType_t|CUBLAS_COMPUTE_": "cublasComputeType_t (CoreX takes cudaDataType: pass CUDA_R_32F)",
    r"cuda_fp8\.h": "cuda_fp8.h (not on CoreX)",
    r"0x[fF]{8}(?![0-9a-fA-F])": "a literal 32-lane mask (use kFullMask)",
    r"\bwarpSize\b": "the warpSize built-in (use the WARP_SIZE constant the kernels are built for)",
    r"_sync\s*\(\s*(0x|~0|-1)": "a literal lane mask in a *_sync intrinsic (use kFullMask)",
    r"[%/]\s*32\b|&\s*31\b|>>\s*5\b": "lane / warp arithmetic with a literal 32 (use WARP_SIZE)",
    r"<<<": "a kernel launch outside LLAISYS_LAUNCH",
    r"#\s*include\s*<(cuda_runtime|cuda_fp16|cuda_bf16|cublas_v2|cuda)\.h>": "a CUDA header outside compat.h",
}


@pytest.mark.parametrize("pattern", RULES, ids=lambda p: RULES[p].split(" (")[0])
def test_shared_sources_follow_the_portability_rules(pattern):
    allowed_in = {COMPAT} if "header" in RULES[pattern] or "mask" in RULES[pattern] else set()
    if pattern == "<<<":
        allowed_in = {CSRC / "common" / "launch.h"}
    hits = []
    for path in SOURCES:
        if path in allowed_in:
            continue
        for number, line in enumerate(path.read_text().splitlines(), 1):
            code = line.split("//")[0]
            if re.search(pattern, code):
                hits.append(f"{path.relative_to(CSRC)}:{number}: {line.strip()}")
    assert not hits, f"{RULES[pattern]}:\n" + "\n".join(hits)


def test_blocks_stay_within_1024_threads():
    """Every __launch_bounds__ and every literal block size handed to LLAISYS_LAUNCH is <= 1024."""
    for path in SOURCES:
        text = path.read_text()
        for bound in re.findall(r"__launch_bounds__\((\d+)\)", text):
            assert int(bound) <= 1024, f"{path.name}: __launch_bounds__({bound})"
        for block in re.findall(r"LLAISYS_LAUNCH\([^,]+,[^,]+,\s*(\d+)\s*,", text):
            assert int(block) <= 1024, f"{path.name}: block of {block}"


def test_every_launch_goes_through_the_macro():
    launches = sum(len(re.findall(r"LLAISYS_LAUNCH\(", p.read_text())) for p in SOURCES if p.suffix == ".cu")
    kernels = sum(len(re.findall(r"__global__", p.read_text())) for p in SOURCES if p.suffix in (".cu", ".cuh"))
    assert kernels >= 10 and launches >= kernels, (kernels, launches)
