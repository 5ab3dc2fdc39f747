// add: c = a + b, element-wise over n elements of f32 / f16 / bf16. f16 / bf16 are widened to f32, added,
// and rounded to nearest even once (as torch does).
#include "../common/api.h"
#include "../simd/simd.h"

LLAISYS_DECLARE_PER_ISA(void add(int dtype, int64_t n, void* c, const void* a, const void* b))

namespace llaisys::cpu::LLAISYS_ISA {

void add(int dtype, int64_t n, void* c, const void* a, const void* b) {
    with_float_type(dtype, [&](auto tag) {
        using T = decltype(tag);
        map2(n, static_cast<T*>(c), static_cast<const T*>(a), static_cast<const T*>(b),
             [](Vec x, Vec y) { return x + y; });
    });
}

}  // namespace llaisys::cpu::LLAISYS_ISA

#if defined(LLAISYS_ISA_PORTABLE)  // the exported entry point, compiled once
int LLAISYS_FN(add)(int device, void* stream, int dtype, int64_t n, void* c, const void* a, const void* b) {
    (void)device;
    return llaisys::launch("add", stream, [=] {
        llaisys::require_float_dtype(dtype);
        LLAISYS_PER_ISA(add)(dtype, n, c, a, b);
    });
}
#endif
