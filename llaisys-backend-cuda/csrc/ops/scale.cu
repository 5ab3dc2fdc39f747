// scale: out = x * factor element-wise, in f32 (factor rounded to f32), rounded once to the dtype (Gemma's
// embedding scale). A grid-stride loop; out may be x (each element is read, then written, by one thread).
#include "../common/context.h"
#include "../common/dtype.cuh"
#include "../common/launch.h"

namespace llaisys::cuda {
namespace {

template <class T>
__global__ void scale_kernel(int64_t n, float factor, T* out, const T* x) {
    const int64_t stride = int64_t(gridDim.x) * blockDim.x;
    for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride)
        out[i] = from_float<T>(to_float(x[i]) * factor);
}

}  // namespace
}  // namespace llaisys::cuda

int LLAISYS_FN(scale)(int device, void* stream, int dtype, int64_t n, double factor, void* out, const void* x) {
    using namespace llaisys::cuda;
    return guard("scale", [&] {
        StreamContext& s = stream_context(device, stream);
        dispatch_float(dtype, [&](auto tag) {
            using T = decltype(tag);
            if (n <= 0) return;
            constexpr int kThreads = 256;
            const unsigned blocks = blocks_for(n, kThreads, int64_t(device_context(s.device).sm_count) * 8);
            auto kernel = &scale_kernel<T>;
            LLAISYS_LAUNCH(kernel, blocks, kThreads, 0, s.stream, n, float(factor), static_cast<T*>(out),
                           static_cast<const T*>(x));
        });
    });
}
