// linear_i8: linear with int8 weights per group of 32 (see linear_i8.h). This file holds each build's choice
// of kernel and the exported entry point.
#include <cstring>

#include "../common/api.h"
#include "linear_i8.h"
#if !defined(LLAISYS_ISA_PORTABLE)
#include "linear_i8_simd.h"
#endif

namespace llaisys::cpu::LLAISYS_ISA {

void linear_i8(const LinearI8Args& a) {
    with_float_type(a.dtype, [&](auto tag) {
        using T = decltype(tag);
        if (a.K == 0) return fill_rows_with_bias(static_cast<T*>(a.out), static_cast<const T*>(a.bias), a.M, a.N);
        const QuantizedX xq = quantize_x(static_cast<const T*>(a.x), a.M, a.K);
#if defined(LLAISYS_ISA_PORTABLE)
        linear_i8_scalar<T>(a, xq);
#else
        with_i8_path([&](auto v, auto dot) { linear_i8_simd<decltype(v), decltype(dot), T>(a, xq); });
#endif
    });
}

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
        LLAISYS_PER_ISA(linear_i8)(llaisys::cpu::LinearI8Args{dtype, M, N, K, out, x,
                                                              static_cast<const int8_t*>(weight),
                                                              static_cast<const llaisys::bf16_t*>(scales), bias});
    });
}
#endif
