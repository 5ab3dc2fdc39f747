// linear: out[M, N] = x[M, K] @ weight[N, K]^T + bias[N] (see linear_dot.h for the algorithm). This file holds
// each build's tile configuration (sized to its vector registers) and the exported entry point.
#include <cstring>
#include <string>

#include "../common/api.h"
#include "linear_dot.h"

namespace llaisys::cpu::LLAISYS_ISA {

#if defined(LLAISYS_ISA_AVX512)
constexpr int kMR = 4, kNR = 4;  // 16 zmm accumulators + 4 x + 4 weight vectors of the 32 registers
using Chain = FmaChain<Vec16>;

// flatten: everything beneath is inlined here, in code built for AVX512-BF16 (Bf16PairChain::step)
struct Bf16PairBlock {
    template <int NR>
    LLAISYS_TARGET_AVX512BF16 __attribute__((flatten)) static void run(int64_t mc, const bf16_t* x, const bf16_t* w,
                                                                       int64_t n0, int64_t n1, int64_t K,
                                                                       const bf16_t* bias, bf16_t* out, int64_t N) {
        dot_block<Bf16PairChain, kMR, NR>(mc, x, w, n0, n1, K, bias, out, N);
    }
};
#elif defined(LLAISYS_ISA_AVX2)
constexpr int kMR = 2, kNR = 4;  // 8 ymm accumulators + 2 x + 4 weight vectors of the 16 registers
using Chain = FmaChain<Vec8>;
#else
constexpr int kMR = 2, kNR = 2;  // (Vec8 is two SSE registers here)
using Chain = FmaChain<Vec8>;
#endif

void linear(const LinearArgs& a) {
    with_float_type(a.dtype, [&](auto tag) {
        using T = decltype(tag);
        if (a.K == 0) return fill_rows_with_bias(static_cast<T*>(a.out), static_cast<const T*>(a.bias), a.M, a.N);
#if defined(LLAISYS_ISA_AVX512)
        if constexpr (std::is_same_v<T, bf16_t>) {
            if (has_feature(Feature::kAvx512Bf16) && linear_bf16dot_allowed())
                return linear_dot<Bf16PairChain, kMR, kNR, T, Bf16PairBlock>(a);
        }
#endif
        linear_dot<Chain, kMR, kNR, T, DotBlock<Chain, kMR, T>>(a);
    });
}

}  // namespace llaisys::cpu::LLAISYS_ISA

#if defined(LLAISYS_ISA_PORTABLE)  // the knob and the exported entry point, compiled once
namespace llaisys::cpu {

bool linear_bf16dot_allowed() {
    static const bool allowed = env_switch_on("LLAISYS_CPU_LINEAR_BF16DOT");
    return allowed;
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
