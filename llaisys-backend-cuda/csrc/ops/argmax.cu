// argmax: one block scans vals [n] (a vocabulary of 152k is ~10 us of one SM's bandwidth, and one block
// needs no second pass or scratch memory); the value is copied, not recomputed, so it is exact.
#include <algorithm>

#include "../common/context.h"
#include "../common/launch.h"
#include "argmax.cuh"

namespace llaisys::cuda {
namespace {

template <class T>
__global__ void argmax_kernel(int64_t n, int64_t* max_idx, T* max_val, const T* vals) {
    __shared__ BlockScratch<ArgBest> scratch;
    const ArgBest best = block_argmax(vals, n, scratch);
    if (threadIdx.x == 0) {
        *max_idx = best.index;
        *max_val = vals[best.index];
    }
}

}  // namespace
}  // namespace llaisys::cuda

int LLAISYS_FN(argmax)(int device, void* stream, int dtype, int64_t n, void* max_idx, void* max_val, const void* vals) {
    using namespace llaisys::cuda;
    return guard("argmax", [&] {
        StreamContext& s = stream_context(device, stream);
        if (n <= 0) throw InvalidArgument("argmax of an empty array");
        dispatch_float(dtype, [&](auto tag) {
            using T = decltype(tag);
            // whole warps, at most 1024 and at most what the device allows
            const int limit = std::min(kMaxBlockThreads, device_context(device).max_threads_per_block) / WARP_SIZE;
            const int threads = int(std::min<int64_t>((n + WARP_SIZE - 1) / WARP_SIZE, limit)) * WARP_SIZE;
            auto kernel = &argmax_kernel<T>;
            LLAISYS_LAUNCH(kernel, 1, threads, 0, s.stream, n, static_cast<int64_t*>(max_idx),
                           static_cast<T*>(max_val), static_cast<const T*>(vals));
        });
    });
}
