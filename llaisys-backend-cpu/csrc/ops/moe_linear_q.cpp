// moe_linear_q: out[m, j] = x_mj @ w_e^T for e = experts[m, j], each expert's weight w_e in linear_q's blocks of
// one format (Q8_0, Q4_0, Q4_1, Q4_K, Q6_K of block_formats.h: a GGUF file's stacked experts as stored):
//     weight [E, NB, G * F::kWeightBytes] uint8, scales [E, NB, G * F::kScaleBytes] uint8: expert e's at [e]
// computed by the grouped block linear of moe_blocks.h (each output bit for bit linear_q's for its row and
// expert). This file holds each build's instances and the exported entry point.
#include "../common/api.h"
#include "moe_blocks.h"

LLAISYS_DECLARE_PER_ISA(void moe_linear_q(const MoeBlockArgs& args))

namespace llaisys::cpu::LLAISYS_ISA {

void moe_linear_q(const MoeBlockArgs& a) {
    with_qformat(a.fmt, [&](auto format) { moe_block_linear<decltype(format)>(a); });
}

}  // namespace llaisys::cpu::LLAISYS_ISA

#if defined(LLAISYS_ISA_PORTABLE)  // the exported entry point, compiled once
int LLAISYS_FN(moe_linear_q)(int device, void* stream, int dtype, int fmt, int64_t M, int64_t k, int64_t E,
                             int64_t N, int64_t K, int x_per_slot, void* out, const void* x, const void* weight,
                             const void* scales, const void* experts) {
    (void)device;
    return llaisys::launch("moe_linear_q", stream, [=] {
        llaisys::require_float_dtype(dtype);
        llaisys::cpu::require_qformat(fmt);
        const int64_t* ids = static_cast<const int64_t*>(experts);
        llaisys::check_expert_ids(ids, M, k, E);
        if (M == 0 || k == 0 || N == 0) return;  // nothing to compute
        LLAISYS_PER_ISA(moe_linear_q)(llaisys::cpu::MoeBlockArgs{
            dtype, fmt, M, k, E, N, K, x_per_slot != 0, out, x, static_cast<const uint8_t*>(weight),
            static_cast<const uint8_t*>(scales), ids});
    });
}
#endif
