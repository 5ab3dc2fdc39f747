// swiglu: out = up * gate / (1 + exp(-gate)), in f32 (expf, not the fast-math __expf), one rounding.
#include "elementwise.cuh"

namespace {
struct SwigluOp {
    static __device__ __forceinline__ float apply(float gate, float up) { return up * (gate / (1.0f + expf(-gate))); }
};
}  // namespace

int LLAISYS_FN(swiglu)(int device, void* stream, int dtype, int numerics, int64_t n, void* out, const void* gate,
                       const void* up) {
    using namespace llaisys::cuda;
    return guard("swiglu", [&] {
        require_exact_numerics(numerics);
        launch_binary<SwigluOp>(stream_context(device, stream), dtype, n, out, gate, up);
    });
}
