// linear for decode-shaped calls (M <= kGemvMaxRows): memory bound, so every weight row is read exactly
// once for all M rows of x.
//
// Batch invariance: a row of out must not depend on the other rows of x (a sequence's logits are the same
// whether it runs alone or batched with others, and however its prompt is cut into chunks). So the GEMV
// computes every output with exactly the arithmetic of the GEMM kernel in use (linear_gemm.h,
// linear_bf16dot.h): one f32 chain per output over k in order (an FMA per k, or a vdpbf16ps per pair of k),
// restarted at the kernel's KC slices, the slices' sums added in order, then the bias added and the result
// rounded by the same vector code. What differs is only how the work is laid out: here W weight rows sit in
// the lanes of a vector (blocks of W rows shared among the threads); per chunk of W k-steps the W x W tile
// of weights (rows x k) is transposed in registers and every row of x adds x[m][k] * w[rows][k], k in order.
// No packing, each weight element is loaded once; the transposes cost shuffles, not memory traffic.
//
// A kernel type provides the GEMV in its arithmetic: Lanes (its vector type), GemvX (the element of x in the
// dot product: f32, or a bf16 pair), gemv_x_stride(K), gemv_x(x, M, K, buf) (x in that form), and
// gemv_block<MM>(w, K, rows, x, ldx, total[MM]) (the MM x rows outputs of one block before the bias).
#pragma once

#include <type_traits>

#include "linear.h"

namespace llaisys::cpu::LLAISYS_ISA {

// The F32 kernel family's block (F32Kernel::micro's arithmetic): weights widened to f32, fmadd(x, w, acc).
template <class V, int KC, int MM, class T>
LLAISYS_ALWAYS_INLINE void gemv_block_f32(const T* __restrict w, int64_t K, int rows, const float* __restrict x,
                                          int64_t ldx, V (&total)[MM]) {
    constexpr int W = V::W;
    for (int64_t k0 = 0; k0 < K; k0 += KC) {
        const int64_t kc = std::min<int64_t>(KC, K - k0);
        V acc[MM];
#pragma GCC unroll 8
        for (int m = 0; m < MM; ++m) acc[m] = V::zero();
        for (int64_t kk = 0; kk < kc; kk += W) {
            const int n = int(std::min<int64_t>(W, kc - kk));
            const int64_t k = k0 + kk;
            V t[W];
#pragma GCC unroll 16
            for (int j = 0; j < W; ++j) {
                const T* p = w + j * K + k;
                if (j < rows) __builtin_prefetch(p + 8 * W);
                t[j] = j >= rows ? V::zero() : n == W ? V::load(p) : V::load_partial(p, n);
            }
            transpose(t);  // t[s]: the weights at k + s of the W rows
            auto step = [&](int s) __attribute__((always_inline)) {
#pragma GCC unroll 8
                for (int m = 0; m < MM; ++m) acc[m] = fmadd(V::set1(x[m * ldx + k + s]), t[s], acc[m]);
            };
            if (n == W) {  // a whole tile: unrolled, so t stays in registers
#pragma GCC unroll 16
                for (int s = 0; s < W; ++s) step(s);
            } else {
                for (int s = 0; s < n; ++s) step(s);
            }
        }
#pragma GCC unroll 8
        for (int m = 0; m < MM; ++m) total[m] = k0 == 0 ? acc[m] : acc[m] + total[m];  // as c += A*B
    }
}

// All M rows, in groups of up to kGemvMaxRows, in Kern's arithmetic.
template <class Kern, class T>
void gemv(const LinearArgs& a) {
    using V = typename Kern::Lanes;
    using X = typename Kern::GemvX;
    constexpr int W = V::W;
    const int64_t M = a.M, N = a.N, K = a.K, ldx = Kern::gemv_x_stride(K);
    const X* xs = Kern::gemv_x(static_cast<const T*>(a.x), M, K, scratch(kSlotX).get<X>(size_t(M * ldx)));
    const T* w = static_cast<const T*>(a.weight);
    const T* bias = static_cast<const T*>(a.bias);
    T* out = static_cast<T*>(a.out);
    const int64_t blocks = ceil_div(N, W);
    const int threads = omp_get_max_threads();
    // Chunks of blocks handed out dynamically (other processes share these cores), several per thread.
    const int64_t chunk = std::clamp<int64_t>(blocks / (int64_t(threads) * 8), 1, 64);
    const bool parallel = threads > 1 && N * K * M >= (int64_t(1) << 16) && blocks > 1;
#pragma omp parallel for schedule(dynamic, chunk) if (parallel)
    for (int64_t blk = 0; blk < blocks; ++blk) {
        const int64_t n0 = blk * W;
        const int rows = int(std::min<int64_t>(W, N - n0));
        const V b = !bias ? V::zero() : rows == W ? V::load(bias + n0) : V::load_partial(bias + n0, rows);
        for (int64_t m0 = 0; m0 < M; m0 += kGemvMaxRows) {
            auto group = [&](auto mm) {
                constexpr int MM = decltype(mm)::value;
                V total[MM];
                Kern::template gemv_block<MM>(w + n0 * K, K, rows, xs + m0 * ldx, ldx, total);
                for (int m = 0; m < MM; ++m) {  // as store_row: + bias, then rounded once
                    const V v = bias ? total[m] + b : total[m];
                    T* o = out + (m0 + m) * N + n0;
                    if (rows == W) v.store(o);
                    else v.store_partial(o, rows);
                }
            };
            switch (std::min<int64_t>(M - m0, kGemvMaxRows)) {
                case 1: group(std::integral_constant<int, 1>{}); break;
                case 2: group(std::integral_constant<int, 2>{}); break;
                case 3: group(std::integral_constant<int, 3>{}); break;
                case 4: group(std::integral_constant<int, 4>{}); break;
                case 5: group(std::integral_constant<int, 5>{}); break;
                case 6: group(std::integral_constant<int, 6>{}); break;
                case 7: group(std::integral_constant<int, 7>{}); break;
                default: group(std::integral_constant<int, 8>{}); break;
            }
        }
    }
}

}  // namespace llaisys::cpu::LLAISYS_ISA
