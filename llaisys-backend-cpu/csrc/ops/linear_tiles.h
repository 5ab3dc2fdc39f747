// Each build's register tiles and chains for linear_dot.h (sized to its vector registers), shared by linear and
// moe_linear so that both sum every dot product in the same order.
#pragma once

#include "linear_dot.h"

namespace llaisys::cpu::LLAISYS_ISA {

#if defined(LLAISYS_ISA_AVX512)
constexpr int kMR = 4, kNR = 4;  // 16 zmm accumulators + 4 x + 4 weight vectors of the 32 registers
using Chain = FmaChain<Vec16>;
#elif defined(LLAISYS_ISA_AVX2)
constexpr int kMR = 2, kNR = 4;  // 8 ymm accumulators + 2 x + 4 weight vectors of the 16 registers
using Chain = FmaChain<Vec8>;
#else
constexpr int kMR = 2, kNR = 2;  // (Vec8 is two SSE or NEON registers here)
using Chain = FmaChain<Vec8>;
#endif

#if defined(LLAISYS_BF16_PAIR_CHAIN)
// flatten: everything beneath is inlined here, in code built for the pair instructions (Bf16PairChain::step)
struct Bf16PairBlock {
    template <int NR>
    LLAISYS_TARGET_BF16_PAIRS __attribute__((flatten)) static void run(int64_t mc, const bf16_t* x, const bf16_t* w,
                                                                       int64_t n0, int64_t n1, int64_t K,
                                                                       const bf16_t* bias, bf16_t* out, int64_t N) {
        dot_block<Bf16PairChain, kMR, NR>(mc, x, w, n0, n1, K, bias, out, N);
    }
};
#endif

}  // namespace llaisys::cpu::LLAISYS_ISA
