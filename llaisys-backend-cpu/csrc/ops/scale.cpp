// scale: out = x * factor, element-wise over n elements of f32 / f16 / bf16, in f32 (factor rounded to f32)
// and rounded to nearest even once (as torch's x * tensor(factor) in x's dtype does when factor is already a
// value of that dtype: Gemma's embedding scale).
#include "../common/api.h"
#include "../simd/simd.h"

LLAISYS_DECLARE_PER_ISA(void scale(int dtype, int64_t n, float factor, void* out, const void* x))

namespace llaisys::cpu::LLAISYS_ISA {

void scale(int dtype, int64_t n, float factor, void* out, const void* x) {
    with_float_type(dtype, [&](auto tag) {
        using T = decltype(tag);
        const Vec f = Vec::set1(factor);
        map1(n, static_cast<T*>(out), static_cast<const T*>(x), [f](Vec v) { return v * f; });
    });
}

}  // namespace llaisys::cpu::LLAISYS_ISA

#if defined(LLAISYS_ISA_PORTABLE)  // the exported entry point, compiled once
int LLAISYS_FN(scale)(int device, void* stream, int dtype, int64_t n, double factor, void* out, const void* x) {
    (void)device;
    return llaisys::launch("scale", stream, [=] {
        llaisys::require_float_dtype(dtype);
        LLAISYS_PER_ISA(scale)(dtype, n, float(factor), out, x);
    });
}
#endif
