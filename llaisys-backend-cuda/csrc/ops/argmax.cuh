// Block-wide argmax with torch.argmax's rules: NaN counts as the maximum, the first index wins among
// equals (-0 == +0). Used by argmax and by sample (greedy draws and the probability reference).
#pragma once

#include "../common/dtype.cuh"
#include "../common/reduce.cuh"

namespace llaisys::cuda {

struct ArgBest {
    float value;
    int64_t index;
};

// Is (va, ia) before (vb, ib) in argmax order?
__device__ __forceinline__ bool better(float va, int64_t ia, float vb, int64_t ib) {
    const bool na = isnan(va), nb = isnan(vb);
    if (na != nb) return na;
    if (!na && va != vb) return va > vb;
    return ia < ib;
}

__device__ __forceinline__ ArgBest warp_argmax(ArgBest b) {
#pragma unroll
    for (int offset = WARP_SIZE / 2; offset > 0; offset /= 2) {
        const float v = __shfl_xor_sync(kFullMask, b.value, offset, WARP_SIZE);
        const int64_t i = __shfl_xor_sync(kFullMask, b.index, offset, WARP_SIZE);
        if (better(v, i, b.value, b.index)) b = ArgBest{v, i};
    }
    return b;
}

// The best of every thread's `best`, returned to every thread; all threads of the block must call it.
__device__ __forceinline__ ArgBest block_best(ArgBest best, BlockScratch<ArgBest>& scratch) {
    best = warp_argmax(best);
    __syncthreads();
    if (lane_id() == 0) scratch.slot[warp_id()] = best;
    __syncthreads();
    best = scratch.slot[0];
    for (int w = 1; w < int(blockDim.x) / WARP_SIZE; ++w)
        if (better(scratch.slot[w].value, scratch.slot[w].index, best.value, best.index)) best = scratch.slot[w];
    return best;
}

// The argmax of v[0, n) (n >= 1), returned to every thread; all threads of the block must call it.
template <class T>
__device__ ArgBest block_argmax(const T* v, int64_t n, BlockScratch<ArgBest>& scratch) {
    ArgBest best{-INFINITY, n};  // worse than any element (index n)
    for (int64_t i = threadIdx.x; i < n; i += blockDim.x) {
        const float x = to_float(v[i]);
        if (better(x, i, best.value, best.index)) best = ArgBest{x, i};
    }
    return block_best(best, scratch);
}

}  // namespace llaisys::cuda
