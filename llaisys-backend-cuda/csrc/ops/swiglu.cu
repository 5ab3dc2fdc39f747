// swiglu: out = up * gate / (1 + exp(-gate)), in f32 (expf, not the fast-math __expf), one rounding.
// LLAISYS_NUMERICS_HF rounds silu(gate) to the dtype before the product, as HF's act_fn(gate) * up does.
#include "elementwise.cuh"

namespace {
__device__ __forceinline__ float silu(float gate) { return gate / (1.0f + expf(-gate)); }

struct SwigluOp {
    template <class T>
    static __device__ __forceinline__ float apply(float gate, float up) { return up * silu(gate); }
};
struct SwigluHfOp {
    template <class T>
    static __device__ __forceinline__ float apply(float gate, float up) {
        return up * llaisys::cuda::round_to<T>(silu(gate));
    }
};
}  // namespace

int LLAISYS_FN(swiglu)(int device, void* stream, int dtype, int numerics, int64_t n, void* out, const void* gate,
                       const void* up) {
    using namespace llaisys::cuda;
    return guard("swiglu", [&] {
        const bool hf = hf_numerics(numerics);
        StreamContext& s = stream_context(device, stream);
        if (hf) launch_binary<SwigluHfOp>(s, dtype, n, out, gate, up);
        else launch_binary<SwigluOp>(s, dtype, n, out, gate, up);
    });
}
