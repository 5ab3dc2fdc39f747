// linear: out [M, N] = x [M, K] @ weight [N, K]^T + bias [N], f32 accumulation, one rounding.
//
// Batch invariant (the serving contract: a request's output does not depend on its batch): every output
// out[m, n] is computed by the same arithmetic whatever M is and wherever row m sits.
//  * f16 / bf16 on NVIDIA (sm_80+ code): tensor cores, linear_tc.cuh, whose reduction (16-wide k-tiles, at most
//    8 slices of K, each a chain of mma_sync, added in slice order) depends on K alone, for every M: decode
//    and prefill share it, so a row's bits never depend on the batch.
//  * f32, and every dtype on CoreX (whose WMMA is another API, compat.h) or where LLAISYS_CUDA_LINEAR_SIMT=1:
//    the SIMT kernel below. K is cut into chunks of kChunk elements; lane j of a warp owns chunks j,
//    j + WARP_SIZE, j + 2 * WARP_SIZE, ... and keeps one f32 FMA chain over its chunks in order (k ascending
//    inside a chunk); the lanes' sums are added by warp_sum's fixed butterfly, then the bias, then one
//    rounding. A warp computes a tile of MR rows x NR columns, chosen by M: the tile decides which outputs
//    share the loads, never how one is summed.
// The two are different arithmetics: which one a process uses is fixed when it starts (dtype, device build,
// LLAISYS_CUDA_LINEAR_SIMT read once), never by M.
//
// cuBLAS picks its kernel (tiling, split-K) by shape, so its rows can change in the last bits with M
// (seen on an H200). It is used only where LLAISYS_CUDA_LINEAR_CUBLAS_ROWS=R is set, for calls with at
// least R rows (long prompts: no batch invariance). Row-major out is column-major
// out^T = weight @ x^T; with a bias, a small kernel first fills out with it and the GEMM adds (beta = 1).
#include <climits>
#include <mutex>
#include <type_traits>
#include <vector>

#include "../common/context.h"
#include "../common/dtype.cuh"
#include "../common/launch.h"
#include "../common/reduce.cuh"
#include "linear.cuh"
#include "linear_tc.cuh"

namespace llaisys::cuda {
namespace {

constexpr int kLinearThreads = 128;   // 4 warps (2 on CoreX) per block

template <class T, int MR, int NR>
__global__ void __launch_bounds__(kLinearThreads) linear_rows_kernel(int64_t M, int64_t N, int64_t K, T* out,
                                                                     const T* x, const T* w, const T* bias) {
    const int lane = lane_id();
    const int64_t warps_per_block = blockDim.x / WARP_SIZE;
    const int64_t col_tiles = (N + NR - 1) / NR, tiles = col_tiles * ((M + MR - 1) / MR);
    for (int64_t tile = int64_t(blockIdx.x) * warps_per_block + warp_id(); tile < tiles;
         tile += int64_t(gridDim.x) * warps_per_block) {
        const int64_t m0 = tile / col_tiles * MR, n0 = tile % col_tiles * NR;  // a block's warps share rows
        // rows / columns past the end repeat the last one (loaded, summed, never stored)
        const T* xr[MR];
        const T* wr[NR];
        bool x_aligned[MR], w_aligned[NR];
#pragma unroll
        for (int i = 0; i < MR; ++i) {
            xr[i] = x + (m0 + i < M ? m0 + i : M - 1) * K;
            x_aligned[i] = chunk_aligned(xr[i], K);
        }
#pragma unroll
        for (int j = 0; j < NR; ++j) {
            wr[j] = w + (n0 + j < N ? n0 + j : N - 1) * K;
            w_aligned[j] = chunk_aligned(wr[j], K);
        }
        float sums[MR][NR];
        warp_dot_tile<T, MR, NR>(xr, x_aligned, wr, w_aligned, K, sums);
#pragma unroll
        for (int i = 0; i < MR; ++i)
#pragma unroll
            for (int j = 0; j < NR; ++j) {
                const float sum = sums[i][j];
                const int64_t m = m0 + i, n = n0 + j;
                if (lane == (i * NR + j) % WARP_SIZE && m < M && n < N)
                    out[m * N + n] = from_float<T>(bias ? sum + to_float(bias[n]) : sum);
            }
    }
}

template <class T, int MR, int NR>
void launch_rows(StreamContext& s, int64_t M, int64_t N, int64_t K, void* out, const void* x, const void* w,
                 const void* bias) {
    const int64_t tiles = (N + NR - 1) / NR * ((M + MR - 1) / MR);
    const int64_t warps_per_block = kLinearThreads / WARP_SIZE;
    const unsigned blocks = blocks_for(tiles, int(warps_per_block), int64_t(device_context(s.device).sm_count) * 64);
    auto kernel = &linear_rows_kernel<T, MR, NR>;
    LLAISYS_LAUNCH(kernel, blocks, kLinearThreads, 0, s.stream, M, N, K, static_cast<T*>(out),
                   static_cast<const T*>(x), static_cast<const T*>(w), static_cast<const T*>(bias));
}

// out[m, :] = bias (or 0 when bias is NULL) for every row m.
template <class T>
__global__ void fill_rows_kernel(int64_t rows, int64_t cols, T* out, const T* bias) {
    const int64_t total = rows * cols, stride = int64_t(gridDim.x) * blockDim.x;
    for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < total; i += stride)
        out[i] = bias ? bias[i % cols] : from_float<T>(0.0f);
}

template <class T> constexpr cudaDataType kCudaType = CUDA_R_32F;
template <> constexpr cudaDataType kCudaType<f16> = CUDA_R_16F;
template <> constexpr cudaDataType kCudaType<bf16> = CUDA_R_16BF;

template <class T>
void linear_cublas(StreamContext& s, int64_t M, int64_t N, int64_t K, void* out, const void* x, const void* w,
                   const void* bias) {
    if (M > INT_MAX || N > INT_MAX || K > INT_MAX)
        throw NotSupported("cuBLAS takes dimensions below 2^31, got M=" + std::to_string(M) + " N=" +
                           std::to_string(N) + " K=" + std::to_string(K));
    if (bias) {
        auto fill = &fill_rows_kernel<T>;
        const unsigned blocks = blocks_for(M * N, 256, int64_t(device_context(s.device).sm_count) * 8);
        LLAISYS_LAUNCH(fill, blocks, 256, 0, s.stream, M, N, static_cast<T*>(out), static_cast<const T*>(bias));
    }
    const float alpha = 1.0f, beta = bias ? 1.0f : 0.0f;
    CUBLAS_CHECK(cublasGemmEx(s.cublas, CUBLAS_OP_T, CUBLAS_OP_N, int(N), int(M), int(K), &alpha, w, kCudaType<T>,
                              int(K), x, kCudaType<T>, int(K), &beta, out, kCudaType<T>, int(N), CUDA_R_32F,
                              CUBLAS_GEMM_DEFAULT));
}

// LLAISYS_CUDA_LINEAR_CUBLAS_ROWS: calls with at least this many rows go to cuBLAS (unset or 0: none).
int64_t cublas_rows() {
    static const int64_t rows = env_positive("LLAISYS_CUDA_LINEAR_CUBLAS_ROWS");
    return rows;
}


}  // namespace
}  // namespace llaisys::cuda

#if LLAISYS_HAS_WMMA
namespace llaisys::cuda::tc {

bool enabled(int device) {
    static const bool simt = env_positive("LLAISYS_CUDA_LINEAR_SIMT") > 0;
    static std::mutex mutex;
    static std::vector<signed char> known;  // per device: -1 not asked yet, 0 no, 1 yes
    if (simt) return false;
    std::lock_guard<std::mutex> lock(mutex);
    if (size_t(device) >= known.size()) known.resize(size_t(device) + 1, -1);
    if (known[size_t(device)] < 0) known[size_t(device)] = available<bf16>() && available<f16>();
    return known[size_t(device)] > 0;
}

}  // namespace llaisys::cuda::tc
#endif

int LLAISYS_FN(linear)(int device, void* stream, int dtype, int64_t M, int64_t N, int64_t K, void* out, const void* x,
                       const void* weight, const void* bias) {
    using namespace llaisys::cuda;
    return guard("linear", [&] {
        StreamContext& s = stream_context(device, stream);
        if (M <= 0 || N <= 0) return;
        dispatch_float(dtype, [&](auto tag) {
            using T = decltype(tag);
            if (K > 0 && cublas_rows() > 0 && M >= cublas_rows())
                return linear_cublas<T>(s, M, N, K, out, x, weight, bias);
#if LLAISYS_HAS_WMMA
            if constexpr (!std::is_same_v<T, float>)
                if (K > 0 && tc::enabled(device)) return tc::launch<T>(s, M, N, K, out, x, weight, bias);
#endif
            if (M == 1) return launch_rows<T, 1, 2>(s, M, N, K, out, x, weight, bias);  // decode: weight-bound
            if (M == 2) return launch_rows<T, 2, 2>(s, M, N, K, out, x, weight, bias);
            if (M <= 4) return launch_rows<T, 4, 2>(s, M, N, K, out, x, weight, bias);
            launch_rows<T, 8, 4>(s, M, N, K, out, x, weight, bias);
        });
    });
}
