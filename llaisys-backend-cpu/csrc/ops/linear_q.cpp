// linear_q: linear with weights in one of the block formats of block_formats.h (Q8_0, Q4_0, Q4_1, Q4_K, Q6_K:
// llaisys' blocks of 16 rows holding exactly the values of the ggml type of the same name; llaisys.ops.quant
// makes them), computed by the block linear of linear_blocks.h. This file holds each build's instances and the
// exported entry point.
#include <string>

#include "../common/api.h"
#include "linear_blocks.h"

namespace llaisys::cpu::LLAISYS_ISA {

void linear_q(const BlockLinearArgs& a) {
    with_qformat(a.fmt, [&](auto format) { block_linear<decltype(format)>(a); });
}

}  // namespace llaisys::cpu::LLAISYS_ISA

#if defined(LLAISYS_ISA_PORTABLE)  // the exported entry point, compiled once
namespace llaisys::cpu {

// An unknown format code is NOT_SUPPORTED (before anything is read).
void require_qformat(int fmt) {
    bool known = false;
    portable::with_qformat(fmt, [&](auto) { known = true; });
    if (!known) throw NotSupported("unsupported weight format code " + std::to_string(fmt));
}

}  // namespace llaisys::cpu

int LLAISYS_FN(linear_q)(int device, void* stream, int dtype, int fmt, int64_t M, int64_t N, int64_t K, void* out,
                         const void* x, const void* weight, const void* scales, const void* bias) {
    (void)device;
    return llaisys::launch("linear_q", stream, [=] {
        llaisys::require_float_dtype(dtype);
        llaisys::cpu::require_qformat(fmt);
        if (M == 0 || N == 0) return;  // nothing to compute
        LLAISYS_PER_ISA(linear_q)(llaisys::cpu::BlockLinearArgs{dtype, fmt, M, N, K, out, x,
                                                                static_cast<const uint8_t*>(weight),
                                                                static_cast<const uint8_t*>(scales), bias});
    });
}
#endif
