// linear: out[M, N] = x[M, K] @ weight[N, K]^T + bias[N] (see linear_dot.h for the algorithm). This file holds
// the exported entry point; linear_tiles.h each build's tile configuration (also moe_linear's).
#include <cstring>
#include <string>

#include "../common/api.h"
#include "linear_tiles.h"

namespace llaisys::cpu::LLAISYS_ISA {

void linear(const LinearArgs& a) {
    with_float_type(a.dtype, [&](auto tag) {
        using T = decltype(tag);
        if (a.K == 0) return fill_rows_with_bias(static_cast<T*>(a.out), static_cast<const T*>(a.bias), a.M, a.N);
#if defined(LLAISYS_BF16_PAIR_CHAIN)
        if constexpr (std::is_same_v<T, bf16_t>) {
            if (has_feature(Feature::kBf16Pairs) && linear_bf16dot_allowed())
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
