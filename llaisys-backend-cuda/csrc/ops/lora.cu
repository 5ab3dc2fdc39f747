// lora_shrink / lora_expand: batched LoRA adapters, Punica's SGMV (backend.h):
//     shrink  h[m, r] = scales[s] * (x[m, :] . a[s, r, :])          s = adapters[m]; h[m, :] = 0 where s = -1
//     expand  out[m, n] = round(out[m, n] + sum over r ascending of h[m, r] * b[s, r, n])   rows with s = -1 untouched
//
// shrink: a CUDA block per (row, tile of kShrinkRTile r), kShrinkWarps warps; a warp owns one (row, r) at a time:
// lane l chains k = l, l + WARP_SIZE, ... with fmaf in order, warp_sum adds the lanes (a fixed butterfly), then times
// the scale. expand: a CUDA block per (row, tile of kExpandThreads n), a thread per n: one fmaf chain over r = 0 ..
// R - 1 from 0, then one f32 add to out's value, rounded once. So each output's arithmetic depends on K (or R) and
// WARP_SIZE only, never on M, the other rows or the grid (batch invariance). The rows of a segment (consecutive
// rows of one adapter) read the same a[s] / b[s] rows, which their blocks find in L2.
// An adapter outside [-1, S) leaves its row unwritten and is recorded as a kernel error (LLAISYS_INVALID_ARGUMENT
// at the next synchronizing call); when there is nothing to compute (R or N = 0) a check kernel still looks.
#include "../common/context.h"
#include "../common/dtype.cuh"
#include "../common/launch.h"
#include "../common/reduce.cuh"

namespace llaisys::cuda {
namespace {

constexpr int kShrinkWarps = 4;     // warps per shrink block
constexpr int kShrinkRTile = 8;     // r per shrink block
constexpr int kExpandThreads = 256; // n per expand block
constexpr int64_t kMaxGridY = 65535;
constexpr int64_t kMaxRowBlocks = int64_t(1) << 20;  // blocks over rows (a grid-stride loop does the rest)

__device__ __forceinline__ bool bad_adapter(int64_t s, int64_t S) { return s < -1 || s >= S; }

template <class T>
__global__ void __launch_bounds__(kShrinkWarps * WARP_SIZE)
lora_shrink_kernel(int64_t M, int64_t K, int64_t R, int64_t S, float* h, const T* x, const T* a,
                   const int64_t* adapters, const float* scales, KernelErrorRecord* error) {
    const int warp = warp_id(), lane = lane_id();
    const int64_t tiles = (R + kShrinkRTile - 1) / kShrinkRTile;
    for (int64_t m = blockIdx.x; m < M; m += gridDim.x) {
        const int64_t s = adapters[m];
        if (bad_adapter(s, S)) {
            if (threadIdx.x == 0 && blockIdx.y == 0) report_kernel_error(error, kLoraShrinkAdapterOutOfRange, s, m, S);
            continue;
        }
        for (int64_t t = blockIdx.y; t < tiles; t += gridDim.y) {
            const int64_t r1 = (t + 1) * kShrinkRTile < R ? (t + 1) * kShrinkRTile : R;
            for (int64_t r = t * kShrinkRTile + warp; r < r1; r += kShrinkWarps) {
                float v = 0.0f;
                if (s >= 0) {
                    const T* xr = x + m * K;
                    const T* ar = a + (s * R + r) * K;
                    float acc = 0.0f;
                    for (int64_t k = lane; k < K; k += WARP_SIZE) acc = fmaf(to_float(xr[k]), to_float(ar[k]), acc);
                    v = scales[s] * warp_sum(acc);
                }
                if (lane == 0) h[m * R + r] = v;
            }
        }
    }
}

template <class T>
__global__ void __launch_bounds__(kExpandThreads)
lora_expand_kernel(int64_t M, int64_t R, int64_t N, int64_t S, T* out, const float* h, const T* b,
                   const int64_t* adapters, KernelErrorRecord* error) {
    for (int64_t m = blockIdx.x; m < M; m += gridDim.x) {
        const int64_t s = adapters[m];
        if (bad_adapter(s, S)) {
            if (threadIdx.x == 0 && blockIdx.y == 0) report_kernel_error(error, kLoraExpandAdapterOutOfRange, s, m, S);
            continue;
        }
        if (s < 0) continue;  // untouched
        const float* hr = h + m * R;
        const T* bs = b + s * R * N;
        for (int64_t n = int64_t(blockIdx.y) * kExpandThreads + threadIdx.x; n < N;
             n += int64_t(gridDim.y) * kExpandThreads) {
            float acc = 0.0f;
            for (int64_t r = 0; r < R; ++r) acc = fmaf(hr[r], to_float(bs[r * N + n]), acc);
            out[m * N + n] = from_float<T>(to_float(out[m * N + n]) + acc);
        }
    }
}

// Only the check (nothing to compute: R or N is 0).
__global__ void lora_check_kernel(int64_t M, int64_t S, const int64_t* adapters, int code, KernelErrorRecord* error) {
    const int64_t stride = int64_t(gridDim.x) * blockDim.x;
    for (int64_t m = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; m < M; m += stride)
        if (bad_adapter(adapters[m], S)) report_kernel_error(error, code, adapters[m], m, S);
}

void launch_check(StreamContext& s, int64_t M, int64_t S, const void* adapters, int code) {
    auto kernel = &lora_check_kernel;
    LLAISYS_LAUNCH(kernel, blocks_for(M, 256, int64_t(device_context(s.device).sm_count) * 4), 256, 0, s.stream, M,
                   S, static_cast<const int64_t*>(adapters), code, device_context(s.device).error_device);
}

unsigned grid_rows(int64_t M) { return unsigned(M < kMaxRowBlocks ? M : kMaxRowBlocks); }
unsigned grid_y(int64_t tiles) { return unsigned(tiles < kMaxGridY ? tiles : kMaxGridY); }

}  // namespace
}  // namespace llaisys::cuda

int LLAISYS_FN(lora_shrink)(int device, void* stream, int dtype, int64_t M, int64_t K, int64_t R, int64_t S, void* h,
                            const void* x, const void* a, const void* adapters, const void* scales) {
    using namespace llaisys::cuda;
    return guard("lora_shrink", [&] {
        StreamContext& s = stream_context(device, stream);
        dispatch_float(dtype, [&](auto tag) {
            using T = decltype(tag);
            if (M <= 0) return;
            if (R <= 0) return launch_check(s, M, S, adapters, kLoraShrinkAdapterOutOfRange);
            auto kernel = &lora_shrink_kernel<T>;
            const dim3 grid(grid_rows(M), grid_y((R + kShrinkRTile - 1) / kShrinkRTile));
            LLAISYS_LAUNCH(kernel, grid, kShrinkWarps * WARP_SIZE, 0, s.stream, M, K, R, S, static_cast<float*>(h),
                           static_cast<const T*>(x), static_cast<const T*>(a), static_cast<const int64_t*>(adapters),
                           static_cast<const float*>(scales), device_context(s.device).error_device);
        });
    });
}

int LLAISYS_FN(lora_expand)(int device, void* stream, int dtype, int64_t M, int64_t R, int64_t N, int64_t S, void* out,
                            const void* h, const void* b, const void* adapters) {
    using namespace llaisys::cuda;
    return guard("lora_expand", [&] {
        StreamContext& s = stream_context(device, stream);
        dispatch_float(dtype, [&](auto tag) {
            using T = decltype(tag);
            if (M <= 0) return;
            if (R <= 0 || N <= 0) return launch_check(s, M, S, adapters, kLoraExpandAdapterOutOfRange);
            auto kernel = &lora_expand_kernel<T>;
            const dim3 grid(grid_rows(M), grid_y((N + kExpandThreads - 1) / kExpandThreads));
            LLAISYS_LAUNCH(kernel, grid, kExpandThreads, 0, s.stream, M, R, N, S, static_cast<T*>(out),
                           static_cast<const float*>(h), static_cast<const T*>(b),
                           static_cast<const int64_t*>(adapters), device_context(s.device).error_device);
        });
    });
}
