// moe_linear_i8: out[m, j] = x_mj @ w_e^T for e = experts[m, j], each expert's weight w_e in linear_i8's int8
// blocks (backend.h; format I8 of block_formats.h):
//     weight [E, NB, G, 8, 16, 4] int8, scales [E, NB, G, 16] bf16: expert e's blocks at [e]
// computed by the grouped block linear of moe_blocks.h (each output bit for bit linear_i8's for its row and
// expert). This file holds each build's instance and the exported entry point.
#include "../common/api.h"
#include "moe_blocks.h"

LLAISYS_DECLARE_PER_ISA(void moe_linear_i8(const MoeBlockArgs& args))

namespace llaisys::cpu::LLAISYS_ISA {

void moe_linear_i8(const MoeBlockArgs& a) { moe_block_linear<FormatI8>(a); }

}  // namespace llaisys::cpu::LLAISYS_ISA

#if defined(LLAISYS_ISA_PORTABLE)  // the exported entry point, compiled once
int LLAISYS_FN(moe_linear_i8)(int device, void* stream, int dtype, int64_t M, int64_t k, int64_t E, int64_t N,
                              int64_t K, int x_per_slot, void* out, const void* x, const void* weight,
                              const void* scales, const void* experts) {
    (void)device;
    return llaisys::launch("moe_linear_i8", stream, [=] {
        llaisys::require_float_dtype(dtype);
        const int64_t* ids = static_cast<const int64_t*>(experts);
        llaisys::check_expert_ids(ids, M, k, E);
        if (M == 0 || k == 0 || N == 0) return;  // nothing to compute
        LLAISYS_PER_ISA(moe_linear_i8)(llaisys::cpu::MoeBlockArgs{
            dtype, 0, M, k, E, N, K, x_per_slot != 0, out, x, static_cast<const uint8_t*>(weight),
            static_cast<const uint8_t*>(scales), ids});
    });
}
#endif
