// swiglu: out = up * gate / (1 + exp(-gate)), element-wise over n elements, computed in f32 (vexp, ~2 ulp)
// and rounded once to the dtype. LLAISYS_NUMERICS_HF rounds silu(gate) to the dtype before the product, as
// HF's act_fn(gate) * up does for f16 / bf16 (for f32 both modes are the same).
#include "../common/api.h"
#include "../simd/simd.h"

LLAISYS_DECLARE_PER_ISA(void swiglu(int dtype, bool hf, int64_t n, void* out, const void* gate, const void* up))

namespace llaisys::cpu::LLAISYS_ISA {

static LLAISYS_ALWAYS_INLINE Vec silu(Vec g) { return g / (Vec::set1(1.0f) + vexp(Vec::zero() - g)); }

void swiglu(int dtype, bool hf, int64_t n, void* out, const void* gate, const void* up) {
    with_float_type(dtype, [&](auto tag) {
        using T = decltype(tag);
        T* o = static_cast<T*>(out);
        const T *g = static_cast<const T*>(gate), *u = static_cast<const T*>(up);
        if (hf)
            map2(n, o, g, u, [](Vec gv, Vec uv) { return uv * silu(gv).template round_to<T>(); });
        else
            map2(n, o, g, u, [](Vec gv, Vec uv) { return uv * silu(gv); });
    });
}

}  // namespace llaisys::cpu::LLAISYS_ISA

#if defined(LLAISYS_ISA_PORTABLE)  // the exported entry point, compiled once
int LLAISYS_FN(swiglu)(int device, void* stream, int dtype, int numerics, int64_t n, void* out, const void* gate,
                       const void* up) {
    (void)device;
    return llaisys::launch("swiglu", stream, [=] {
        const bool hf = llaisys::hf_numerics(numerics);
        llaisys::require_float_dtype(dtype);
        LLAISYS_PER_ISA(swiglu)(dtype, hf, n, out, gate, up);
    });
}
#endif
