// compat.h — the one place where the three ways of building these sources differ:
//   * NVIDIA: nvcc (or clang in CUDA mode) against the CUDA toolkit; warps of 32 threads.
//   * Iluvatar CoreX: CoreX's clang (`-x ivcore`, defines __ILUVATAR__); warps of 64 threads, cuBLAS
//     without cublasComputeType_t (shared code passes CUDA_R_32F, which CUDA's cuBLAS also accepts from
//     C++), no cublasSetWorkspace, the CUDA 11 graph-instantiate signature, architectures named ivcoreNN,
//     /dev/iluvatar* and ixsmi in the "no device" reasons.
//     LLAISYS_COREX_CONFIG selects the same branch on any compiler, so that Debian's clang in CUDA mode
//     can check the CoreX configuration against the CUDA headers (everything but CoreX-only headers),
//     and host execution at warp 64 runs it.
//   * Host execution (LLAISYS_HOST_EXEC, tests only): g++ compiles the same sources against a header
//     that runs kernel bodies on CPU threads (tests/backends/cuda/host_exec/llaisys_host_exec.h).
// Kernel sources include this header and never a CUDA header directly. Rules for them (DESIGN §4): lane
// counts, shuffle widths and masks come from WARP_SIZE / kFullMask, never a literal 32 or 0xffffffff;
// at most 1024 threads per block; no inline PTX, no __ldg/__ldcs-style intrinsics, no cublasLt, no
// cuda_fp8.h; every launch goes through LLAISYS_LAUNCH (launch.h).
#pragma once

#if defined(__ILUVATAR__) && !defined(LLAISYS_COREX_CONFIG)
#define LLAISYS_COREX_CONFIG 1
#endif

#if defined(LLAISYS_HOST_EXEC)
#include "llaisys_host_exec.h"  // test-only: CUDA runtime, cuBLAS and device built-ins on CPU threads
#else
#include <cublas_v2.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#endif

// Tensor cores through CUDA C++'s WMMA API (nvcuda::wmma: load_matrix_sync / mma_sync / store_matrix_sync on
// 16 x 16 x 16 fragments, f16 and bf16 in, f32 accumulate; sm_80 and newer). LLAISYS_HAS_WMMA is 1 where the
// build offers it: NVIDIA (nvcc, clang) and host execution, whose header emulates the API. CoreX's mma.h
// (crt/iluvatar_mma.hpp, as public copies of its 3.x / 4.4 SDK headers show) has an nvcuda::wmma namespace
// too, but not this API: other shapes (f16 16x16x32, 32x32x16, ...; int8; no bf16 at all), fragments over
// 64 lanes, and loads / stores that ignore ldm and read a swizzled tile layout of their own, so kernels
// written to CUDA's contract would compute garbage there. The CoreX build therefore keeps the portable SIMT
// kernels (linear.cu chooses); a CoreX tensor-core path would be a kernel of its own, checked on CoreX.
#if !defined(LLAISYS_COREX_CONFIG)
#define LLAISYS_HAS_WMMA 1
#if !defined(LLAISYS_HOST_EXEC)
#include <mma.h>
#endif
#else
#define LLAISYS_HAS_WMMA 0
#endif

// __dp4a (four int8 products added to an int32, exact): an NVIDIA intrinsic from sm_61 on. CoreX's clang is
// not known to offer it, so the CoreX build (and host execution at warp 64) takes the portable byte loop,
// which gives the same exact integer.
#if !defined(LLAISYS_COREX_CONFIG)
#define LLAISYS_HAS_DP4A 1
#else
#define LLAISYS_HAS_DP4A 0
#endif

#include <cstdint>
#include <type_traits>

// Threads per warp the kernels are written for; a device whose warpSize differs is refused at run time.
#ifndef LLAISYS_WARP_SIZE
#if defined(LLAISYS_COREX_CONFIG)
#define LLAISYS_WARP_SIZE 64
#else
#define LLAISYS_WARP_SIZE 32
#endif
#endif

namespace llaisys::cuda {

constexpr int WARP_SIZE = LLAISYS_WARP_SIZE;
static_assert(WARP_SIZE == 32 || WARP_SIZE == 64, "warps of 32 (NVIDIA) or 64 (CoreX) threads");
constexpr int kMaxBlockThreads = 1024;

// Lane masks for the *_sync warp intrinsics: one bit per lane, so 64-bit for warps of 64 (CoreX), and
// kFullMask (all ones) is every lane of the warp.
using lane_mask_t = std::conditional_t<(WARP_SIZE > 32), unsigned long long, unsigned int>;
constexpr lane_mask_t kFullMask = static_cast<lane_mask_t>(~0ull);

// The block's dynamic shared memory (the launch's shared_bytes) as a `type*` named `name`.
#if defined(LLAISYS_HOST_EXEC)
#define LLAISYS_DYNAMIC_SHARED(type, name) type* name = ::llaisys_host_exec::dynamic_shared<type>()
#else
#define LLAISYS_DYNAMIC_SHARED(type, name)                                   \
    extern __shared__ __align__(16) unsigned char llaisys_dynamic_shared_[]; \
    type* name = reinterpret_cast<type*>(llaisys_dynamic_shared_)
#endif

// An unroll hint for a loop whose trip count is known only at run time: nvcc honours "#pragma unroll 2"
// there; clang (CoreX's compiler, the clang-22 check) reports it as a failed transformation, an error
// under -Werror, so elsewhere the compiler decides. Unrolling never reorders the loop's arithmetic.
#if defined(__NVCC__)
#define LLAISYS_UNROLL_2 _Pragma("unroll 2")
#else
#define LLAISYS_UNROLL_2
#endif

// cudaGraphInstantiate: CUDA >= 12 takes flags; CoreX keeps the CUDA 11 form (error node, log buffer).
inline cudaError_t graph_instantiate(cudaGraphExec_t* exec, cudaGraph_t graph) {
#if defined(LLAISYS_COREX_CONFIG) && defined(__ILUVATAR__)
    return cudaGraphInstantiate(exec, graph, nullptr, nullptr, 0);
#else
    return cudaGraphInstantiate(exec, graph, 0);
#endif
}

// cuBLAS workspace given by the caller (so that graph capture never makes cuBLAS allocate). CoreX's
// cuBLAS follows CUDA 10.2's API (libcublas.so.10.2 in CoreX 4.4), which has no cublasSetWorkspace: there
// cuBLAS keeps its own.
inline cublasStatus_t set_cublas_workspace(cublasHandle_t handle, void* workspace, size_t bytes) {
#if defined(LLAISYS_COREX_CONFIG)
    (void)handle; (void)workspace; (void)bytes;
    return CUBLAS_STATUS_SUCCESS;
#else
    return cublasSetWorkspace(handle, workspace, bytes);
#endif
}

// Words for the "no device" reasons (backend.h: device_count leaves the reason in last_error) and the
// build's architecture option.
#if defined(LLAISYS_COREX_CONFIG)
constexpr const char* kVendor = "Iluvatar CoreX";
constexpr const char* kDeviceNodes = "/dev/iluvatar*";  // one per GPU, made by the kernel driver
constexpr const char* kListTool = "ixsmi";               // lists the GPUs the driver sees
constexpr const char* kArchOption = "LLAISYS_ILUVATAR_ARCH";
// The collectives' library (common/collectives.cu): CoreX's NCCL-compatible library, under NCCL's name, in
// the SDK's lib64 ($COREX_HOME, default /usr/local/corex) or on the library path.
constexpr const char* kNcclBesideLibrary = "";  // ("": none)
constexpr const char* kNcclSdkHome = "COREX_HOME";
constexpr const char* kNcclSdkDefault = "/usr/local/corex";
constexpr const char* kNcclSdkFile = "lib64/libnccl.so";
constexpr const char* kNcclName = "libnccl.so";
constexpr const char* kNcclRemedy = "install the CoreX SDK with its NCCL-compatible library ($COREX_HOME/lib64/libnccl.so)";

// CoreX's clang builds for a named architecture (--cuda-gpu-arch=ivcoreNN) and runs nothing else; a device
// reports a compute capability instead: 7.0 = ivcore10 (BI-V100), 7.1 = ivcore11 (BI-V150, MR-V100),
// 8.0 = ivcore20 (the mapping of Iluvatar's Triton backend). nullptr: a capability this table does not know.
inline const char* corex_arch_of(int capability) {
    switch (capability) {
        case 70: return "ivcore10";
        case 71: return "ivcore11";
        case 80: return "ivcore20";
        default: return nullptr;
    }
}
#else
constexpr const char* kVendor = "NVIDIA";
constexpr const char* kDeviceNodes = "/dev/nvidia[0-9]*";
constexpr const char* kListTool = "nvidia-smi";
constexpr const char* kArchOption = "LLAISYS_CUDA_ARCHS";
// The collectives' library (common/collectives.cu): NCCL from NVIDIA's nvidia-nccl-cu13 wheel, which pip
// puts in site-packages/nvidia/nccl/lib (relative to this library's folder below), or one on the library path.
constexpr const char* kNcclBesideLibrary = "../nvidia/nccl/lib/libnccl.so.2";
constexpr const char* kNcclSdkHome = "";  // ("": no SDK folder to look in)
constexpr const char* kNcclSdkDefault = "";
constexpr const char* kNcclSdkFile = "";
constexpr const char* kNcclName = "libnccl.so.2";
constexpr const char* kNcclRemedy = "pip install nvidia-nccl-cu13 (or llaisys-backend-cuda[nccl])";
#endif

// The largest fixed block any kernel launches; a device allowing fewer threads per block is refused (the
// kernels whose block size adapts, argmax and sample, stay within the device's limit).
constexpr int kMinBlockThreads = 256;

}  // namespace llaisys::cuda
