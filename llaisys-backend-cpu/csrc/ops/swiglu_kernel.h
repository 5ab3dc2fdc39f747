// swiglu: out = up * gate / (1 + exp(-gate)), element-wise, computed in f32 and rounded once to the
// dtype; instantiated once per ISA (swiglu.cpp, swiglu_avx2.cpp, swiglu_avx512.cpp). The SIMD paths use
// vexp (vec.h, ~2 ulp f32); the portable path std::exp.
#pragma once

#include "vec.h"

LLAISYS_DECLARE_PER_ISA(void swiglu(int dtype, int64_t n, void* out, const void* gate, const void* up))

namespace llaisys::cpu::LLAISYS_ISA {

inline Vec swiglu_f32(Vec gate, Vec up) {
    return up * (gate / (Vec::set1(1.0f) + vexp(Vec::zero() - gate)));
}

inline void swiglu_kernel(int dtype, int64_t n, void* out, const void* gate, const void* up) {
    with_float_type(dtype, [&](auto tag) {
        using T = decltype(tag);
        map2(n, static_cast<T*>(out), static_cast<const T*>(gate), static_cast<const T*>(up), swiglu_f32);
    });
}

}  // namespace llaisys::cpu::LLAISYS_ISA
