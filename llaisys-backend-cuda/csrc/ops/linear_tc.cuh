// The tensor-core linear: out [M, N] = x [M, K] @ weight [N, K]^T + bias, f16 / bf16 in, f32 accumulate, through
// WMMA fragments of 16 x 16 x 16 (compat.h: LLAISYS_HAS_WMMA; NVIDIA sm_80 and newer).
//
// Batch invariant by construction: the arithmetic of an output is fixed by K alone (THE REDUCTION below), so a
// row of out is the same bits whatever M is and wherever the row sits; M only chooses which kernel (and tile)
// computes which outputs.
//
// THE REDUCTION. K is cut into T = ceil(K / 16) k-tiles (the last one zero padded) and the tiles into
// S = min(kSlices, T) slices of consecutive tiles, slice s holding tiles [s T / S, (s + 1) T / S). A slice's sum is
// a chain of mma_sync over its tiles in order, from a zero accumulator; the output is
//     round(((((0 + slice_0) + slice_1) + ...) + slice_{S-1}) + bias)
// with f32 additions and one rounding to the dtype. Every output of every call is computed so; within one
// mma_sync the tensor core's own summation is the same for every element (the GPU check compares rows across M
// bit for bit: host execution cannot show the tensor cores' rounding).
//
// Two kernels compute it:
//  * rows_kernel (few rows, decode): a block per 16 x 16 tile of out and a warp per slice, so that a decode
//    step's weights are streamed by 8 warps per tile at once; each warp stages 64 k of its x and weight rows in
//    its own shared memory (rows past M and k past K as zeros), the slices' partial tiles meet in shared memory
//    and are added in slice order.
//  * tile_kernel (prefill): a block per 64 x 64 tile of out, 4 warps of 32 x 32; 32 k of x and of the weights
//    double-buffered in shared memory; each warp keeps its slice's accumulators and its running totals and adds
//    the one to the other at every slice boundary.
// f32 stays on the SIMT kernel (linear.cuh), which is batch invariant in its own way.
#pragma once

#include <type_traits>

#include "../common/context.h"
#include "../common/dtype.cuh"
#include "../common/launch.h"
#include "../common/reduce.cuh"
#include "linear.cuh"

#if LLAISYS_HAS_WMMA
namespace llaisys::cuda::tc {

namespace wmma = nvcuda::wmma;

constexpr int kTile = 16;   // WMMA m = n = k
constexpr int kSlices = 8;  // the most slices K is summed in (THE REDUCTION)

template <class T> struct WmmaType;
template <> struct WmmaType<f16> { using type = __half; };
template <> struct WmmaType<bf16> { using type = __nv_bfloat16; };

// THE REDUCTION's slices of K.
struct Slices {
    int64_t tiles;  // T
    int64_t count;  // S
    __host__ __device__ int64_t begin(int64_t s) const { return tiles * s / count; }
};
__host__ __device__ inline Slices slices_of(int64_t K) {
    const int64_t tiles = (K + kTile - 1) / kTile;
    return Slices{tiles, tiles < kSlices ? tiles : kSlices};
}

// 8 consecutive 16-bit elements of `row` from k0 as raw bits: one 16-byte load where the row allows it, else
// element by element; zeros past K and for rows that do not exist (row == nullptr).
template <class T>
__device__ __forceinline__ Pack<uint16_t, kChunk> load_raw(const T* row, int64_t k0, int64_t K, bool aligned) {
    Pack<uint16_t, kChunk> p;
    if (row && aligned && k0 + kChunk <= K) {
        p = *reinterpret_cast<const Pack<uint16_t, kChunk>*>(row + k0);
    } else {
        const uint16_t* bits = reinterpret_cast<const uint16_t*>(row);
#pragma unroll
        for (int e = 0; e < kChunk; ++e) p.v[e] = row && k0 + e < K ? bits[k0 + e] : uint16_t(0);
    }
    return p;
}

template <class T>
__device__ __forceinline__ T store_rounded(float total, const T* bias, int64_t n) {
    return from_float<T>(bias ? total + to_float(bias[n]) : total);
}

// ---- rows_kernel -------------------------------------------------------------------------------------------

constexpr int kRowsThreads = kSlices * WARP_SIZE;  // a warp per slice
constexpr int kStageTiles = 4;                     // k-tiles a warp stages at a time (64 k)
constexpr int kStageK = kStageTiles * kTile;
constexpr int kStageLd = kStageK + 8;  // elements per staged row: 16 bytes of padding against bank conflicts
constexpr int kStagePacks = kTile * kStageK / kChunk;  // 8-element packs per staged matrix (128)

struct alignas(32) WarpStage {
    uint16_t x[kTile][kStageLd];  // rows m0.. of x
    uint16_t w[kTile][kStageLd];  // rows n0.. of the weights
};
static_assert(sizeof(WarpStage) >= kTile * kTile * sizeof(float), "a warp's slice sum is parked in its stage");
static_assert(kStagePacks % WARP_SIZE == 0, "every lane stages the same number of packs");

// One warp's staging of k-tiles [t, t + kStageTiles) of 16 rows of x and 16 weight rows (a null row is zeros).
// Two steps are loaded into registers ahead (buffers 0 and 1, by turns), so that two steps of loads are in flight
// while the tensor cores work on the staged one: a decode-sized call is a stream of weights, and latency is
// hidden only by bytes in flight.
template <class T>
struct WarpStager {
    static constexpr int kPerLane = kStagePacks / WARP_SIZE;
    const T* xrow[kPerLane];
    const T* wrow[kPerLane];
    bool x_aligned[kPerLane], w_aligned[kPerLane];
    int row[kPerLane], col[kPerLane];  // the pack's place in the stage
    Pack<uint16_t, kChunk> xv[2][kPerLane], wv[2][kPerLane];

    __device__ WarpStager(const T* const (&x)[kTile], const T* const (&w)[kTile], int64_t K) {
#pragma unroll
        for (int i = 0; i < kPerLane; ++i) {
            const int p = lane_id() + i * WARP_SIZE;
            row[i] = p / (kStageK / kChunk);
            col[i] = p % (kStageK / kChunk) * kChunk;
            xrow[i] = x[row[i]];
            wrow[i] = w[row[i]];
            x_aligned[i] = xrow[i] && chunk_aligned(xrow[i], K);
            w_aligned[i] = wrow[i] && chunk_aligned(wrow[i], K);
        }
    }
    template <int B>
    __device__ void fetch(int64_t tile, int64_t K) {
#pragma unroll
        for (int i = 0; i < kPerLane; ++i) {
            const int64_t k0 = tile * kTile + col[i];
            xv[B][i] = load_raw(xrow[i], k0, K, x_aligned[i]);
            wv[B][i] = load_raw(wrow[i], k0, K, w_aligned[i]);
        }
    }
    template <int B>
    __device__ void store(WarpStage& stage) const {
#pragma unroll
        for (int i = 0; i < kPerLane; ++i) {
            *reinterpret_cast<Pack<uint16_t, kChunk>*>(&stage.x[row[i]][col[i]]) = xv[B][i];
            *reinterpret_cast<Pack<uint16_t, kChunk>*>(&stage.w[row[i]][col[i]]) = wv[B][i];
        }
    }
};

using Accumulator = wmma::fragment<wmma::accumulator, kTile, kTile, kTile, float>;

// One warp: slices [s0, s1) of THE REDUCTION for the 16 x 16 tile of x rows `x` by weight rows `w` (null rows
// are zeros), staged through `stage`; after each slice, on_slice(s, acc) gets the slice's sum (a fragment; the
// stage is free then). Every lane of the warp calls it. rows_kernel runs one slice per warp; a kernel that
// cannot split K (moe_linear's warp per tile of gathered rows) runs all of them, adding each to its totals in
// order: the same arithmetic, so the same bits as linear.
template <class T, class OnSlice>
__device__ void warp_slices(const T* const (&x)[kTile], const T* const (&w)[kTile], int64_t K, WarpStage& stage,
                            int64_t s0, int64_t s1, OnSlice&& on_slice) {
    using W = typename WmmaType<T>::type;
    const Slices sl = slices_of(K);
    WarpStager<T> stager(x, w, K);
    for (int64_t s = s0; s < s1; ++s) {
        const int64_t t_begin = sl.begin(s), t_end = sl.begin(s + 1);
        Accumulator acc;
        wmma::fill_fragment(acc, 0.0f);
        // the staged step at t from buffer B; the step two ahead is fetched into B meanwhile
        auto step = [&](auto buffer, int64_t t) {
            constexpr int B = decltype(buffer)::value;
            stager.template store<B>(stage);
            __syncwarp();
            if (t + 2 * kStageTiles < t_end) stager.template fetch<B>(t + 2 * kStageTiles, K);
            const int tiles = int(t_end - t < kStageTiles ? t_end - t : kStageTiles);
            for (int i = 0; i < tiles; ++i) {
                wmma::fragment<wmma::matrix_a, kTile, kTile, kTile, W, wmma::row_major> a;  // x: [m][k]
                wmma::fragment<wmma::matrix_b, kTile, kTile, kTile, W, wmma::col_major> b;  // weights: [n][k]
                wmma::load_matrix_sync(a, reinterpret_cast<const W*>(&stage.x[0][i * kTile]), kStageLd);
                wmma::load_matrix_sync(b, reinterpret_cast<const W*>(&stage.w[0][i * kTile]), kStageLd);
                wmma::mma_sync(acc, a, b, acc);
            }
            __syncwarp();  // the stage is read before the next step overwrites it
        };
        stager.template fetch<0>(t_begin, K);
        if (t_begin + kStageTiles < t_end) stager.template fetch<1>(t_begin + kStageTiles, K);
        for (int64_t t = t_begin; t < t_end; t += 2 * kStageTiles) {
            step(std::integral_constant<int, 0>{}, t);
            if (t + kStageTiles < t_end) step(std::integral_constant<int, 1>{}, t + kStageTiles);
        }
        on_slice(s, acc);
    }
}

// grid (ceil(N / 16), ceil(M / 16)), kRowsThreads threads: out tile rows m0 = 16 blockIdx.y, columns n0 = 16 blockIdx.x;
// warp s computes slice s, the slices meet in shared memory and are added in order.
template <class T>
__global__ void __launch_bounds__(kRowsThreads) rows_kernel(int64_t M, int64_t N, int64_t K, T* out, const T* x,
                                                            const T* w, const T* bias) {
#if !defined(__CUDA_ARCH__) || __CUDA_ARCH__ >= 800
    __shared__ WarpStage stages[kSlices];
    const int64_t m0 = int64_t(blockIdx.y) * kTile, n0 = int64_t(blockIdx.x) * kTile;
    const Slices sl = slices_of(K);
    const int slice = warp_id();
    WarpStage& stage = stages[slice];
    if (slice < sl.count) {
        const T* xrows[kTile];
        const T* wrows[kTile];
#pragma unroll
        for (int i = 0; i < kTile; ++i) {
            xrows[i] = m0 + i < M ? x + (m0 + i) * K : nullptr;
            wrows[i] = n0 + i < N ? w + (n0 + i) * K : nullptr;
        }
        warp_slices(xrows, wrows, K, stage, slice, slice + 1, [&](int64_t, const Accumulator& acc) {
            wmma::store_matrix_sync(reinterpret_cast<float*>(&stage), acc, kTile, wmma::mem_row_major);
        });
    }
    __syncthreads();
    // the slices in order: one thread per output of the tile
    for (int e = int(threadIdx.x); e < kTile * kTile; e += int(blockDim.x)) {
        const int i = e / kTile, j = e % kTile;
        const int64_t m = m0 + i, n = n0 + j;
        float total = 0.0f;
        for (int s = 0; s < sl.count; ++s) total += reinterpret_cast<const float*>(&stages[s])[e];
        if (m < M && n < N) out[m * N + n] = store_rounded(total, bias, n);
    }
#endif
}

// ---- tile_kernel -------------------------------------------------------------------------------------------

constexpr int kTileM = 64, kTileN = 64;  // a block's tile of out
constexpr int kTileWarpsM = 2, kTileWarpsN = 2;
constexpr int kTileThreads = kTileWarpsM * kTileWarpsN * WARP_SIZE;
constexpr int kFragsM = kTileM / kTileWarpsM / kTile, kFragsN = kTileN / kTileWarpsN / kTile;  // 2 x 2 per warp
constexpr int kTileStageTiles = 2;  // k-tiles per stage (32 k)
constexpr int kTileStageK = kTileStageTiles * kTile;
constexpr int kTileLd = kTileStageK + 8;
constexpr int kTileEpilogueLd = kFragsN * kTile + 4;  // floats per row of a warp's parked 32 x 32 results

struct alignas(32) TileStage {
    uint16_t x[kTileM][kTileLd];
    uint16_t w[kTileN][kTileLd];
};
struct alignas(32) TileShared {
    union {
        TileStage stage[2];  // double buffer
        float result[kTileWarpsM * kTileWarpsN][kFragsM * kTile][kTileEpilogueLd];
    };
};

// The block's cooperative staging of k-tiles [t, t + kTileStageTiles) of its 64 x rows and 64 weight rows.
template <class T>
struct TileStager {
    static constexpr int kPacks = (kTileM + kTileN) * kTileStageK / kChunk;
    static constexpr int kPerThread = kPacks / kTileThreads;
    static_assert(kPacks % kTileThreads == 0, "every thread stages the same number of packs");
    const T* src[kPerThread];
    bool aligned[kPerThread], is_x[kPerThread];
    int row[kPerThread], col[kPerThread];
    Pack<uint16_t, kChunk> v[kPerThread];

    __device__ TileStager(const T* x, const T* w, int64_t M, int64_t N, int64_t K, int64_t m0, int64_t n0) {
        constexpr int kPacksPerRow = kTileStageK / kChunk;
#pragma unroll
        for (int i = 0; i < kPerThread; ++i) {
            const int p = int(threadIdx.x) + i * kTileThreads;
            is_x[i] = p < kTileM * kPacksPerRow;
            const int q = is_x[i] ? p : p - kTileM * kPacksPerRow;
            row[i] = q / kPacksPerRow;
            col[i] = q % kPacksPerRow * kChunk;
            if (is_x[i]) src[i] = m0 + row[i] < M ? x + (m0 + row[i]) * K : nullptr;
            else src[i] = n0 + row[i] < N ? w + (n0 + row[i]) * K : nullptr;
            aligned[i] = src[i] && chunk_aligned(src[i], K);
        }
    }
    __device__ void fetch(int64_t tile, int64_t K) {
#pragma unroll
        for (int i = 0; i < kPerThread; ++i) v[i] = load_raw(src[i], tile * kTile + col[i], K, aligned[i]);
    }
    __device__ void store(TileStage& stage) const {
#pragma unroll
        for (int i = 0; i < kPerThread; ++i) {
            uint16_t* dst = is_x[i] ? &stage.x[row[i]][col[i]] : &stage.w[row[i]][col[i]];
            *reinterpret_cast<Pack<uint16_t, kChunk>*>(dst) = v[i];
        }
    }
};

// grid (ceil(N / 64), ceil(M / 64)), kTileThreads threads.
template <class T>
__global__ void __launch_bounds__(kTileThreads) tile_kernel(int64_t M, int64_t N, int64_t K, T* out, const T* x,
                                                            const T* w, const T* bias) {
#if !defined(__CUDA_ARCH__) || __CUDA_ARCH__ >= 800
    using W = typename WmmaType<T>::type;
    __shared__ TileShared sh;
    const int64_t m0 = int64_t(blockIdx.y) * kTileM, n0 = int64_t(blockIdx.x) * kTileN;
    const int warp = warp_id(), wm = warp / kTileWarpsN, wn = warp % kTileWarpsN;
    const Slices sl = slices_of(K);
    Accumulator acc[kFragsM][kFragsN], total[kFragsM][kFragsN];
#pragma unroll
    for (int i = 0; i < kFragsM; ++i)
#pragma unroll
        for (int j = 0; j < kFragsN; ++j) {
            wmma::fill_fragment(acc[i][j], 0.0f);
            wmma::fill_fragment(total[i][j], 0.0f);
        }
    int64_t next_slice = 1, boundary = sl.begin(1);  // the first tile of the next slice
    TileStager<T> stager(x, w, M, N, K, m0, n0);
    stager.fetch(0, K);
    stager.store(sh.stage[0]);
    __syncthreads();
    for (int64_t t0 = 0, step = 0; t0 < sl.tiles; t0 += kTileStageTiles, ++step) {
        const bool more = t0 + kTileStageTiles < sl.tiles;
        if (more) stager.fetch(t0 + kTileStageTiles, K);
        const TileStage& stage = sh.stage[step & 1];
        for (int i = 0; i < kTileStageTiles && t0 + i < sl.tiles; ++i) {
            if (t0 + i == boundary) {  // a slice ends: into the totals, in slice order
#pragma unroll
                for (int a = 0; a < kFragsM; ++a)
#pragma unroll
                    for (int b = 0; b < kFragsN; ++b) {
#pragma unroll
                        for (int e = 0; e < acc[a][b].num_elements; ++e) total[a][b].x[e] += acc[a][b].x[e];
                        wmma::fill_fragment(acc[a][b], 0.0f);
                    }
                boundary = sl.begin(++next_slice);
            }
            wmma::fragment<wmma::matrix_a, kTile, kTile, kTile, W, wmma::row_major> fa[kFragsM];
            wmma::fragment<wmma::matrix_b, kTile, kTile, kTile, W, wmma::col_major> fb[kFragsN];
#pragma unroll
            for (int a = 0; a < kFragsM; ++a)
                wmma::load_matrix_sync(fa[a], reinterpret_cast<const W*>(&stage.x[(wm * kFragsM + a) * kTile][i * kTile]),
                                       kTileLd);
#pragma unroll
            for (int b = 0; b < kFragsN; ++b)
                wmma::load_matrix_sync(fb[b], reinterpret_cast<const W*>(&stage.w[(wn * kFragsN + b) * kTile][i * kTile]),
                                       kTileLd);
#pragma unroll
            for (int a = 0; a < kFragsM; ++a)
#pragma unroll
                for (int b = 0; b < kFragsN; ++b) wmma::mma_sync(acc[a][b], fa[a], fb[b], acc[a][b]);
        }
        if (more) stager.store(sh.stage[(step + 1) & 1]);
        __syncthreads();
    }
    // the last slice, then the warp's 32 x 32 totals through shared memory (the stages are free now)
    float (*result)[kTileEpilogueLd] = sh.result[warp];
#pragma unroll
    for (int a = 0; a < kFragsM; ++a)
#pragma unroll
        for (int b = 0; b < kFragsN; ++b) {
#pragma unroll
            for (int e = 0; e < acc[a][b].num_elements; ++e) total[a][b].x[e] += acc[a][b].x[e];
            wmma::store_matrix_sync(&result[a * kTile][b * kTile], total[a][b], kTileEpilogueLd, wmma::mem_row_major);
        }
    __syncwarp();
    constexpr int kWarpRows = kFragsM * kTile, kWarpCols = kFragsN * kTile;
    for (int e = lane_id(); e < kWarpRows * kWarpCols; e += WARP_SIZE) {
        const int i = e / kWarpCols, j = e % kWarpCols;
        const int64_t m = m0 + wm * kWarpRows + i, n = n0 + wn * kWarpCols + j;
        if (m < M && n < N) out[m * N + n] = store_rounded(result[i][j], bias, n);
    }
#endif
}

// ---- launch --------------------------------------------------------------------------------------------------

// Calls with at most this many rows go to rows_kernel (a tile of 16 rows per block row); more to tile_kernel.
// Either gives the same bits: the choice is speed only (to be measured on the GPU: benchmarks/linear_gpu.py).
constexpr int64_t kRowsKernelMaxM = 32;

template <class T>
void launch(StreamContext& s, int64_t M, int64_t N, int64_t K, void* out, const void* x, const void* w,
            const void* bias) {
    if (M <= kRowsKernelMaxM) {
        auto kernel = &rows_kernel<T>;
        const dim3 grid(unsigned((N + kTile - 1) / kTile), unsigned((M + kTile - 1) / kTile));
        LLAISYS_LAUNCH(kernel, grid, kRowsThreads, 0, s.stream, M, N, K, static_cast<T*>(out),
                       static_cast<const T*>(x), static_cast<const T*>(w), static_cast<const T*>(bias));
    } else {
        auto kernel = &tile_kernel<T>;
        const dim3 grid(unsigned((N + kTileN - 1) / kTileN), unsigned((M + kTileM - 1) / kTileM));
        LLAISYS_LAUNCH(kernel, grid, kTileThreads, 0, s.stream, M, N, K, static_cast<T*>(out),
                       static_cast<const T*>(x), static_cast<const T*>(w), static_cast<const T*>(bias));
    }
}

// Whether f16 / bf16 linears on `device` (current) take these kernels (linear.cu): the code the device runs for
// them was built for sm_80+ (available(), asked once per device) and LLAISYS_CUDA_LINEAR_SIMT=1 (read once, for
// comparisons) does not ask for the SIMT kernel. A kernel that must give linear's bits (moe_linear) asks the
// same question.
bool enabled(int device);

// Whether the code the runtime runs on the current device for these kernels was generated for sm_80 or newer:
// code for an older architecture (an older build's SASS, or its PTX compiled by the driver for this GPU:
// ptxVersion) has WMMA-free stubs, since their bodies need __CUDA_ARCH__ >= 800.
template <class T>
bool available() {
    cudaFuncAttributes rows{}, tile{};
    if (cudaFuncGetAttributes(&rows, reinterpret_cast<const void*>(&rows_kernel<T>)) != cudaSuccess ||
        cudaFuncGetAttributes(&tile, reinterpret_cast<const void*>(&tile_kernel<T>)) != cudaSuccess) {
        (void)cudaGetLastError();
        return false;
    }
    return rows.binaryVersion >= 80 && rows.ptxVersion >= 80 && tile.binaryVersion >= 80 && tile.ptxVersion >= 80;
}

}  // namespace llaisys::cuda::tc
#endif
