// linear_i8: linear with int8 weights per group of 32 (format I8 of block_formats.h: q int8 in [-127, 127] and a
// bf16 scale per row and group, in blocks of 16 rows; llaisys.ops.int8 makes them), computed by the block linear
// of linear_blocks.h. This file holds each build's instance and the exported entry point.
#include "../common/api.h"
#include "linear_blocks.h"

namespace llaisys::cpu::LLAISYS_ISA {

void linear_i8(const BlockLinearArgs& a) { block_linear<FormatI8>(a); }

}  // namespace llaisys::cpu::LLAISYS_ISA

#if defined(LLAISYS_ISA_PORTABLE)  // the knob and the exported entry point, compiled once
namespace llaisys::cpu {

bool linear_vnni_allowed() {
    static const bool allowed = env_switch_on("LLAISYS_CPU_LINEAR_VNNI");
    return allowed;
}

}  // namespace llaisys::cpu

int LLAISYS_FN(linear_i8)(int device, void* stream, int dtype, int64_t M, int64_t N, int64_t K, void* out,
                          const void* x, const void* weight, const void* scales, const void* bias) {
    (void)device;
    return llaisys::launch("linear_i8", stream, [=] {
        llaisys::require_float_dtype(dtype);
        if (M == 0 || N == 0) return;  // nothing to compute
        LLAISYS_PER_ISA(linear_i8)(llaisys::cpu::BlockLinearArgs{dtype, 0, M, N, K, out, x,
                                                                 static_cast<const uint8_t*>(weight),
                                                                 static_cast<const uint8_t*>(scales), bias});
    });
}
#endif
