// linear: out[M,N] = x[M,K] @ weight[N,K]^T + bias[N], the entry points of each instruction-set path.
//
// linear.cpp holds the exported llaisys_cpu_linear (dispatch on simd_level()) and the portable path;
// linear_avx2.cpp / linear_avx512.cpp hold the SIMD paths. All three instantiate the same
// algorithm from linear_impl.h with their own vector traits.
#pragma once

#include <cstdint>

namespace llaisys::cpu::linear {

struct Args {
    int dtype;                 // kF32 / kF16 / kBF16
    int64_t M, N, K;
    void* out;                 // [M, N]
    const void* x;             // [M, K]
    const void* weight;        // [N, K]
    const void* bias;          // [N] or nullptr
};

// Decode-shaped calls (M <= kGemvMaxRows) stream each weight row once for all rows of x;
// larger M runs the packed, register-tiled GEMM.
constexpr int64_t kGemvMaxRows = 8;

void run_portable(const Args& args);
void run_avx2(const Args& args);
void run_avx512(const Args& args);

// Knobs read once per process from the environment (tests use them to reach every path):
//   LLAISYS_CPU_LINEAR_BF16DOT=0   bf16 without AVX512-BF16 (vdpbf16ps) even where the CPU has it: the f32
//                                  GEMM on expanded panels and the shift + FMA GEMV, as on older CPUs
//   LLAISYS_CPU_LINEAR_PATH=gemv|gemm   force one algorithm for every M (testing only)
bool bf16dot_allowed();
int forced_path();  // 0 = by shape, 1 = gemv, 2 = gemm

}  // namespace llaisys::cpu::linear
