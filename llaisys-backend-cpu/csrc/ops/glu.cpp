// Gated linear units, out = act(gate) * up element-wise over n elements, computed in f32 and rounded once
// to the dtype:
//   swiglu      act = silu(g) = g / (1 + exp(-g))                                         (Qwen2, Llama, ...)
//   geglu_tanh  act = gelu_tanh(g) = g / 2 * (1 + tanh(z)), z = sqrt(2 / pi) * (g + 0.044715 g^3)   (Gemma)
// gelu_tanh is computed as g / (1 + exp(-2 z)) (the same function: (1 + tanh z) / 2 = 1 / (1 + exp(-2 z))),
// which keeps its relative accuracy where tanh z nears -1 and 1 + tanh z would cancel. Both through vexp
// (~2 ulp). LLAISYS_NUMERICS_HF rounds act(gate) to the dtype before the product, as HF's act_fn(gate) * up
// does for f16 / bf16 (for f32 both modes are the same).
#include "../common/api.h"
#include "../simd/simd.h"

LLAISYS_DECLARE_PER_ISA(void swiglu(int dtype, bool hf, int64_t n, void* out, const void* gate, const void* up))
LLAISYS_DECLARE_PER_ISA(void geglu_tanh(int dtype, bool hf, int64_t n, void* out, const void* gate, const void* up))

namespace llaisys::cpu::LLAISYS_ISA {

struct Silu {
    static LLAISYS_ALWAYS_INLINE Vec apply(Vec g) { return g / (Vec::set1(1.0f) + vexp(Vec::zero() - g)); }
};

struct GeluTanh {
    // -2 z = g * (-2 sqrt(2 / pi) - 2 sqrt(2 / pi) 0.044715 g^2)
    static LLAISYS_ALWAYS_INLINE Vec apply(Vec g) {
        const Vec minus_two_z = g * fmadd(Vec::set1(-0.0713548162726008f), g * g, Vec::set1(-1.5957691216057308f));
        return g / (Vec::set1(1.0f) + vexp(minus_two_z));
    }
};

template <class Act>
static void glu(int dtype, bool hf, int64_t n, void* out, const void* gate, const void* up) {
    with_float_type(dtype, [&](auto tag) {
        using T = decltype(tag);
        T* o = static_cast<T*>(out);
        const T *g = static_cast<const T*>(gate), *u = static_cast<const T*>(up);
        if (hf)
            map2(n, o, g, u, [](Vec gv, Vec uv) { return uv * Act::apply(gv).template round_to<T>(); });
        else
            map2(n, o, g, u, [](Vec gv, Vec uv) { return uv * Act::apply(gv); });
    });
}

void swiglu(int dtype, bool hf, int64_t n, void* out, const void* gate, const void* up) {
    glu<Silu>(dtype, hf, n, out, gate, up);
}

void geglu_tanh(int dtype, bool hf, int64_t n, void* out, const void* gate, const void* up) {
    glu<GeluTanh>(dtype, hf, n, out, gate, up);
}

}  // namespace llaisys::cpu::LLAISYS_ISA

#if defined(LLAISYS_ISA_PORTABLE)  // the exported entry points, compiled once
int LLAISYS_FN(swiglu)(int device, void* stream, int dtype, int numerics, int64_t n, void* out, const void* gate,
                       const void* up) {
    (void)device;
    return llaisys::launch("swiglu", stream, [=] {
        const bool hf = llaisys::hf_numerics(numerics);
        llaisys::require_float_dtype(dtype);
        LLAISYS_PER_ISA(swiglu)(dtype, hf, n, out, gate, up);
    });
}

int LLAISYS_FN(geglu_tanh)(int device, void* stream, int dtype, int numerics, int64_t n, void* out, const void* gate,
                           const void* up) {
    (void)device;
    return llaisys::launch("geglu_tanh", stream, [=] {
        const bool hf = llaisys::hf_numerics(numerics);
        llaisys::require_float_dtype(dtype);
        LLAISYS_PER_ISA(geglu_tanh)(dtype, hf, n, out, gate, up);
    });
}
#endif
