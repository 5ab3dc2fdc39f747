// add: c = a + b over n elements (f32 sum, one rounding).
#include "elementwise.cuh"

namespace {
struct AddOp {
    template <class T>
    static __device__ __forceinline__ float apply(float a, float b) { return a + b; }
};
}  // namespace

int LLAISYS_FN(add)(int device, void* stream, int dtype, int64_t n, void* c, const void* a, const void* b) {
    using namespace llaisys::cuda;
    return guard("add", [&] { launch_binary<AddOp>(stream_context(device, stream), dtype, n, c, a, b); });
}
