// add: c = a + b, element-wise, instantiated once per ISA (add.cpp, add_avx2.cpp, add_avx512.cpp).
// f16 / bf16 are widened to f32, added, and rounded to nearest even once (as torch does).
#pragma once

#include "vec.h"

LLAISYS_DECLARE_PER_ISA(void add(int dtype, int64_t n, void* c, const void* a, const void* b))

namespace llaisys::cpu::LLAISYS_ISA {

inline void add_kernel(int dtype, int64_t n, void* c, const void* a, const void* b) {
    with_float_type(dtype, [&](auto tag) {
        using T = decltype(tag);
        map2(n, static_cast<T*>(c), static_cast<const T*>(a), static_cast<const T*>(b),
             [](Vec x, Vec y) { return x + y; });
    });
}

}  // namespace llaisys::cpu::LLAISYS_ISA
