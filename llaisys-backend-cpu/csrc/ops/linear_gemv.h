// linear for decode-shaped calls (M <= kGemvMaxRows): memory bound, so every weight row is read exactly
// once for all M rows of x.
//
// N is split over the threads in blocks of 8 contiguous rows (dynamic schedule: other processes may hold a
// core). While the M rows of x plus one weight row fit in L1, the block is read one row at a time with U
// unrolled accumulators per x row (one sequential stream, which the hardware prefetcher follows best);
// otherwise R rows are interleaved so that each x vector (now an L1 miss) serves R weight vectors.
// f16 / bf16 weights are widened to f32 in registers (bf16: a 16-bit shift), x is converted once; with
// AVX512-BF16, bf16 instead runs vdpbf16ps on raw bf16 weights and x (Bf16DotGemv, linear_bf16dot.h).
#pragma once

#include <type_traits>

#include "linear.h"

namespace llaisys::cpu::LLAISYS_ISA {

// res[r][m] = dot(w row r, x row m) over [0, len): R weight rows (stride ldw) x MM rows of x (stride ldx),
// each k range unrolled U times, so R*MM*U independent accumulator chains. PF > 0: software-prefetch each
// weight row PF bytes ahead.
template <class V, class T, int MM, int R, int U, int PF>
LLAISYS_ALWAYS_INLINE void dot_rows(const T* __restrict w, int64_t ldw, const float* __restrict x, int64_t ldx,
                                    int64_t len, float (&res)[R][MM]) {
    constexpr int W = V::W;
    V acc[U][R][MM];
#pragma GCC unroll 4
    for (int u = 0; u < U; ++u)
#pragma GCC unroll 16
        for (int r = 0; r < R; ++r)
#pragma GCC unroll 8
            for (int m = 0; m < MM; ++m) acc[u][r][m] = V::zero();
    auto step = [&](int u, int64_t k) __attribute__((always_inline)) {
        V wv[R];
#pragma GCC unroll 16
        for (int r = 0; r < R; ++r) {
            if constexpr (PF > 0) __builtin_prefetch(reinterpret_cast<const char*>(w + r * ldw + k) + PF);
            wv[r] = V::load(w + r * ldw + k);
        }
#pragma GCC unroll 8
        for (int m = 0; m < MM; ++m) {
            const V xv = V::load(x + m * ldx + k);
#pragma GCC unroll 16
            for (int r = 0; r < R; ++r) acc[u][r][m] = fmadd(wv[r], xv, acc[u][r][m]);
        }
    };
    int64_t k = 0;
    for (; k + U * W <= len; k += U * W) {
#pragma GCC unroll 4
        for (int u = 0; u < U; ++u) step(u, k + u * W);
    }
    for (; k + W <= len; k += W) step(0, k);
    if (k < len) {
        const int n = int(len - k);
        for (int r = 0; r < R; ++r) {
            const V wv = V::load_partial(w + r * ldw + k, n);
            for (int m = 0; m < MM; ++m) acc[0][r][m] = fmadd(wv, V::load_partial(x + m * ldx + k, n), acc[0][r][m]);
        }
    }
#pragma GCC unroll 16
    for (int r = 0; r < R; ++r)
#pragma GCC unroll 8
        for (int m = 0; m < MM; ++m) {
            V t = acc[0][r][m];
#pragma GCC unroll 4
            for (int u = 1; u < U; ++u) t = t + acc[u][r][m];
            res[r][m] = reduce_add(t);
        }
}

// The default GEMV row kernel: x converted to f32 once, weights widened to f32 in registers, FMA.
// kAcc: the accumulator registers it may use.
template <class V, class T_, int kAcc_>
struct F32Dot {
    using T = T_;
    using X = float;
    static constexpr int kAcc = kAcc_;
    template <int MM, int R, int U, int PF>
    static LLAISYS_ALWAYS_INLINE void dot(const T* w, int64_t ldw, const X* x, int64_t ldx, int64_t len,
                                          float (&res)[R][MM]) {
        dot_rows<V, T, MM, R, U, PF>(w, ldw, x, ldx, len, res);
    }
};

// Interleaved rows: R * MM accumulators within the kernel's budget, at most 4 rows (streams) at once,
// and a power of two so that R divides the 8-row blocks (left-over rows would run one at a time).
template <class Dot, int MM>
constexpr int gemv_rows_at_once() {
    constexpr int r = Dot::kAcc / MM;
    return r >= 4 ? 4 : r >= 2 ? 2 : 1;
}

// Single-row path: unroll k so that MM * U >= 4 chains cover the FMA latency.
template <int MM>
constexpr int gemv_unroll() { return MM == 1 ? 4 : MM == 2 ? 2 : 1; }

constexpr int64_t kGemvBlockRows = 8;    // weight rows per scheduling unit (contiguous in memory), one Vec8 of outputs
constexpr int kGemvPrefetch = 512;       // bytes ahead on each interleaved weight row
constexpr int64_t kGemvL1Bytes = 24 << 10;

// Rows [m0, m0 + MM) of the output; xg holds those rows of x in the kernel's format (stride K).
template <class Dot, int MM>
void gemv_group(const LinearArgs& a, const typename Dot::X* xg, int64_t m0) {
    using T = typename Dot::T;
    constexpr int R = gemv_rows_at_once<Dot, MM>();
    constexpr int U = gemv_unroll<MM>();
    const int64_t N = a.N, K = a.K;
    const T* w = static_cast<const T*>(a.weight);
    const T* bias = static_cast<const T*>(a.bias);
    T* out = static_cast<T*>(a.out) + m0 * N;
    const int64_t blocks = ceil_div(N, kGemvBlockRows);
    const int threads = omp_get_max_threads();
    // Chunks of row blocks handed out dynamically (other processes share these cores), small enough
    // that every thread gets several.
    const int64_t chunk = std::clamp<int64_t>(blocks / (int64_t(threads) * 8), 1, 64);
    const bool parallel = threads > 1 && N * K * MM >= (int64_t(1) << 16) && blocks > 1;
    // While the x rows and one weight row fit in L1, read one weight row at a time: the weights are then
    // one sequential stream, which the hardware prefetcher follows best. Beyond that, x vectors miss L1,
    // so R rows are interleaved and each x vector serves R weight vectors.
    const bool sequential = (MM * int64_t(sizeof(typename Dot::X)) + int64_t(sizeof(T))) * K <= kGemvL1Bytes;
#pragma omp parallel for schedule(dynamic, chunk) if (parallel)
    for (int64_t blk = 0; blk < blocks; ++blk) {
        const int64_t n0 = blk * kGemvBlockRows, rows = std::min(kGemvBlockRows, N - n0);
        float res[MM][kGemvBlockRows];  // out[m0 + m][n0 + r] before the bias
        int64_t r = 0;
        if (!sequential) {
            for (; r + R <= rows; r += R) {
                float part[R][MM];
                Dot::template dot<MM, R, 1, kGemvPrefetch>(w + (n0 + r) * K, K, xg, K, K, part);
                for (int q = 0; q < R; ++q)
                    for (int m = 0; m < MM; ++m) res[m][r + q] = part[q][m];
            }
        }
        for (; r < rows; ++r) {
            float part[1][MM];
            Dot::template dot<MM, 1, U, 0>(w + (n0 + r) * K, K, xg, K, K, part);
            for (int m = 0; m < MM; ++m) res[m][r] = part[0][m];
        }
        for (int m = 0; m < MM; ++m) store_row<Vec8>(out + m * N + n0, res[m], bias ? bias + n0 : nullptr, rows);
    }
}

// All M rows, in groups of up to kGemvMaxRows. Dot reads x as Dot::X: f32 (converted here, once) or the
// weights' own dtype (a dot kernel on raw bf16).
template <class Dot>
void gemv(const LinearArgs& a) {
    using T = typename Dot::T;
    using X = typename Dot::X;
    const int64_t M = a.M, K = a.K;
    const X* xs;
    if constexpr (std::is_same_v<X, T>) {
        xs = static_cast<const X*>(a.x);
    } else {
        X* buf = scratch(kSlotX).get<X>(size_t(M * K));
        convert(static_cast<const T*>(a.x), buf, M * K);
        xs = buf;
    }
    for (int64_t m0 = 0; m0 < M; m0 += kGemvMaxRows) {
        const X* xg = xs + m0 * K;
        switch (std::min<int64_t>(M - m0, kGemvMaxRows)) {
            case 1: gemv_group<Dot, 1>(a, xg, m0); break;
            case 2: gemv_group<Dot, 2>(a, xg, m0); break;
            case 3: gemv_group<Dot, 3>(a, xg, m0); break;
            case 4: gemv_group<Dot, 4>(a, xg, m0); break;
            case 5: gemv_group<Dot, 5>(a, xg, m0); break;
            case 6: gemv_group<Dot, 6>(a, xg, m0); break;
            case 7: gemv_group<Dot, 7>(a, xg, m0); break;
            default: gemv_group<Dot, 8>(a, xg, m0); break;
        }
    }
}

}  // namespace llaisys::cpu::LLAISYS_ISA
