// Gated linear units, out = act(gate) * up element-wise, in f32 (expf, not the fast-math __expf), one rounding:
//   swiglu      act = silu(g) = g / (1 + exp(-g))
//   geglu_tanh  act = gelu_tanh(g) = g / 2 * (1 + tanh(z)), z = sqrt(2 / pi) * (g + 0.044715 g^3), computed as
//               g / (1 + exp(-2 z)) (the same function, without 1 + tanh z's cancellation where tanh z nears -1)
// LLAISYS_NUMERICS_HF rounds act(gate) to the dtype before the product, as HF's act_fn(gate) * up does.
#include "elementwise.cuh"

namespace {
__device__ __forceinline__ float silu(float gate) { return gate / (1.0f + expf(-gate)); }

__device__ __forceinline__ float gelu_tanh(float gate) {
    const float minus_two_z = gate * fmaf(-0.0713548162726008f, gate * gate, -1.5957691216057308f);
    return gate / (1.0f + expf(minus_two_z));
}

struct Silu {
    static __device__ __forceinline__ float act(float gate) { return silu(gate); }
};
struct GeluTanh {
    static __device__ __forceinline__ float act(float gate) { return gelu_tanh(gate); }
};

template <class Act>
struct GluOp {
    template <class T>
    static __device__ __forceinline__ float apply(float gate, float up) { return up * Act::act(gate); }
};
template <class Act>
struct GluHfOp {
    template <class T>
    static __device__ __forceinline__ float apply(float gate, float up) {
        return up * llaisys::cuda::round_to<T>(Act::act(gate));
    }
};

template <class Act>
int glu(const char* name, int device, void* stream, int dtype, int numerics, int64_t n, void* out,
        const void* gate, const void* up) {
    using namespace llaisys::cuda;
    return guard(name, [&] {
        const bool hf = hf_numerics(numerics);
        StreamContext& s = stream_context(device, stream);
        if (hf) launch_binary<GluHfOp<Act>>(s, dtype, n, out, gate, up);
        else launch_binary<GluOp<Act>>(s, dtype, n, out, gate, up);
    });
}
}  // namespace

int LLAISYS_FN(swiglu)(int device, void* stream, int dtype, int numerics, int64_t n, void* out, const void* gate,
                       const void* up) {
    return glu<Silu>("swiglu", device, stream, dtype, numerics, n, out, gate, up);
}

int LLAISYS_FN(geglu_tanh)(int device, void* stream, int dtype, int numerics, int64_t n, void* out, const void* gate,
                           const void* up) {
    return glu<GeluTanh>("geglu_tanh", device, stream, dtype, numerics, n, out, gate, up);
}
