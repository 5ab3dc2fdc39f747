// Warp and block reductions. Widths and masks come from WARP_SIZE / kFullMask (compat.h), so the same
// code reduces over 32 lanes on NVIDIA and 64 on CoreX. Every thread of the block must call the block
// forms (they contain __syncthreads).
#pragma once

#include "../compat.h"

namespace llaisys::cuda {

__device__ __forceinline__ int lane_id() { return int(threadIdx.x) % WARP_SIZE; }
__device__ __forceinline__ int warp_id() { return int(threadIdx.x) / WARP_SIZE; }

template <class T>
__device__ __forceinline__ T warp_sum(T v) {
#pragma unroll
    for (int offset = WARP_SIZE / 2; offset > 0; offset /= 2) v += __shfl_xor_sync(kFullMask, v, offset, WARP_SIZE);
    return v;
}

__device__ __forceinline__ float warp_max(float v) {
#pragma unroll
    for (int offset = WARP_SIZE / 2; offset > 0; offset /= 2)
        v = fmaxf(v, __shfl_xor_sync(kFullMask, v, offset, WARP_SIZE));
    return v;
}

// Scratch a block reduction needs: one slot per warp of the largest block.
template <class T>
struct BlockScratch {
    T slot[kMaxBlockThreads / WARP_SIZE];
};

// The sum over every thread of the block, returned to every thread. blockDim.x is a multiple of WARP_SIZE.
template <class T>
__device__ T block_sum(T v, BlockScratch<T>& scratch) {
    v = warp_sum(v);
    __syncthreads();  // the scratch may still be read by a previous reduction
    if (lane_id() == 0) scratch.slot[warp_id()] = v;
    __syncthreads();
    const int warps = int(blockDim.x) / WARP_SIZE;
    T total = scratch.slot[0];
    for (int w = 1; w < warps; ++w) total += scratch.slot[w];  // same order in every thread: same result
    return total;
}

__device__ __forceinline__ float block_max(float v, BlockScratch<float>& scratch) {
    v = warp_max(v);
    __syncthreads();
    if (lane_id() == 0) scratch.slot[warp_id()] = v;
    __syncthreads();
    const int warps = int(blockDim.x) / WARP_SIZE;
    float m = scratch.slot[0];
    for (int w = 1; w < warps; ++w) m = fmaxf(m, scratch.slot[w]);
    return m;
}

}  // namespace llaisys::cuda
