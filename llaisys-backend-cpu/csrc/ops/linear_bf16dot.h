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

    // The GEMV in this kernel's arithmetic (linear_gemv.h): x as (k, k+1) pairs (an odd K's last pair padded
    // with 0, as pack_pairs does), 16 weight rows in the lanes, one dot_bf16_pairs(acc, x pair, w pairs) per
    // pair, chains restarted at every KC slice.
    using Lanes = Vec16;
    using GemvX = uint32_t;
    static int64_t gemv_x_stride(int64_t K) { return ceil_div(K, 2); }
    static const uint32_t* gemv_x(const bf16_t* x, int64_t M, int64_t K, uint32_t* buf) {
        const int64_t ld = gemv_x_stride(K);
        for (int64_t m = 0; m < M; ++m) {
            buf[m * ld + ld - 1] = 0;  // the pad of an odd K
            std::memcpy(static_cast<void*>(buf + m * ld), x + m * K, sizeof(bf16_t) * size_t(K));
        }
        return buf;
    }
    template <int MM>
    LLAISYS_TARGET_AVX512BF16 static void gemv_block(const bf16_t* __restrict w, int64_t K, int rows,
                                                     const uint32_t* __restrict x, int64_t ldx, Vec16 (&total)[MM]) {
        for (int64_t k0 = 0; k0 < K; k0 += KC) {
            const int64_t kc = std::min<int64_t>(KC, K - k0), pairs = ceil_div(kc, 2);
            Vec16 acc[MM];
#pragma GCC unroll 8
            for (int m = 0; m < MM; ++m) acc[m] = Vec16::zero();
            for (int64_t p0 = 0; p0 < pairs; p0 += 16) {
                const int n = int(std::min<int64_t>(16, pairs - p0));
                const int64_t left = kc - 2 * p0;  // bf16 values left in this slice
                const bf16_t* wk = w + k0 + 2 * p0;
                Vec16 t[16];
#pragma GCC unroll 16
                for (int j = 0; j < 16; ++j) {
                    const bf16_t* p = wk + j * K;
                    if (j < rows) __builtin_prefetch(p + 256);
                    t[j] = j >= rows ? Vec16::zero()
                                     : as_f32(left >= 32 ? Vec16i::load(p) : Vec16i::load_halves_partial(p, int(left)));
                }
                transpose(t);  // t[s]: pair s of the 16 rows
                const uint32_t* xk = x + (k0 >> 1) + p0;
                auto step = [&](int s) __attribute__((always_inline)) {
#pragma GCC unroll 8
                    for (int m = 0; m < MM; ++m) acc[m] = dot_bf16_pairs(acc[m], Vec16i(xk[m * ldx + s]), bits_of(t[s]));
                };
                if (n == 16) {  // a whole tile: unrolled, so t stays in registers
#pragma GCC unroll 16
                    for (int s = 0; s < 16; ++s) step(s);
                } else {
                    for (int s = 0; s < n; ++s) step(s);
                }
            }
#pragma GCC unroll 8
            for (int m = 0; m < MM; ++m) total[m] = k0 == 0 ? acc[m] : acc[m] + total[m];  // as c += A*B
        }
    }
};

}  // namespace llaisys::cpu::LLAISYS_ISA
