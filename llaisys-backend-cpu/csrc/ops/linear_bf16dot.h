// linear for bf16 on CPUs with AVX512-BF16 (avx512 build; run only where has_feature(kAvx512Bf16)):
// vdpbf16ps multiplies pairs of bf16 values exactly and sums them in f32, twice the f32 FMA rate, on the
// raw bf16 data (no widening to f32).
#pragma once

#include <type_traits>

#include "linear_gemm.h"

namespace llaisys::cpu::LLAISYS_ISA {

// GEMM kernel: packed A [ks][MR] and B [ks][32] hold (k, k+1) pairs as 32-bit words, so one dot_bf16_pairs
// does two k steps: c += a[2s]*b[2s] + a[2s+1]*b[2s+1].
template <int MR_, int KC_, int NC_>
struct Bf16DotKernel {
    using P = uint32_t;
    static constexpr int MR = MR_, NR = 32, KU = 2, KC = KC_, NC = NC_;

    LLAISYS_TARGET_AVX512BF16 static void micro(int64_t ks, const P* __restrict a, const P* __restrict b,
                                                float* __restrict c, int64_t ldc, bool accumulate) {
        Vec16 acc[MR][2];
#pragma GCC unroll 16
        for (int i = 0; i < MR; ++i) acc[i][0] = acc[i][1] = Vec16::zero();
        for (int64_t k = 0; k < ks; ++k) {
            const Vec16i b0 = Vec16i::load(b), b1 = Vec16i::load(b + 16);
#pragma GCC unroll 16
            for (int i = 0; i < MR; ++i) {
                const Vec16i ai(a[i]);
                acc[i][0] = dot_bf16_pairs(acc[i][0], ai, b0);
                acc[i][1] = dot_bf16_pairs(acc[i][1], ai, b1);
            }
            a += MR;
            b += NR;
        }
#pragma GCC unroll 16
        for (int i = 0; i < MR; ++i)
            for (int v = 0; v < 2; ++v) {
                float* p = c + i * ldc + v * 16;
                (accumulate ? acc[i][v] + Vec16::load(p) : acc[i][v]).store(p);
            }
    }

    // dst [ceil(kc/2)][L] of (k, k+1) pairs from rows [0, rows) of src; missing rows / odd tail are zero.
    template <int L, class T>
    static void pack_pairs(const T* src, int64_t ld, int rows, int64_t kc, P* dst) {
        static_assert(std::is_same_v<T, bf16_t>, "the bf16 dot kernel packs bf16 only");
        pack_transposed<Vec16, L>(rows, ceil_div(kc, 2), dst, [&](int j, int64_t s0, int) {
            const bf16_t* p = src + j * ld + 2 * s0;
            const int64_t left = kc - 2 * s0;  // bf16 values left in this row
            __builtin_prefetch(p + 256);
            return as_f32(left >= 32 ? Vec16i::load(p) : Vec16i::load_halves_partial(p, int(left)));
        });
    }
    template <class T>
    static void pack_a(const T* src, int64_t ld, int rows, int64_t kc, P* dst) {
        pack_pairs<MR>(src, ld, rows, kc, dst);
    }
    template <class T>
    static void pack_b(const T* src, int64_t ld, int rows, int64_t kc, P* dst) {
        pack_pairs<NR>(src, ld, rows, kc, dst);
    }
};

// GEMV row kernel: vdpbf16ps straight on bf16 weights and bf16 x, 32 values per instruction, no
// widening, and x at half the bytes of the f32 path, so x and the weight stream share L1 better
// (measured 1.3-2.5x faster than shift + FMA at M = 1..8). Same interface as F32Dot (linear_gemv.h).
struct Bf16DotGemv {
    using T = bf16_t;
    using X = bf16_t;
    static constexpr int kAcc = 24;

    template <int MM, int R, int U, int PF>
    LLAISYS_TARGET_AVX512BF16 static void dot(const bf16_t* __restrict w, int64_t ldw, const bf16_t* __restrict x,
                                              int64_t ldx, int64_t len, float (&res)[R][MM]) {
        Vec16 acc[U][R][MM];
#pragma GCC unroll 4
        for (int u = 0; u < U; ++u)
#pragma GCC unroll 8
            for (int r = 0; r < R; ++r)
#pragma GCC unroll 8
                for (int m = 0; m < MM; ++m) acc[u][r][m] = Vec16::zero();
        int64_t k = 0;
        for (; k + 32 * U <= len; k += 32 * U) {
#pragma GCC unroll 4
            for (int u = 0; u < U; ++u) {
                const int64_t ku = k + 32 * u;
                Vec16i wv[R];
#pragma GCC unroll 8
                for (int r = 0; r < R; ++r) {
                    if constexpr (PF > 0) __builtin_prefetch(reinterpret_cast<const char*>(w + r * ldw + ku) + PF);
                    wv[r] = Vec16i::load(w + r * ldw + ku);
                }
#pragma GCC unroll 8
                for (int m = 0; m < MM; ++m) {
                    const Vec16i xv = Vec16i::load(x + m * ldx + ku);
#pragma GCC unroll 8
                    for (int r = 0; r < R; ++r) acc[u][r][m] = dot_bf16_pairs(acc[u][r][m], wv[r], xv);
                }
            }
        }
        for (; k < len; k += 32) {  // zero-filled tail: an odd last value pairs with 0
            const int n = len - k >= 32 ? 32 : int(len - k);
            for (int r = 0; r < R; ++r) {
                const Vec16i wv = Vec16i::load_halves_partial(w + r * ldw + k, n);
                for (int m = 0; m < MM; ++m)
                    acc[0][r][m] = dot_bf16_pairs(acc[0][r][m], wv, Vec16i::load_halves_partial(x + m * ldx + k, n));
            }
        }
#pragma GCC unroll 8
        for (int r = 0; r < R; ++r)
#pragma GCC unroll 8
            for (int m = 0; m < MM; ++m) {
                Vec16 t = acc[0][r][m];
#pragma GCC unroll 4
                for (int u = 1; u < U; ++u) t = t + acc[u][r][m];
                res[r][m] = reduce_add(t);
            }
    }
};

}  // namespace llaisys::cpu::LLAISYS_ISA
