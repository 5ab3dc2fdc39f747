// linear_q: out [M, N] = x [M, K] @ w^T + bias with w in a block format (block_formats.cuh), and embedding_q:
// rows of such a matrix decoded (backend.h).
//
// x is quantized per row and group of 32 k first (quantize_x_kernel, into the stream's workspace, as many
// rows at a time as fit): sx = max|x| / 127 (an f32 division), xq = round-half-to-even(x / sx) in [-127,
// 127], and the sums of xq per half group, exactly as the CPU does (a group holding inf or NaN: sx = NaN,
// its row of out NaN). Then out[m, n] = sum over g of (scale(n, g) * sx[m, g]) * dot_g (per half group with
// its own scale for Q6_K) + min(n, g) * (sx[m, g] * sum_g xq) + bias[n], the group dots exact integers.
//
// Batch invariant: thread (n, y) of linear_q_kernel owns the groups y, y + kQSplit, ... of row n and keeps
// one f32 chain over them in order, for every row of x; the kQSplit partial sums are added in the order of
// y. So each output's arithmetic depends on K alone, never on M or where its row sits. The 32 rows of a CUDA
// block are 2 weight blocks of 16: a warp's loads of one chunk are two runs of 64 consecutive bytes.
#include "../common/context.h"
#include "../common/dtype.cuh"
#include "../common/launch.h"
#include "bias_rows.cuh"
#include "block_formats.cuh"
#include "moe_ids.cuh"

namespace llaisys::cuda {
namespace {

constexpr int kQRows = 32;   // weight rows per CUDA block (threadIdx.x)
constexpr int kQSplit = 8;   // threads sharing a row's groups (threadIdx.y): thread y owns groups y, y + 8, ...
constexpr int kQTileM = 4;   // rows of x per thread (blockIdx.y tiles M)

// x quantized per group (the workspace): q [rows, G * 32], sx [rows, G], sums [rows, G, 2].
struct QuantX {
    int8_t* q;
    float* sx;
    int32_t* sum;
};

template <class T>
__global__ void quantize_x_kernel(int64_t rows, int64_t K, int64_t G, const T* x, QuantX xq) {
    const int64_t stride = int64_t(gridDim.x) * blockDim.x;
    for (int64_t item = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; item < rows * G; item += stride) {
        const int64_t m = item / G, g = item % G, k0 = g * kQGroup;
        float v[kQGroup];
        float amax = 0.0f;
        bool finite = true;
#pragma unroll
        for (int i = 0; i < kQGroup; ++i) {
            v[i] = k0 + i < K ? to_float(x[m * K + k0 + i]) : 0.0f;
            finite = finite && isfinite(v[i]);
            amax = fmaxf(amax, fabsf(v[i]));
        }
        const float s = amax / 127.0f;
        int8_t* q = xq.q + m * G * kQGroup + k0;
        int32_t half[2] = {0, 0};
        if (finite && s > 0.0f && isfinite(s)) {
#pragma unroll
            for (int i = 0; i < kQGroup; ++i) {
                const int value = int(fminf(127.0f, fmaxf(-127.0f, rintf(v[i] / s))));
                q[i] = int8_t(value);
                half[i / kQHalf] += value;
            }
            xq.sx[m * G + g] = s;
        } else {  // zeros (or a max that underflows): xq = 0; inf / NaN: sx = NaN, so the row's outputs are NaN
#pragma unroll
            for (int i = 0; i < kQGroup; ++i) q[i] = 0;
            xq.sx[m * G + g] = finite ? s : __uint_as_float(0x7fc00000u);
        }
        xq.sum[(m * G + g) * 2] = half[0];
        xq.sum[(m * G + g) * 2 + 1] = half[1];
    }
}

// Thread y's f32 chains over the groups y, y + kQSplit, ... of weight row n (of the matrix whose blocks are weight,
// scales) against rows rows[i] of xq, added to acc[i]: the arithmetic of every linear_q output, and of every
// moe_linear_q output (whose matrix is its expert's), whatever else the kernel computes.
template <int FMT, int MM>
__device__ __forceinline__ void row_chains(const uint8_t* weight, const uint8_t* scales, int64_t n, int64_t G, int y,
                                           const QuantX& xq, const int64_t (&rows)[MM], float (&acc)[MM]) {
    using F = QFormat<FMT>;
    constexpr int kSubK = kQGroup / F::kSubs;
    const int r = int(n % kQBlockRows);
    const uint8_t* w = weight + (n / kQBlockRows) * G * F::kWeightBytes;
    const uint8_t* s = scales + (n / kQBlockRows) * G * F::kScaleBytes;
    for (int64_t g = y; g < G; g += kQSplit) {
        int q[kQGroup];
        F::codes(w, r, g, q);
        float scale[F::kSubs];
#pragma unroll
        for (int t = 0; t < F::kSubs; ++t) scale[t] = F::scale(s, r, g, t);
        const float min = F::kMin ? F::min(s, r, g) : 0.0f;
#pragma unroll
        for (int i = 0; i < MM; ++i) {
            const int64_t m = rows[i];
            const int8_t* xk = xq.q + (m * G + g) * kQGroup;
            const float sx = xq.sx[m * G + g];
#pragma unroll
            for (int t = 0; t < F::kSubs; ++t) {
                int dot = 0;
#pragma unroll
                for (int k = t * kSubK; k < (t + 1) * kSubK; ++k) dot += q[k] * int(xk[k]);
                acc[i] = fmaf(scale[t] * sx, float(dot), acc[i]);
            }
            if (F::kMin) {
                const int32_t* sum = xq.sum + (m * G + g) * 2;
                acc[i] = fmaf(min, sx * float(sum[0] + sum[1]), acc[i]);
            }
        }
    }
}

template <int FMT, class T>
__global__ void __launch_bounds__(kQRows * kQSplit) linear_q_kernel(int64_t M, int64_t N, int64_t G, T* out,
                                                                     const QuantX xq, const uint8_t* weight,
                                                                     const uint8_t* scales, const T* bias) {
    __shared__ float partial[kQSplit][kQTileM][kQRows];
    const int x_row = int(threadIdx.x), y = int(threadIdx.y);
    const int64_t n = int64_t(blockIdx.x) * kQRows + x_row, m0 = int64_t(blockIdx.y) * kQTileM;
    float acc[kQTileM];
    int64_t rows[kQTileM];
#pragma unroll
    for (int i = 0; i < kQTileM; ++i) {
        acc[i] = 0.0f;
        rows[i] = m0 + i < M ? m0 + i : M - 1;  // rows past M repeat the last (never stored)
    }
    if (n < N) row_chains<FMT, kQTileM>(weight, scales, n, G, y, xq, rows, acc);
#pragma unroll
    for (int i = 0; i < kQTileM; ++i) partial[y][i][x_row] = acc[i];
    __syncthreads();
    if (y == 0 && n < N) {
#pragma unroll
        for (int i = 0; i < kQTileM; ++i) {
            if (m0 + i >= M) break;
            float total = partial[0][i][x_row];
#pragma unroll
            for (int part = 1; part < kQSplit; ++part) total += partial[part][i][x_row];
            out[(m0 + i) * N + n] = from_float<T>(bias ? total + to_float(bias[n]) : total);
        }
    }
}

// moe_linear_q: CUDA block (tile of 32 weight rows, pair p0 + blockIdx.y) computes out[p, n] for the pair's expert
// e with linear_q_kernel's arithmetic (row_chains over expert e's blocks, the kQSplit partial sums in order of y),
// so each output is bit for bit linear_q's of its input row and expert. A pair reads its expert's blocks (from L2
// when other pairs chose the same expert). xq holds x's rows from x0 on. A pair whose id is out of range is
// skipped (moe_check_ids_kernel reports it).
template <int FMT, class T>
__global__ void __launch_bounds__(kQRows * kQSplit)
    moe_linear_q_kernel(int64_t p0, int64_t x0, int64_t k, int64_t E, int64_t N, int64_t G, bool x_per_slot, T* out,
                        const QuantX xq, const uint8_t* weight, const uint8_t* scales, const int64_t* experts) {
    using F = QFormat<FMT>;
    __shared__ float partial[kQSplit][kQRows];
    const int x_row = int(threadIdx.x), y = int(threadIdx.y);
    const int64_t n = int64_t(blockIdx.x) * kQRows + x_row, p = p0 + blockIdx.y, e = experts[p];
    if (e < 0 || e >= E) return;  // (the whole CUDA block: before any barrier)
    const int64_t expert = e * ((N + kQBlockRows - 1) / kQBlockRows) * G;  // blocks-times-groups before expert e
    const int64_t rows[1] = {(x_per_slot ? p : p / k) - x0};
    float acc[1] = {0.0f};
    if (n < N) row_chains<FMT, 1>(weight + expert * F::kWeightBytes, scales + expert * F::kScaleBytes, n, G, y, xq,
                                  rows, acc);
    partial[y][x_row] = acc[0];
    __syncthreads();
    if (y == 0 && n < N) {
        float total = partial[0][x_row];
#pragma unroll
        for (int part = 1; part < kQSplit; ++part) total += partial[part][x_row];
        out[p * N + n] = from_float<T>(total);
    }
}

// Row i of out = row index[i] of the matrix, decoded: thread per group of 32 k of a row.
template <int FMT, class T>
__global__ void embedding_q_kernel(int64_t n_index, int64_t dim, int64_t vocab, T* out, const int64_t* index,
                                   const uint8_t* weight, const uint8_t* scales, KernelErrorRecord* error) {
    using F = QFormat<FMT>;
    constexpr int kSubK = kQGroup / F::kSubs;
    const int64_t G = (dim + kQGroup - 1) / kQGroup, stride = int64_t(gridDim.x) * blockDim.x;
    for (int64_t item = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; item < n_index * G; item += stride) {
        const int64_t i = item / G, g = item % G, row = index[i];
        if (row < 0 || row >= vocab) {
            if (g == 0) report_kernel_error(error, kEmbeddingIndexOutOfRange, row, i, vocab);
            continue;
        }
        const int r = int(row % kQBlockRows);
        const uint8_t* w = weight + (row / kQBlockRows) * G * F::kWeightBytes;
        const uint8_t* s = scales + (row / kQBlockRows) * G * F::kScaleBytes;
        int q[kQGroup];
        F::codes(w, r, g, q);
        const float min = F::kMin ? F::min(s, r, g) : 0.0f;
#pragma unroll
        for (int t = 0; t < F::kSubs; ++t) {
            const float scale = F::scale(s, r, g, t);
#pragma unroll
            for (int k = t * kSubK; k < (t + 1) * kSubK; ++k) {
                if (g * kQGroup + k >= dim) break;
                const float value = F::kMin ? scale * float(q[k]) + min : scale * float(q[k]);
                out[i * dim + g * kQGroup + k] = from_float<T>(value);
            }
        }
    }
}

constexpr int64_t kQuantXRowAlign = 256;  // bytes: each part of the workspace starts aligned

// Bytes of the workspace one row of quantized x takes (xq, sx, sums).
int64_t quant_x_row_bytes(int64_t G) { return G * (kQGroup + 4 + 8); }

// x's rows [0, rows) quantized into the stream's workspace (G groups a row).
template <class T>
QuantX quantize_rows(StreamContext& s, int64_t rows, int64_t K, int64_t G, const T* x) {
    char* base = static_cast<char*>(s.workspace);
    const int64_t q_bytes = (rows * G * kQGroup + kQuantXRowAlign - 1) / kQuantXRowAlign * kQuantXRowAlign;
    const int64_t sx_bytes = (rows * G * 4 + kQuantXRowAlign - 1) / kQuantXRowAlign * kQuantXRowAlign;
    const QuantX xq{reinterpret_cast<int8_t*>(base), reinterpret_cast<float*>(base + q_bytes),
                    reinterpret_cast<int32_t*>(base + q_bytes + sx_bytes)};
    auto quantize = &quantize_x_kernel<T>;
    LLAISYS_LAUNCH(quantize, blocks_for(rows * G, 128, int64_t(device_context(s.device).sm_count) * 16), 128, 0,
                   s.stream, rows, K, G, x, xq);
    return xq;
}

// The rows of x the workspace holds quantized at once (a multiple of `multiple`; at least one is needed).
int64_t quantized_rows_per_pass(StreamContext& s, int64_t K, int64_t G, int64_t multiple) {
    const int64_t fit = (int64_t(s.workspace_bytes) - 3 * kQuantXRowAlign) / quant_x_row_bytes(G);
    const int64_t chunk = fit / multiple * multiple;
    if (chunk < multiple)
        throw NotSupported("K = " + std::to_string(K) + " is too large for the workspace "
                           "(LLAISYS_CUDA_WORKSPACE_BYTES)");
    return chunk;
}

template <int FMT, class T>
void run_linear_q(StreamContext& s, int64_t M, int64_t N, int64_t K, void* out, const void* x, const void* weight,
                  const void* scales, const void* bias) {
    const int64_t G = (K + kQGroup - 1) / kQGroup;
    const int64_t chunk = quantized_rows_per_pass(s, K, G, kQTileM);
    for (int64_t m0 = 0; m0 < M; m0 += chunk) {
        const int64_t rows = std::min(chunk, M - m0);
        const QuantX xq = quantize_rows(s, rows, K, G, static_cast<const T*>(x) + m0 * K);
        auto kernel = &linear_q_kernel<FMT, T>;
        const dim3 grid(unsigned((N + kQRows - 1) / kQRows), unsigned((rows + kQTileM - 1) / kQTileM));
        LLAISYS_LAUNCH(kernel, grid, dim3(kQRows, kQSplit), 0, s.stream, rows, N, G, static_cast<T*>(out) + m0 * N,
                       xq, static_cast<const uint8_t*>(weight), static_cast<const uint8_t*>(scales),
                       static_cast<const T*>(bias));
    }
}

constexpr int64_t kMaxGridY = 65535;  // CUDA's limit on gridDim.y: the pairs of one moe_linear_q launch

template <int FMT, class T>
void run_moe_linear_q(StreamContext& s, int64_t M, int64_t k, int64_t E, int64_t N, int64_t K, bool x_per_slot,
                      void* out, const void* x, const void* weight, const void* scales, const int64_t* experts) {
    const int64_t G = (K + kQGroup - 1) / kQGroup;
    const int64_t x_rows = x_per_slot ? M * k : M, pairs_per_row = x_per_slot ? 1 : k;
    const int64_t chunk = std::min(quantized_rows_per_pass(s, K, G, 1), kMaxGridY / pairs_per_row);
    for (int64_t r0 = 0; r0 < x_rows; r0 += chunk) {
        const int64_t rows = std::min(chunk, x_rows - r0);
        const QuantX xq = quantize_rows(s, rows, K, G, static_cast<const T*>(x) + r0 * K);
        auto kernel = &moe_linear_q_kernel<FMT, T>;
        const dim3 grid(unsigned((N + kQRows - 1) / kQRows), unsigned(rows * pairs_per_row));
        LLAISYS_LAUNCH(kernel, grid, dim3(kQRows, kQSplit), 0, s.stream, r0 * pairs_per_row, r0, k, E, N, G,
                       x_per_slot, static_cast<T*>(out), xq, static_cast<const uint8_t*>(weight),
                       static_cast<const uint8_t*>(scales), experts);
    }
}

}  // namespace
}  // namespace llaisys::cuda

int LLAISYS_FN(linear_q)(int device, void* stream, int dtype, int fmt, int64_t M, int64_t N, int64_t K, void* out,
                         const void* x, const void* weight, const void* scales, const void* bias) {
    using namespace llaisys::cuda;
    return guard("linear_q", [&] {
        StreamContext& s = stream_context(device, stream);
        dispatch_float(dtype, [&](auto tag) {
            using T = decltype(tag);
            dispatch_qformat(fmt, [&](auto format) {
                if (M <= 0 || N <= 0) return;
                if (K == 0) {
                    auto fill = &bias_rows_kernel<T>;
                    LLAISYS_LAUNCH(fill, blocks_for(M * N, 256, int64_t(device_context(s.device).sm_count) * 8), 256, 0,
                                   s.stream, M, N, static_cast<T*>(out), static_cast<const T*>(bias));
                    return;
                }
                run_linear_q<decltype(format)::value, T>(s, M, N, K, out, x, weight, scales, bias);
            });
        });
    });
}

int LLAISYS_FN(embedding_q)(int device, void* stream, int dtype, int fmt, int64_t n_index, int64_t dim, int64_t vocab,
                            void* out, const void* index, const void* weight, const void* scales) {
    using namespace llaisys::cuda;
    return guard("embedding_q", [&] {
        StreamContext& s = stream_context(device, stream);
        dispatch_float(dtype, [&](auto tag) {
            using T = decltype(tag);
            dispatch_qformat(fmt, [&](auto format) {
                if (n_index <= 0) return;
                const int64_t items = n_index * std::max<int64_t>(1, (dim + kQGroup - 1) / kQGroup);
                auto kernel = &embedding_q_kernel<decltype(format)::value, T>;
                LLAISYS_LAUNCH(kernel, blocks_for(items, 128, int64_t(device_context(s.device).sm_count) * 16), 128, 0,
                               s.stream, n_index, dim, vocab, static_cast<T*>(out), static_cast<const int64_t*>(index),
                               static_cast<const uint8_t*>(weight), static_cast<const uint8_t*>(scales),
                               device_context(s.device).error_device);
            });
        });
    });
}

int LLAISYS_FN(moe_linear_q)(int device, void* stream, int dtype, int fmt, int64_t M, int64_t k, int64_t E, int64_t N,
                             int64_t K, int x_per_slot, void* out, const void* x, const void* weight,
                             const void* scales, const void* experts) {
    using namespace llaisys::cuda;
    return guard("moe_linear_q", [&] {
        StreamContext& s = stream_context(device, stream);
        dispatch_float(dtype, [&](auto tag) {
            using T = decltype(tag);
            dispatch_qformat(fmt, [&](auto format) {
                const int64_t pairs = M * k, sms = device_context(s.device).sm_count;
                if (pairs <= 0) return;
                const auto* ids = static_cast<const int64_t*>(experts);
                auto check = &moe_check_ids_kernel;
                LLAISYS_LAUNCH(check, blocks_for(pairs, 256, sms * 4), 256, 0, s.stream, pairs, k, E, ids,
                               device_context(s.device).error_device);
                if (N <= 0) return;
                if (K == 0) {  // out = 0
                    auto fill = &bias_rows_kernel<T>;
                    LLAISYS_LAUNCH(fill, blocks_for(pairs * N, 256, sms * 8), 256, 0, s.stream, pairs, N,
                                   static_cast<T*>(out), static_cast<const T*>(nullptr));
                    return;
                }
                run_moe_linear_q<decltype(format)::value, T>(s, M, k, E, N, K, x_per_slot != 0, out, x, weight,
                                                             scales, ids);
            });
        });
    });
}
