// linear: out[M, N] = x[M, K] @ weight[N, K]^T + bias[N]; see linear.h for the parts. This file holds each
// build's configuration (register tiles sized to its vector registers) and the exported entry point.
#include <cstring>
#include <string>

#include "../common/api.h"
#include "linear_gemm.h"
#include "linear_gemv.h"
#if defined(LLAISYS_ISA_AVX512)
#include "linear_bf16dot.h"
#endif

namespace llaisys::cpu::LLAISYS_ISA {

#if defined(LLAISYS_ISA_AVX512)
// 14 x 32 tile: 28 zmm accumulators + 2 B vectors + 1 broadcast = 31 of 32 registers.
using GemmKernel = F32Kernel<Vec16, 14, 2, 256, 256>;
#elif defined(LLAISYS_ISA_AVX2)
// 6 x 16 tile: 12 ymm accumulators + 2 B vectors + 1 broadcast.
using GemmKernel = F32Kernel<Vec8, 6, 2, 256, 256>;
#else
// 4 x 8 tile: 8 SSE accumulators (each Vec8 is two).
using GemmKernel = F32Kernel<Vec8, 4, 1, 256, 128>;
#endif

// One dtype: GEMV or GEMM by M (or the forced path), both in Kern's arithmetic (see linear_gemv.h).
template <class T, class Kern>
static void run(const LinearArgs& a) {
    if (a.K == 0) {  // out = bias, or 0 (all-zero bits in every dtype)
        for (int64_t m = 0; m < a.M; ++m) {
            void* row = static_cast<T*>(a.out) + m * a.N;
            if (a.bias) std::memcpy(row, a.bias, sizeof(T) * size_t(a.N));
            else std::memset(row, 0, sizeof(T) * size_t(a.N));
        }
        return;
    }
    const LinearPath forced = linear_forced_path();
    const bool use_gemv = forced == LinearPath::kGemv || (forced == LinearPath::kByShape && a.M <= kGemvMaxRows);
    if (use_gemv) gemv<Kern, T>(a);
    else gemm<Vec, Kern, T>(a);
}

void linear(const LinearArgs& a) {
    with_float_type(a.dtype, [&](auto tag) {
        using T = decltype(tag);
#if defined(LLAISYS_ISA_AVX512)
        if constexpr (std::is_same_v<T, bf16_t>) {
            if (has_feature(Feature::kAvx512Bf16) && linear_bf16dot_allowed())
                return run<T, Bf16DotKernel<14, 1024, 128>>(a);
        }
#endif
        run<T, GemmKernel>(a);
    });
}

}  // namespace llaisys::cpu::LLAISYS_ISA

#if defined(LLAISYS_ISA_PORTABLE)  // the knobs and the exported entry point, compiled once
namespace llaisys::cpu {

static bool env_is(const char* name, const char* value) {
    const char* v = std::getenv(name);
    return v && !std::strcmp(v, value);
}

bool linear_bf16dot_allowed() {
    static const bool allowed = !env_is("LLAISYS_CPU_LINEAR_BF16DOT", "0");
    return allowed;
}

LinearPath linear_forced_path() {
    static const LinearPath path = env_is("LLAISYS_CPU_LINEAR_PATH", "gemv")   ? LinearPath::kGemv
                                   : env_is("LLAISYS_CPU_LINEAR_PATH", "gemm") ? LinearPath::kGemm
                                                                               : LinearPath::kByShape;
    return path;
}

}  // namespace llaisys::cpu

int LLAISYS_FN(linear)(int device, void* stream, int dtype, int64_t M, int64_t N, int64_t K, void* out, const void* x,
                       const void* weight, const void* bias) {
    (void)device;
    return llaisys::launch("linear", stream, [=] {
        llaisys::require_float_dtype(dtype);
        if (M == 0 || N == 0) return;  // nothing to compute
        LLAISYS_PER_ISA(linear)(llaisys::cpu::LinearArgs{dtype, M, N, K, out, x, weight, bias});
    });
}
#endif
