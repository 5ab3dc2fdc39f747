// The dot products of linear (and moe_linear): a warp's tile of MR rows of x by NR weight rows, each output
// summed in one fixed order whatever the tile (linear.cu: lane j owns the chunks j, j + WARP_SIZE, ... of K,
// one f32 FMA chain over them in order; then warp_sum's fixed butterfly).
#pragma once

#include "../common/dtype.cuh"
#include "../common/reduce.cuh"

namespace llaisys::cuda {

constexpr int kChunk = 8;             // k elements per chunk: 16 bytes of f16 / bf16, 32 of f32

// The chunk of `row` at k0 as f32: one aligned load when the row allows it, else element by element;
// both give the same values, and elements past K are 0 (only the last chunk has any).
template <class T>
__device__ __forceinline__ void load_chunk(const T* row, int64_t k0, int64_t K, bool aligned, float (&v)[kChunk]) {
    if (aligned && k0 + kChunk <= K) {
        const Pack<T, kChunk> p = *reinterpret_cast<const Pack<T, kChunk>*>(row + k0);
#pragma unroll
        for (int e = 0; e < kChunk; ++e) v[e] = to_float(p.v[e]);
    } else {
#pragma unroll
        for (int e = 0; e < kChunk; ++e) v[e] = k0 + e < K ? to_float(row[k0 + e]) : 0.0f;
    }
}

template <class T>
__device__ __forceinline__ bool chunk_aligned(const T* row, int64_t K) {
    return K % kChunk == 0 && (reinterpret_cast<uintptr_t>(row) % sizeof(Pack<T, kChunk>)) == 0;
}

// sums[i][j] = x row xr[i] . weight row wr[j] over K (the same value in every lane of the warp).
template <class T, int MR, int NR>
__device__ __forceinline__ void warp_dot_tile(const T* const (&xr)[MR], const bool (&x_aligned)[MR],
                                              const T* const (&wr)[NR], const bool (&w_aligned)[NR], int64_t K,
                                              float (&sums)[MR][NR]) {
    const int lane = lane_id();
    const int64_t chunks = (K + kChunk - 1) / kChunk;
    float acc[MR][NR];
#pragma unroll
    for (int i = 0; i < MR; ++i)
#pragma unroll
        for (int j = 0; j < NR; ++j) acc[i][j] = 0.0f;

    LLAISYS_UNROLL_2
    for (int64_t c = lane; c < chunks; c += WARP_SIZE) {
        const int64_t k0 = c * kChunk;
        float wv[NR][kChunk];
#pragma unroll
        for (int j = 0; j < NR; ++j) load_chunk(wr[j], k0, K, w_aligned[j], wv[j]);
#pragma unroll
        for (int i = 0; i < MR; ++i) {
            float xv[kChunk];
            load_chunk(xr[i], k0, K, x_aligned[i], xv);
#pragma unroll
            for (int j = 0; j < NR; ++j)
#pragma unroll
                for (int e = 0; e < kChunk; ++e) acc[i][j] = fmaf(xv[e], wv[j][e], acc[i][j]);
        }
    }
#pragma unroll
    for (int i = 0; i < MR; ++i)
#pragma unroll
        for (int j = 0; j < NR; ++j) sums[i][j] = warp_sum(acc[i][j]);
}

}  // namespace llaisys::cuda
