// linear_gq: out [M, N] = x' [M, K] @ w^T + bias with group-quantized weights w[n, k] = (q - z[n, g]) * s[n, g]
// (GPTQ, AWQ; backend.h): 4- or 8-bit codes q in blocks of 16 rows (llaisys.ops.gq), 64 bytes = one 32-bit word
// of each of 16 rows, P = 32 / bits consecutive k per word; x' = x, or x gathered through perm (desc_act).
//
// A CUDA block owns one weight block (16 rows: threadIdx.x) and a tile of kTileM rows of x (blockIdx.y); the
// kSplit threads of a row (threadIdx.y) share its words round-robin: thread y takes words y, y + kSplit, ... in
// order. Per word it unpacks the P codes (q - z, exact in f32) and extends one f32 FMA chain d per row of x with
// them; when its next word starts another group it folds the chain into its total, acc = fma(s, d, acc), and
// restarts d. The kSplit totals are then added in order of y, + bias, and rounded once. So each output's
// arithmetic depends on K and the group size alone, never on M or where its row sits (batch invariance).
// x' goes through shared memory in chunks of kChunk k (each element read once per CUDA block, gathered through
// perm there: no separate pass); a perm value outside [0, K) is reported (LLAISYS_INVALID_ARGUMENT at the next
// synchronizing call) and read as column 0. A warp's loads of a word are 64 consecutive bytes (16 rows) per y.
#include <type_traits>

#include "../common/context.h"
#include "../common/dtype.cuh"
#include "../common/launch.h"
#include "bias_rows.cuh"

namespace llaisys::cuda {
namespace {

constexpr int kRows = 16;     // weight rows per CUDA block: one block of the layout (threadIdx.x)
constexpr int kSplit = 16;    // threads per row (threadIdx.y), sharing its words round-robin
constexpr int kTileM = 8;     // rows of x per CUDA block (blockIdx.y tiles M)
constexpr int kChunk = 256;   // k of x' staged in shared memory at a time (a multiple of kSplit * P)
constexpr int64_t kGroupMultiple = 32;  // group sizes (and K) are multiples of it (backend.h)

template <class I>
__device__ __forceinline__ int64_t perm_at(const void* perm, int64_t k) {
    return int64_t(static_cast<const I*>(perm)[k]);
}

template <int BITS, class T, class I>
__global__ void __launch_bounds__(kRows * kSplit) linear_gq_kernel(int64_t M, int64_t N, int64_t K, int64_t gs, T* out,
                                                                    const T* x, const uint32_t* weight,
                                                                    const f16* scales, const uint8_t* zeros,
                                                                    const T* bias, const void* perm,
                                                                    KernelErrorRecord* error) {
    constexpr int P = 32 / BITS;
    constexpr uint32_t kMask = (1u << BITS) - 1u;
    __shared__ float xs[kTileM][kChunk];
    __shared__ float partial[kSplit][kTileM][kRows];
    const int r = int(threadIdx.x), y = int(threadIdx.y), tid = y * kRows + r;
    const int64_t b = blockIdx.x, m0 = int64_t(blockIdx.y) * kTileM;
    const int64_t words = K / P, G = K / gs, wpg = gs / P;
    const uint32_t* w = weight + b * words * kRows + r;  // word j of this row: w[j * kRows]
    const f16* s = scales + b * G * kRows + r;           // group g: s[g * kRows]
    const uint8_t* z = zeros + b * G * kRows + r;
    float d[kTileM], acc[kTileM];
#pragma unroll
    for (int i = 0; i < kTileM; ++i) d[i] = acc[i] = 0.0f;
    int64_t group = -1;  // the group of the chain d
    float zero = 0.0f;
    for (int64_t c0 = 0; c0 < K; c0 += kChunk) {
        const int64_t width = K - c0 < kChunk ? K - c0 : kChunk;
        __syncthreads();  // (the previous chunk is done with xs)
        for (int64_t e = tid; e < int64_t(kTileM) * kChunk; e += kRows * kSplit) {
            const int i = int(e / kChunk), c = int(e % kChunk);
            float v = 0.0f;
            if (c < width && m0 + i < M) {
                int64_t col = c0 + c;
                if (perm) {
                    const int64_t p = perm_at<I>(perm, col);
                    if (p < 0 || p >= K) {
                        if (i == 0) report_kernel_error(error, kGqPermOutOfRange, p, col, K);
                        col = 0;
                    } else {
                        col = p;
                    }
                }
                v = to_float(x[(m0 + i) * K + col]);
            }
            xs[i][c] = v;
        }
        __syncthreads();
        for (int64_t j = c0 / P + y; j < (c0 + width) / P; j += kSplit) {
            const int64_t g = j / wpg;
            if (g != group) {  // fold the chain of the previous group into the total
                if (group >= 0) {
                    const float scale = to_float(s[group * kRows]);
#pragma unroll
                    for (int i = 0; i < kTileM; ++i) acc[i] = fmaf(scale, d[i], acc[i]), d[i] = 0.0f;
                }
                group = g;
                zero = float(z[g * kRows]);
            }
            const uint32_t word = w[j * kRows];
            const int base = int(j * P - c0);
#pragma unroll
            for (int p = 0; p < P; ++p) {
                const float c = float((word >> (BITS * p)) & kMask) - zero;
#pragma unroll
                for (int i = 0; i < kTileM; ++i) d[i] = fmaf(xs[i][base + p], c, d[i]);
            }
        }
    }
    if (group >= 0) {
        const float scale = to_float(s[group * kRows]);
#pragma unroll
        for (int i = 0; i < kTileM; ++i) acc[i] = fmaf(scale, d[i], acc[i]);
    }
#pragma unroll
    for (int i = 0; i < kTileM; ++i) partial[y][i][r] = acc[i];
    __syncthreads();
    const int64_t n = b * kRows + r;
    if (y == 0 && n < N) {
        for (int i = 0; i < kTileM && m0 + i < M; ++i) {
            float total = partial[0][i][r];
#pragma unroll
            for (int part = 1; part < kSplit; ++part) total += partial[part][i][r];
            out[(m0 + i) * N + n] = from_float<T>(bias ? total + to_float(bias[n]) : total);
        }
    }
}

template <int BITS, class T, class I>
void run_linear_gq(StreamContext& s, int64_t M, int64_t N, int64_t K, int64_t gs, void* out, const void* x,
                   const void* weight, const void* scales, const void* zeros, const void* bias, const void* perm) {
    static_assert(kChunk % (kSplit * (32 / BITS)) == 0, "a chunk holds whole rounds of words");
    auto kernel = &linear_gq_kernel<BITS, T, I>;
    const int64_t tiles = (M + kTileM - 1) / kTileM;
    for (int64_t t0 = 0; t0 < tiles; t0 += 65535) {  // (gridDim.y <= 65535)
        const int64_t count = tiles - t0 < 65535 ? tiles - t0 : 65535, m0 = t0 * kTileM;
        const dim3 grid(unsigned((N + kRows - 1) / kRows), unsigned(count));
        LLAISYS_LAUNCH(kernel, grid, dim3(kRows, kSplit), 0, s.stream, M - m0, N, K, gs,
                       static_cast<T*>(out) + m0 * N, static_cast<const T*>(x) + m0 * K,
                       static_cast<const uint32_t*>(weight), static_cast<const f16*>(scales),
                       static_cast<const uint8_t*>(zeros), static_cast<const T*>(bias), perm,
                       device_context(s.device).error_device);
    }
}

}  // namespace
}  // namespace llaisys::cuda

int LLAISYS_FN(linear_gq)(int device, void* stream, int dtype, int bits, int64_t group_size, int perm_dtype,
                          int64_t M, int64_t N, int64_t K, void* out, const void* x, const void* weight,
                          const void* scales, const void* zeros, const void* bias, const void* perm) {
    using namespace llaisys::cuda;
    return guard("linear_gq", [&] {
        StreamContext& s = stream_context(device, stream);
        dispatch_float(dtype, [&](auto tag) {
            using T = decltype(tag);
            if (bits != 4 && bits != 8) throw NotSupported("bits = " + std::to_string(bits) + " (4 or 8)");
            if (perm && perm_dtype != LLAISYS_I32 && perm_dtype != LLAISYS_I64)
                throw NotSupported("perm dtype code " + std::to_string(perm_dtype) + " (int32 or int64)");
            if (M <= 0 || N <= 0) return;
            if (K == 0) {
                auto fill = &bias_rows_kernel<T>;
                LLAISYS_LAUNCH(fill, blocks_for(M * N, 256, int64_t(device_context(s.device).sm_count) * 8), 256, 0,
                               s.stream, M, N, static_cast<T*>(out), static_cast<const T*>(bias));
                return;
            }
            if (group_size <= 0 || K % group_size || group_size % kGroupMultiple)
                throw InvalidArgument("group_size " + std::to_string(group_size) + " for K = " + std::to_string(K));
            auto run = [&](auto bits_tag, auto index_tag) {
                run_linear_gq<decltype(bits_tag)::value, T, decltype(index_tag)>(s, M, N, K, group_size, out, x, weight,
                                                                                 scales, zeros, bias, perm);
            };
            auto with_index = [&](auto bits_tag) {
                if (perm && perm_dtype == LLAISYS_I32) run(bits_tag, int32_t{});
                else run(bits_tag, int64_t{});
            };
            if (bits == 4) with_index(std::integral_constant<int, 4>{});
            else with_index(std::integral_constant<int, 8>{});
        });
    });
}
