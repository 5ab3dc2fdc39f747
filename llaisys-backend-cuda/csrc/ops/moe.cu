// Mixture of experts (backend.h): moe_router, moe_linear, moe_combine. Each row is computed on its own, so a
// row's result never depends on the other rows of the batch.
//
// moe_router: a thread per row. The top k in the order (logit descending, expert id ascending; NaN last):
// pick j is the best logit strictly after pick j - 1 in that order (k passes over the row, no arrays).
// moe_linear: a warp per (expert, tile of weight rows); it walks the (row, slot) pairs in order, takes those
// that chose its expert a tile at a time, and computes their tile with linear's own arithmetic, so that each
// output is the bits linear gives for that row and expert alone, whatever the batch: in f16 / bf16 where
// linear runs on tensor cores (tc::enabled), tc::warp_slices over all of linear's slices in order (linear_tc.cuh;
// 16 rows x 16 weight rows), else linear's SIMT tile warp_dot_tile (linear.cuh; kMR x kNR). An expert no row
// chose costs one scan of the ids and no weight read; a chosen one is read once per tile of rows that chose it
// (from L2 after the first).
// moe_combine: a thread per output, fmaf over the k slots in order.
#include <cmath>
#include <type_traits>

#include "../common/context.h"
#include "../common/dtype.cuh"
#include "../common/launch.h"
#include "../common/reduce.cuh"
#include "linear.cuh"
#include "linear_tc.cuh"
#include "moe_ids.cuh"

namespace llaisys::cuda {
namespace {

// The router's order: a before b when its logit is larger, or equal with a smaller id (NaN as -inf).
__device__ __forceinline__ float router_key(float logit) { return isnan(logit) ? -INFINITY : logit; }
__device__ __forceinline__ bool router_before(float la, int64_t a, float lb, int64_t b) {
    return la > lb || (la == lb && a < b);
}

template <class T>
__global__ void moe_router_kernel(int64_t M, int64_t E, int64_t k, bool normalize, T* weights, int64_t* experts,
                                  const T* logits) {
    const int64_t stride = int64_t(gridDim.x) * blockDim.x;
    for (int64_t m = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; m < M; m += stride) {
        const T* row = logits + m * E;
        float max = -INFINITY, sum = 0.0f;
        for (int64_t e = 0; e < E; ++e) max = fmaxf(max, to_float(row[e]));
        for (int64_t e = 0; e < E; ++e) sum += expf(to_float(row[e]) - max);
        // pass 0 sums the k picks' probabilities (for normalize), pass 1 writes them
        float top = 0.0f;
        for (int pass = 0; pass < 2; ++pass) {
            float prev = INFINITY;
            int64_t prev_id = -1;
            for (int64_t j = 0; j < k; ++j) {
                float best = 0.0f;
                int64_t id = -1;
                for (int64_t e = 0; e < E; ++e) {
                    const float key = router_key(to_float(row[e]));
                    if (router_before(prev, prev_id, key, e) && (id < 0 || router_before(key, e, best, id))) {
                        best = key;
                        id = e;
                    }
                }
                const float p = expf(to_float(row[id]) - max) / sum;
                if (pass == 0) {
                    top += p;
                } else {
                    experts[m * k + j] = id;
                    weights[m * k + j] = from_float<T>(normalize ? p / top : p);
                }
                prev = best;
                prev_id = id;
            }
        }
    }
}

constexpr int kMoeThreads = 128;  // 4 warps (2 on CoreX) per block
constexpr int kMR = 4, kNR = 2;   // a warp's tile: up to 4 (row, slot) pairs x 2 weight rows

template <class T>
__global__ void __launch_bounds__(kMoeThreads) moe_linear_kernel(int64_t pairs, int64_t k, int64_t E, int64_t N,
                                                                 int64_t K, bool x_per_slot, T* out, const T* x,
                                                                 const T* weight, const int64_t* experts) {
    const int lane = lane_id();
    const int64_t warps_per_block = blockDim.x / WARP_SIZE;
    const int64_t col_tiles = (N + kNR - 1) / kNR, tiles = E * col_tiles;
    for (int64_t tile = int64_t(blockIdx.x) * warps_per_block + warp_id(); tile < tiles;
         tile += int64_t(gridDim.x) * warps_per_block) {
        const int64_t e = tile / col_tiles, n0 = tile % col_tiles * kNR;
        const T* wr[kNR];
        bool w_aligned[kNR];
#pragma unroll
        for (int j = 0; j < kNR; ++j) {  // columns past N repeat the last one (summed, never stored)
            wr[j] = weight + (e * N + (n0 + j < N ? n0 + j : N - 1)) * K;
            w_aligned[j] = chunk_aligned(wr[j], K);
        }
        for (int64_t r = 0; r < pairs;) {
            int64_t rows[kMR];  // the next pairs that chose e (every lane reads the same ids)
            int count = 0;
            for (; r < pairs && count < kMR; ++r)
                if (experts[r] == e) rows[count++] = r;
            if (count == 0) break;
            const T* xr[kMR];
            bool x_aligned[kMR];
#pragma unroll
            for (int i = 0; i < kMR; ++i) {  // rows past count repeat the last one
                const int64_t pair = rows[i < count ? i : count - 1];
                xr[i] = x + (x_per_slot ? pair : pair / k) * K;
                x_aligned[i] = chunk_aligned(xr[i], K);
            }
            float sums[kMR][kNR];
            warp_dot_tile<T, kMR, kNR>(xr, x_aligned, wr, w_aligned, K, sums);
#pragma unroll
            for (int i = 0; i < kMR; ++i)
#pragma unroll
                for (int j = 0; j < kNR; ++j)
                    if (lane == (i * kNR + j) % WARP_SIZE && i < count && n0 + j < N)
                        out[rows[i] * N + n0 + j] = from_float<T>(sums[i][j]);
        }
    }
}

#if LLAISYS_HAS_WMMA
// moe_linear_kernel on tensor cores: the tile is 16 (row, slot) pairs x 16 weight rows, each output summed as
// linear sums it (all slices in order in this warp, each slice a chain of mma_sync), then rounded once.
template <class T>
__global__ void __launch_bounds__(kMoeThreads) moe_linear_tc_kernel(int64_t pairs, int64_t k, int64_t E, int64_t N,
                                                                    int64_t K, bool x_per_slot, T* out, const T* x,
                                                                    const T* weight, const int64_t* experts) {
    __shared__ tc::WarpStage stages[kMoeThreads / WARP_SIZE];
    tc::WarpStage& stage = stages[warp_id()];
    const int64_t warps_per_block = blockDim.x / WARP_SIZE;
    const int64_t col_tiles = (N + tc::kTile - 1) / tc::kTile, tiles = E * col_tiles;
    const tc::Slices sl = tc::slices_of(K);
    for (int64_t tile = int64_t(blockIdx.x) * warps_per_block + warp_id(); tile < tiles;
         tile += int64_t(gridDim.x) * warps_per_block) {
        const int64_t e = tile / col_tiles, n0 = tile % col_tiles * tc::kTile;
        const T* wr[tc::kTile];
#pragma unroll
        for (int j = 0; j < tc::kTile; ++j) wr[j] = n0 + j < N ? weight + (e * N + n0 + j) * K : nullptr;
        for (int64_t r = 0; r < pairs;) {
            int64_t rows[tc::kTile];  // the next pairs that chose e (every lane reads the same ids)
            int count = 0;
            for (; r < pairs && count < tc::kTile; ++r)
                if (experts[r] == e) rows[count++] = r;
            if (count == 0) break;
            const T* xr[tc::kTile];
#pragma unroll
            for (int i = 0; i < tc::kTile; ++i)
                xr[i] = i < count ? x + (x_per_slot ? rows[i] : rows[i] / k) * K : nullptr;
            tc::Accumulator total;
            nvcuda::wmma::fill_fragment(total, 0.0f);
            tc::warp_slices(xr, wr, K, stage, 0, sl.count, [&](int64_t, const tc::Accumulator& acc) {
                for (int i = 0; i < acc.num_elements; ++i) total.x[i] += acc.x[i];
            });
            float* sums = reinterpret_cast<float*>(&stage);  // [16][16], the stage is free after the slices
            nvcuda::wmma::store_matrix_sync(sums, total, tc::kTile, nvcuda::wmma::mem_row_major);
            __syncwarp();
            for (int idx = lane_id(); idx < tc::kTile * tc::kTile; idx += WARP_SIZE) {
                const int i = idx / tc::kTile, j = idx % tc::kTile;
                if (i < count && n0 + j < N) out[rows[i] * N + n0 + j] = from_float<T>(sums[idx]);
            }
            __syncwarp();  // read before the next tile stages over it
        }
    }
}
#endif

template <class T>
__global__ void moe_combine_kernel(int64_t M, int64_t k, int64_t N, T* out, const T* y, const T* weights) {
    const int64_t stride = int64_t(gridDim.x) * blockDim.x;
    for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < M * N; i += stride) {
        const int64_t m = i / N, n = i % N;
        float acc = 0.0f;
        for (int64_t j = 0; j < k; ++j) acc = fmaf(to_float(weights[m * k + j]), to_float(y[(m * k + j) * N + n]), acc);
        out[i] = from_float<T>(acc);
    }
}

}  // namespace
}  // namespace llaisys::cuda

int LLAISYS_FN(moe_router)(int device, void* stream, int dtype, int64_t M, int64_t E, int64_t k, int normalize,
                           void* weights, void* experts, const void* logits) {
    using namespace llaisys::cuda;
    return guard("moe_router", [&] {
        StreamContext& s = stream_context(device, stream);
        if (k < 1 || k > E)
            throw InvalidArgument("k = " + std::to_string(k) + " must be in [1, E = " + std::to_string(E) + "]");
        if (M <= 0) return;
        dispatch_float(dtype, [&](auto tag) {
            using T = decltype(tag);
            auto kernel = &moe_router_kernel<T>;
            const unsigned blocks = blocks_for(M, 64, int64_t(device_context(s.device).sm_count) * 4);
            LLAISYS_LAUNCH(kernel, blocks, 64, 0, s.stream, M, E, k, normalize != 0, static_cast<T*>(weights),
                           static_cast<int64_t*>(experts), static_cast<const T*>(logits));
        });
    });
}

int LLAISYS_FN(moe_linear)(int device, void* stream, int dtype, int64_t M, int64_t k, int64_t E, int64_t N,
                           int64_t K, int x_per_slot, void* out, const void* x, const void* weight,
                           const void* experts) {
    using namespace llaisys::cuda;
    return guard("moe_linear", [&] {
        StreamContext& s = stream_context(device, stream);
        const int64_t pairs = M * k;
        if (pairs <= 0) return;
        const auto* ids = static_cast<const int64_t*>(experts);
        auto check = &moe_check_ids_kernel;
        const int64_t sms = device_context(s.device).sm_count;
        LLAISYS_LAUNCH(check, blocks_for(pairs, 256, sms * 4), 256, 0, s.stream, pairs, k, E, ids,
                       device_context(s.device).error_device);
        if (N <= 0) return;
        dispatch_float(dtype, [&](auto tag) {
            using T = decltype(tag);
#if LLAISYS_HAS_WMMA
            if constexpr (!std::is_same_v<T, float>) {
                if (tc::enabled(device)) {  // linear's tensor-core arithmetic (linear.cu makes the same choice)
                    auto kernel = &moe_linear_tc_kernel<T>;
                    const int64_t tiles = E * ((N + tc::kTile - 1) / tc::kTile);
                    const unsigned blocks = blocks_for(tiles, kMoeThreads / WARP_SIZE, sms * 64);
                    LLAISYS_LAUNCH(kernel, blocks, kMoeThreads, 0, s.stream, pairs, k, E, N, K, x_per_slot != 0,
                                   static_cast<T*>(out), static_cast<const T*>(x), static_cast<const T*>(weight), ids);
                    return;
                }
            }
#endif
            auto kernel = &moe_linear_kernel<T>;
            const int64_t tiles = E * ((N + kNR - 1) / kNR);
            const unsigned blocks = blocks_for(tiles, kMoeThreads / WARP_SIZE, sms * 64);
            LLAISYS_LAUNCH(kernel, blocks, kMoeThreads, 0, s.stream, pairs, k, E, N, K, x_per_slot != 0,
                           static_cast<T*>(out), static_cast<const T*>(x), static_cast<const T*>(weight), ids);
        });
    });
}

int LLAISYS_FN(moe_combine)(int device, void* stream, int dtype, int64_t M, int64_t k, int64_t N, void* out,
                            const void* y, const void* weights) {
    using namespace llaisys::cuda;
    return guard("moe_combine", [&] {
        StreamContext& s = stream_context(device, stream);
        if (M <= 0 || N <= 0) return;
        dispatch_float(dtype, [&](auto tag) {
            using T = decltype(tag);
            auto kernel = &moe_combine_kernel<T>;
            const unsigned blocks = blocks_for(M * N, 256, int64_t(device_context(s.device).sm_count) * 8);
            LLAISYS_LAUNCH(kernel, blocks, 256, 0, s.stream, M, k, N, static_cast<T*>(out), static_cast<const T*>(y),
                           static_cast<const T*>(weights));
        });
    });
}
