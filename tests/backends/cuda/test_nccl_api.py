"""The CUDA backend declares the part of NCCL it calls itself (csrc/common/nccl_api.h: the build needs no NCCL
header, the library is opened at run time). Those declarations must be NCCL's ABI: compiled here next to a
real nccl.h, every code, the unique id's size and the configuration struct's layout are compared
(static_assert), and every function they name must exist in that header.

nccl.h comes from NVIDIA's nvidia-nccl-cu13 wheel where it is installed (site-packages/nvidia/nccl/include)
or from $LLAISYS_NCCL_INCLUDE (e.g. the header of the wheel unpacked: ``pip download nvidia-nccl-cu13``);
without either the test skips. The CUDA runtime headers come from a CUDA tree (cuda_toolchain), cuBLAS'
from the CoreX stand-in (only compat.h's declarations are needed).
"""

import importlib.util
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[3]
CSRC = REPO / "llaisys-backend-cuda" / "csrc"
sys.path.insert(0, str(REPO / "llaisys-backend-cuda" / "build_backend"))
from cuda_toolchain import find_cuda_root  # noqa: E402

CHECK = r"""
#include <cstddef>
#include <nccl.h>
#include "common/nccl_api.h"

namespace n = llaisys::cuda::nccl;
static_assert(NCCL_VERSION_CODE >= 21400, "ncclConfig_t as llaisys fills it needs NCCL >= 2.14");
static_assert(int(n::kSuccess) == ncclSuccess && int(n::kInProgress) == ncclInProgress, "ncclResult_t");
static_assert(int(n::kUint8) == ncclUint8 && int(n::kFloat16) == ncclFloat16 && int(n::kFloat32) == ncclFloat32 &&
              int(n::kBfloat16) == ncclBfloat16, "ncclDataType_t");
static_assert(int(n::kSum) == ncclSum, "ncclRedOp_t");
static_assert(sizeof(n::UniqueId) == sizeof(ncclUniqueId) && n::kUniqueIdBytes == NCCL_UNIQUE_ID_BYTES, "unique id");
static_assert(sizeof(ncclDataType_t) == sizeof(int) && sizeof(ncclRedOp_t) == sizeof(int) &&
              sizeof(ncclResult_t) == sizeof(int), "the enums travel as ints");
#define SAME_FIELD(ours, theirs) \
    static_assert(offsetof(n::Config, ours) == offsetof(ncclConfig_t, theirs) && \
                  sizeof(n::Config::ours) == sizeof(ncclConfig_t::theirs), #theirs)
SAME_FIELD(size, size);
SAME_FIELD(magic, magic);
SAME_FIELD(version, version);
SAME_FIELD(blocking, blocking);
SAME_FIELD(cga_cluster_size, cgaClusterSize);
SAME_FIELD(min_ctas, minCTAs);
SAME_FIELD(max_ctas, maxCTAs);
SAME_FIELD(net_name, netName);
static_assert(sizeof(n::Config) <= sizeof(ncclConfig_t), "an older, shorter ncclConfig_t");
static_assert(n::Config{}.magic == NCCL_API_MAGIC && n::Config::kUndefined == NCCL_CONFIG_UNDEF_INT, "config");
// every function the backend resolves by name, with the arguments it passes
[[maybe_unused]] static void calls(ncclComm_t comm, cudaStream_t stream) {
    ncclUniqueId id;
    ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
    ncclResult_t result;
    (void)ncclGetUniqueId(&id);
    (void)ncclCommInitRankConfig(&comm, 2, id, 0, &config);
    (void)ncclCommGetAsyncError(comm, &result);
    (void)ncclCommAbort(comm);
    (void)ncclCommDestroy(comm);
    (void)ncclAllReduce(nullptr, nullptr, 1, ncclFloat32, ncclSum, comm, stream);
    (void)ncclAllGather(nullptr, nullptr, 1, ncclUint8, comm, stream);
    (void)ncclBroadcast(nullptr, nullptr, 1, ncclUint8, 0, comm, stream);
    (void)ncclGetErrorString(result);
}
"""


def nccl_include() -> Path | None:
    chosen = os.environ.get("LLAISYS_NCCL_INCLUDE")
    if chosen:
        return Path(chosen)
    spec = importlib.util.find_spec("nvidia")
    for folder in (spec.submodule_search_locations or []) if spec else []:
        if (Path(folder) / "nccl" / "include" / "nccl.h").is_file():
            return Path(folder) / "nccl" / "include"
    return None


def test_declarations_match_nccl_h(tmp_path):
    include = nccl_include()
    if include is None or not (include / "nccl.h").is_file():
        pytest.skip("no nccl.h: install nvidia-nccl-cu13 or set LLAISYS_NCCL_INCLUDE to a folder holding it")
    cuda = find_cuda_root()
    compiler = os.environ.get("CXX") or shutil.which("g++")
    if cuda is None or compiler is None:
        pytest.skip("needs a CUDA tree's runtime headers (CUDA_HOME) and g++")
    source = tmp_path / "check.cpp"
    source.write_text(CHECK)
    corex_api = REPO / "tests" / "backends" / "iluvatar" / "corex_api"  # (cuBLAS: compat.h's CoreX branch)
    result = subprocess.run([compiler, "-std=c++17", "-fsyntax-only", "-Wall", "-Werror", "-DLLAISYS_COREX_CONFIG",
                             f"-I{include}", f"-I{CSRC}", f"-I{corex_api}", f"-I{cuda / 'include'}", str(source)],
                            capture_output=True, text=True)
    assert result.returncode == 0, result.stderr[-4000:]
