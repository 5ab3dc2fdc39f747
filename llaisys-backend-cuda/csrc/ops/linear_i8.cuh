// The pieces of linear_i8 (backend.h) that a kernel over int8 weight blocks needs: x quantized per row and
// group of 32 into the stream's workspace, and a block's outputs for up to 8 rows of x. linear_i8.cu uses them
// for the plain linear; an int8 moe_linear would pass its gathered rows the same way (moe.cu does so with
// linear.cuh).
//
// The arithmetic is the CPU kernel's (llaisys-backend-cpu csrc/ops/linear_i8*.h, its AVX2 / AVX-512 builds),
// so that the two backends give the same bits:
//     sx[m, g] = max |x[m, k in g]| / 127 (an f32 division), xq = round-half-to-even(x / sx) clamped to ±127
//     (a group with inf or NaN: sx = NaN, xq = 0; max 0: sx = 0, xq = 0);
//     out[m, n] = round(acc + bias[n]), acc = fma(scale(n, g) * sx[m, g], float(dot_g), acc) over g in order
//     from acc = 0, dot_g = sum over the group of q[n, k] * xq[m, k] (exact int32).
// (The CPU's portable build, without FMA, rounds the product and the sum apart: it is not the reference.)
//
// Weights (backend.h): blocks of 16 rows, weight[b][g][s][r][i] = q[16 b + r, 32 g + 4 s + i], scales [b][g][r].
// In a block's group, lane (r, h) of a warp reads row r's 4-byte words of group g0 + h (h < WARP_SIZE / 16:
// 2 groups per warp step, 4 on CoreX), so a warp step reads 1 or 2 KiB as 64-byte runs, and each lane's 8 words
// against the 8 words of xq of its group give the row's exact group dot (__dp4a where the build has it).
// Because the f32 chain over the groups must run in order, the warps of a block compute the group dots of a
// chunk of groups in parallel, park (scale * sx, float(dot)) in shared memory, and then 16 * MR threads run the
// chains over the chunk; the chains continue over the next chunk.
#pragma once

#include "../common/dtype.cuh"
#include "../common/reduce.cuh"

namespace llaisys::cuda::i8 {

constexpr int kGroup = 32;                        // k per scale (llaisys.ops.INT8_GROUP)
constexpr int kBlockRows = 16;                    // rows per weight block (INT8_BLOCK_ROWS)
constexpr int kSteps = kGroup / 4;                // 4-byte words per row and group
constexpr int kGroupBytes = kGroup * kBlockRows;  // one group of one block: 512 bytes
constexpr int kLaneGroups = WARP_SIZE / kBlockRows;  // groups a warp covers per step
constexpr int kThreads = 256;                     // per block of the dot kernel
constexpr int kMaxRows = 8;                       // rows of x per block (MR)
constexpr int kParkedPairs = 4096;                // (scale * sx, dot) pairs parked per chunk: 32 KiB
constexpr int kUnroll = 4;                        // warp steps whose weights are loaded before their dots

struct Parked {
    float scale;  // scale(n, g) * sx[m, g]
    float dot;    // the exact group dot, as f32 (|dot| <= 32 * 127 * 127 < 2^24: exact)
};

// x quantized: rows of ld bytes (G whole groups, zeros past K; ld a multiple of 32) and f32 scales [rows, G].
struct QuantizedRows {
    const int8_t* q;
    const float* sx;
    int64_t ld, G;
};

// The quantization of x's group (m, g) (n <= 32 values at `x`): its 32 bytes of xq and sx.
template <class T>
__device__ __forceinline__ void quantize_group(const T* x, int n, int8_t* q, float* sx) {
    float v[kGroup], amax = 0.0f;
    bool nan = false;
#pragma unroll
    for (int i = 0; i < kGroup; ++i) {
        v[i] = i < n ? to_float(x[i]) : 0.0f;
        nan |= isnan(v[i]);
        amax = fmaxf(amax, fabsf(v[i]));
    }
    const float s = amax / 127.0f;
    const bool finite = !nan && s < INFINITY;
    int words[kSteps];
#pragma unroll
    for (int w = 0; w < kSteps; ++w) {
        uint32_t word = 0;
#pragma unroll
        for (int i = 0; i < 4; ++i) {
            const float r = finite && s > 0.0f ? fminf(127.0f, fmaxf(-127.0f, rintf(v[4 * w + i] / s))) : 0.0f;
            word |= uint32_t(uint8_t(int8_t(int(r)))) << (8 * i);
        }
        words[w] = int(word);
    }
    Pack<int, kSteps / 2>* dst = reinterpret_cast<Pack<int, kSteps / 2>*>(q);
    dst[0] = Pack<int, kSteps / 2>{{words[0], words[1], words[2], words[3]}};
    dst[1] = Pack<int, kSteps / 2>{{words[4], words[5], words[6], words[7]}};
    *sx = finite ? s : NAN;
}

// Rows [0, M) of x [M, K] into xq (rows of ld bytes) and sx [M, G]: one thread per (row, group).
template <class T>
__global__ void quantize_kernel(int64_t M, int64_t K, const T* x, int8_t* q, float* sx, int64_t ld, int64_t G) {
    const int64_t total = M * G, stride = int64_t(gridDim.x) * blockDim.x;
    for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < total; i += stride) {
        const int64_t m = i / G, g = i % G, k0 = g * kGroup;
        quantize_group(x + m * K + k0, int(K - k0 < kGroup ? K - k0 : kGroup), q + m * ld + k0, sx + i);
    }
}

// The exact dot of one row's 8 weight words with 8 words of xq.
__device__ __forceinline__ int dot_words(const int (&w)[kSteps], const Pack<int, kSteps / 2> (&x)[2]) {
    int dot = 0;
#pragma unroll
    for (int s = 0; s < kSteps; ++s) {
        const int xw = x[s / 4].v[s % 4];
#if LLAISYS_HAS_DP4A
        dot = __dp4a(w[s], xw, dot);
#else
#pragma unroll
        for (int i = 0; i < 4; ++i) dot += int(int8_t(w[s] >> (8 * i))) * int(int8_t(xw >> (8 * i)));
#endif
    }
    return dot;
}

// The chains of one weight block (16 rows: `w` its bytes [G, 8, 16, 4], `scales` its [G, 16]) against MR rows of
// x (rows[m]: a row of xq, or -1 for none). Every thread of the block calls it; on return thread t < 16 MR holds
// the f32 sum of row r = t % 16 of the block against x row m = t / 16 (before the bias).
template <int MR>
__device__ float block_chains(const int8_t* w, const bf16* scales, const QuantizedRows& xq, const int64_t (&rows)[MR]) {
    __shared__ Parked parked[kParkedPairs];
    constexpr int64_t kChunkGroups = kParkedPairs / (kBlockRows * MR);
    const int r = lane_id() % kBlockRows, h = lane_id() / kBlockRows, warps = int(blockDim.x) / WARP_SIZE;
    float acc = 0.0f;
    for (int64_t g0 = 0; g0 < xq.G; g0 += kChunkGroups) {
        const int64_t groups = xq.G - g0 < kChunkGroups ? xq.G - g0 : kChunkGroups;
        // warp steps j = warp, warp + warps, ...: kUnroll of them at a time, their weights loaded first, so that a
        // warp has kUnroll KiB of the weight stream in flight (a step is 1 KiB: 2 groups; on CoreX 2 KiB)
        for (int64_t j0 = warp_id(); j0 * kLaneGroups < groups; j0 += int64_t(warps) * kUnroll) {
            int wq[kUnroll][kSteps] = {};
            float scale[kUnroll] = {};
#pragma unroll
            for (int u = 0; u < kUnroll; ++u) {
                const int64_t gl = (j0 + int64_t(u) * warps) * kLaneGroups + h, g = g0 + gl;
                if (gl >= groups) continue;
#pragma unroll
                for (int s = 0; s < kSteps; ++s)
                    wq[u][s] = *reinterpret_cast<const int*>(w + g * kGroupBytes + s * 4 * kBlockRows + 4 * r);
                scale[u] = to_float(scales[g * kBlockRows + r]);
            }
#pragma unroll
            for (int u = 0; u < kUnroll; ++u) {
                const int64_t gl = (j0 + int64_t(u) * warps) * kLaneGroups + h, g = g0 + gl;
                if (gl >= groups) continue;
#pragma unroll
                for (int m = 0; m < MR; ++m) {
                    Parked pf{0.0f, 0.0f};
                    if (rows[m] >= 0) {
                        const Pack<int, kSteps / 2>* xw =
                            reinterpret_cast<const Pack<int, kSteps / 2>*>(xq.q + rows[m] * xq.ld + g * kGroup);
                        const Pack<int, kSteps / 2> x[2] = {xw[0], xw[1]};
                        pf = Parked{scale[u] * xq.sx[rows[m] * xq.G + g], float(dot_words(wq[u], x))};
                    }
                    parked[(gl * MR + m) * kBlockRows + r] = pf;
                }
            }
        }
        __syncthreads();
        if (int(threadIdx.x) < kBlockRows * MR) {
            const int cr = int(threadIdx.x) % kBlockRows, cm = int(threadIdx.x) / kBlockRows;
            for (int64_t gl = 0; gl < groups; ++gl) {
                const Parked pf = parked[(gl * MR + cm) * kBlockRows + cr];
                acc = fmaf(pf.scale, pf.dot, acc);
            }
        }
        __syncthreads();  // the chains have read the chunk before the next one is parked
    }
    return acc;
}

}  // namespace llaisys::cuda::i8
