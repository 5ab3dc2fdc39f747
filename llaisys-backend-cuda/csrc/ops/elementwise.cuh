// Element-wise kernels on contiguous arrays: out[i] = Op::apply<T>(a[i], b[i]) in f32, rounded to T when
// stored (T tells an op that rounds inside, as swiglu's hf mode does, what to round to).
// Where every pointer is 16-byte aligned, each thread moves 16 bytes per load / store; a grid-stride
// loop covers any n with a grid sized to the device. out may be a or b (each element is read, then written,
// by the same thread).
#pragma once

#include "../common/context.h"
#include "../common/dtype.cuh"
#include "../common/launch.h"

namespace llaisys::cuda {

template <class T, class Op, int N>
__global__ void binary_kernel(int64_t n, T* out, const T* a, const T* b) {
    const int64_t stride = int64_t(gridDim.x) * blockDim.x;
    const int64_t first = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
    const int64_t groups = n / N;
    for (int64_t g = first; g < groups; g += stride) {
        const Pack<T, N> x = reinterpret_cast<const Pack<T, N>*>(a)[g];
        const Pack<T, N> y = reinterpret_cast<const Pack<T, N>*>(b)[g];
        Pack<T, N> r;
#pragma unroll
        for (int i = 0; i < N; ++i) r.v[i] = from_float<T>(Op::template apply<T>(to_float(x.v[i]), to_float(y.v[i])));
        reinterpret_cast<Pack<T, N>*>(out)[g] = r;
    }
    for (int64_t i = groups * N + first; i < n; i += stride)  // the last n % N elements
        out[i] = from_float<T>(Op::template apply<T>(to_float(a[i]), to_float(b[i])));
}

template <class Op>
void launch_binary(StreamContext& s, int dtype, int64_t n, void* out, const void* a, const void* b) {
    if (n <= 0) return;
    const int64_t max_blocks = int64_t(device_context(s.device).sm_count) * 8;
    constexpr int kThreads = 256;
    dispatch_float(dtype, [&](auto tag) {
        using T = decltype(tag);
        constexpr int N = kPack<T>;
        auto* o = static_cast<T*>(out);
        const auto *x = static_cast<const T*>(a), *y = static_cast<const T*>(b);
        if (aligned16(out) && aligned16(a) && aligned16(b)) {
            auto kernel = &binary_kernel<T, Op, N>;
            LLAISYS_LAUNCH(kernel, blocks_for(n / N + 1, kThreads, max_blocks), kThreads, 0, s.stream, n, o, x, y);
        } else {
            auto kernel = &binary_kernel<T, Op, 1>;
            LLAISYS_LAUNCH(kernel, blocks_for(n, kThreads, max_blocks), kThreads, 0, s.stream, n, o, x, y);
        }
    });
}

}  // namespace llaisys::cuda
