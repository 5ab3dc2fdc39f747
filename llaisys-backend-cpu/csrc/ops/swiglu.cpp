// swiglu: out = up * gate / (1 + exp(-gate)), element-wise over n elements, computed in f32 (vexp, ~2 ulp)
// and rounded once to the dtype.
#include "../common/api.h"
#include "../simd/simd.h"

LLAISYS_DECLARE_PER_ISA(void swiglu(int dtype, int64_t n, void* out, const void* gate, const void* up))

namespace llaisys::cpu::LLAISYS_ISA {

void swiglu(int dtype, int64_t n, void* out, const void* gate, const void* up) {
    with_float_type(dtype, [&](auto tag) {
        using T = decltype(tag);
        map2(n, static_cast<T*>(out), static_cast<const T*>(gate), static_cast<const T*>(up), [](Vec g, Vec u) {
            return u * (g / (Vec::set1(1.0f) + vexp(Vec::zero() - g)));
        });
    });
}

}  // namespace llaisys::cpu::LLAISYS_ISA

#if defined(LLAISYS_ISA_PORTABLE)  // the exported entry point, compiled once
int LLAISYS_FN(swiglu)(int device, void* stream, int dtype, int numerics, int64_t n, void* out, const void* gate,
                       const void* up) {
    (void)device, (void)stream;
    return llaisys::guard("swiglu", [&] {
        llaisys::require_exact_numerics(numerics);
        llaisys::require_float_dtype(dtype);
        LLAISYS_PER_ISA(swiglu)(dtype, n, out, gate, up);
    });
}
#endif
