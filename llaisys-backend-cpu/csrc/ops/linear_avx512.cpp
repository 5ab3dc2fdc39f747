// linear, AVX-512 path (16 f32 lanes): 14 x 32 f32 GEMM micro-kernel; on CPUs with AVX512-BF16 (checked
// at run time; these functions carry target("avx512bf16")) bf16 instead runs vdpbf16ps on bf16 pairs, in
// the GEMM and the GEMV (products exact in f32, f32 accumulation).
// GCC 12 false positive on the _mm512_undefined_*() inside its own AVX-512 intrinsics.
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"

#include <immintrin.h>

#include "linear_impl.h"

namespace llaisys::cpu::linear {

namespace {

struct Avx512 {
    using vec = __m512;
    static constexpr int W = 16;

    static inline vec zero() { return _mm512_setzero_ps(); }
    static inline vec set1(float f) { return _mm512_set1_ps(f); }
    static inline vec load(const float* p) { return _mm512_loadu_ps(p); }
    static inline vec load(const bf16_t* p) {
        return from_bf16_bits(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
    }
    static inline vec load(const f16_t* p) {
        return _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
    }
    static inline vec fma(vec a, vec b, vec c) { return _mm512_fmadd_ps(a, b, c); }
    static inline vec add(vec a, vec b) { return _mm512_add_ps(a, b); }
    static inline float reduce(vec v) {
        __m256 s8 = _mm256_add_ps(_mm512_castps512_ps256(v),
                                  _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(v), 1)));
        __m128 s = _mm_add_ps(_mm256_castps256_ps128(s8), _mm256_extractf128_ps(s8, 1));
        s = _mm_add_ps(s, _mm_movehl_ps(s, s));
        s = _mm_add_ss(s, _mm_movehdup_ps(s));
        return _mm_cvtss_f32(s);
    }
    static inline void store(float* p, vec v) { _mm512_storeu_ps(p, v); }
    static inline __m256i to_bf16_bits(vec v) {
        const __m512i u = _mm512_castps_si512(v);
        const __m512i lsb = _mm512_and_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(1));
        __m512i r = _mm512_srli_epi32(_mm512_add_epi32(u, _mm512_add_epi32(_mm512_set1_epi32(0x7fff), lsb)), 16);
        const __m512i quiet = _mm512_or_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(0x40));
        r = _mm512_mask_mov_epi32(r, _mm512_cmp_ps_mask(v, v, _CMP_UNORD_Q), quiet);
        return _mm512_cvtepi32_epi16(r);
    }
    static inline __m256i to_f16_bits(vec v) { return _mm512_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC); }
    static inline vec from_bf16_bits(__m256i h) {
        return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
    }
    static inline void store(bf16_t* p, vec v) { _mm256_storeu_si256(reinterpret_cast<__m256i*>(p), to_bf16_bits(v)); }
    static inline void store(f16_t* p, vec v) { _mm256_storeu_si256(reinterpret_cast<__m256i*>(p), to_f16_bits(v)); }

    static inline __mmask16 first(int64_t n) { return __mmask16((1u << n) - 1); }
    static inline vec load_n(const float* p, int64_t n) { return _mm512_maskz_loadu_ps(first(n), p); }
    static inline vec load_n(const bf16_t* p, int64_t n) { return from_bf16_bits(_mm256_maskz_loadu_epi16(first(n), p)); }
    static inline vec load_n(const f16_t* p, int64_t n) { return _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(first(n), p)); }
    static inline void store_n(float* p, vec v, int64_t n) { _mm512_mask_storeu_ps(p, first(n), v); }
    static inline void store_n(bf16_t* p, vec v, int64_t n) { _mm256_mask_storeu_epi16(p, first(n), to_bf16_bits(v)); }
    static inline void store_n(f16_t* p, vec v, int64_t n) { _mm256_mask_storeu_epi16(p, first(n), to_f16_bits(v)); }

    static inline float f16_to_f32(uint16_t h) { return _cvtsh_ss(h); }
    static inline uint16_t f32_to_f16(float f) { return uint16_t(_cvtss_sh(f, _MM_FROUND_TO_NEAREST_INT)); }

    // 16 x 16: 2x2 blocks (unpack), 4x4 blocks (shuffle_ps), then 128-bit lanes (two shuffle_f32x4 rounds).
    static inline void transpose(vec (&r)[16]) {
        vec t[16];
        for (int i = 0; i < 8; ++i) {
            t[2 * i] = _mm512_unpacklo_ps(r[2 * i], r[2 * i + 1]);
            t[2 * i + 1] = _mm512_unpackhi_ps(r[2 * i], r[2 * i + 1]);
        }
        for (int i = 0; i < 4; ++i) {  // r[4i + c], 128-bit lane L: rows 4i..4i+3 of column 4L + c
            r[4 * i + 0] = _mm512_shuffle_ps(t[4 * i], t[4 * i + 2], _MM_SHUFFLE(1, 0, 1, 0));
            r[4 * i + 1] = _mm512_shuffle_ps(t[4 * i], t[4 * i + 2], _MM_SHUFFLE(3, 2, 3, 2));
            r[4 * i + 2] = _mm512_shuffle_ps(t[4 * i + 1], t[4 * i + 3], _MM_SHUFFLE(1, 0, 1, 0));
            r[4 * i + 3] = _mm512_shuffle_ps(t[4 * i + 1], t[4 * i + 3], _MM_SHUFFLE(3, 2, 3, 2));
        }
        for (int c = 0; c < 4; ++c) {
            const vec u0 = _mm512_shuffle_f32x4(r[c], r[4 + c], 0x88), u1 = _mm512_shuffle_f32x4(r[c], r[4 + c], 0xdd);
            const vec u2 = _mm512_shuffle_f32x4(r[8 + c], r[12 + c], 0x88);
            const vec u3 = _mm512_shuffle_f32x4(r[8 + c], r[12 + c], 0xdd);
            t[c] = _mm512_shuffle_f32x4(u0, u2, 0x88);
            t[8 + c] = _mm512_shuffle_f32x4(u0, u2, 0xdd);
            t[4 + c] = _mm512_shuffle_f32x4(u1, u3, 0x88);
            t[12 + c] = _mm512_shuffle_f32x4(u1, u3, 0xdd);
        }
        for (int i = 0; i < 16; ++i) r[i] = t[i];
    }
};

// 14 x 32 tile: 28 zmm accumulators + 2 B vectors + 1 broadcast = 31 of 32 registers.
using Avx512Kernel = F32Kernel<Avx512, 14, 2, 256, 256>;

// bf16 x bf16 with vdpbf16ps: packed A [ks][MR] and B [ks][32] hold (k, k+1) pairs as 32-bit words, so
// one instruction does two k steps: c += a[2s]*b[2s] + a[2s+1]*b[2s+1] (exact products, f32 sums;
// like every AVX512-BF16 op it treats bf16 subnormal inputs as zero).
template <int MR_, int KC_, int NC_>
struct Bf16DotKernel {
    using P = uint32_t;
    static constexpr int MR = MR_, NR = 32, KU = 2, KC = KC_, NC = NC_;

    __attribute__((target("avx512bf16"))) static void micro(int64_t ks, const P* __restrict a,
                                                            const P* __restrict b, float* __restrict c,
                                                            int64_t ldc, bool accumulate) {
        __m512 acc[MR][2];
#pragma GCC unroll 16
        for (int i = 0; i < MR; ++i) acc[i][0] = acc[i][1] = _mm512_setzero_ps();
        for (int64_t k = 0; k < ks; ++k) {
            const __m512bh b0 = (__m512bh)_mm512_loadu_si512(b);
            const __m512bh b1 = (__m512bh)_mm512_loadu_si512(b + 16);
#pragma GCC unroll 16
            for (int i = 0; i < MR; ++i) {
                const __m512bh ai = (__m512bh)_mm512_set1_epi32(int(a[i]));
                acc[i][0] = _mm512_dpbf16_ps(acc[i][0], ai, b0);
                acc[i][1] = _mm512_dpbf16_ps(acc[i][1], ai, b1);
            }
            a += MR;
            b += NR;
        }
#pragma GCC unroll 16
        for (int i = 0; i < MR; ++i)
            for (int v = 0; v < 2; ++v) {
                float* p = c + i * ldc + v * 16;
                _mm512_storeu_ps(p, accumulate ? _mm512_add_ps(acc[i][v], _mm512_loadu_ps(p)) : acc[i][v]);
            }
    }

    // dst [ceil(kc/2)][L] of (k, k+1) pairs from rows [0, rows) of src; missing rows / odd tail are zero.
    template <int L, class T>
    static void pack_pairs(const T* src, int64_t ld, int rows, int64_t kc, P* dst) {
        static_assert(std::is_same_v<T, bf16_t>, "the bf16 dot kernel packs bf16 only");
        pack_transposed<Avx512, L>(rows, ceil_div(kc, 2), dst, [&](int j, int64_t s0, int64_t) {
            const bf16_t* p = src + j * ld + 2 * s0;
            const int64_t left = kc - 2 * s0;  // bf16 values left in this row
            __builtin_prefetch(p + 256);
            if (left >= 32) return _mm512_castsi512_ps(_mm512_loadu_si512(p));
            return _mm512_castsi512_ps(_mm512_maskz_loadu_epi16(__mmask32((uint64_t(1) << left) - 1), p));
        });
    }
    template <class T>
    static void pack_a(const T* src, int64_t ld, int rows, int64_t kc, P* dst) {
        pack_pairs<MR>(src, ld, rows, kc, dst);
    }

    // The GEMV in this kernel's arithmetic (see gemv in linear_impl.h): x as (k, k+1) pairs of bf16 (an odd
    // K's last pair padded with 0, as pack_pairs does), 16 weight rows in the lanes, one vdpbf16ps per pair.
    using GemvX = uint32_t;
    static int64_t gemv_x_stride(int64_t K) { return ceil_div(K, 2); }
    static const uint32_t* gemv_x(const bf16_t* x, int64_t M, int64_t K, uint32_t* buf) {
        const int64_t ld = gemv_x_stride(K);
        for (int64_t m = 0; m < M; ++m) {
            buf[m * ld + ld - 1] = 0;  // the pad of an odd K
            std::memcpy(buf + m * ld, x + m * K, sizeof(bf16_t) * size_t(K));
        }
        return buf;
    }
    template <int MM>
    __attribute__((target("avx512bf16"))) static void gemv_block(const bf16_t* __restrict w, int64_t K, int rows,
                                                                 const uint32_t* __restrict x, int64_t ldx,
                                                                 __m512 (&total)[MM]) {
        for (int64_t k0 = 0; k0 < K; k0 += KC) {
            const int64_t kc = std::min<int64_t>(KC, K - k0), pairs = ceil_div(kc, 2);
            __m512 acc[MM];
#pragma GCC unroll 8
            for (int m = 0; m < MM; ++m) acc[m] = _mm512_setzero_ps();
            for (int64_t p0 = 0; p0 < pairs; p0 += 16) {
                const int64_t n = std::min<int64_t>(16, pairs - p0), left = kc - 2 * p0;  // bf16 values left
                const __mmask32 mask = left >= 32 ? ~__mmask32(0) : __mmask32((uint64_t(1) << left) - 1);
                const bf16_t* wk = w + k0 + 2 * p0;
                __m512 t[16];
#pragma GCC unroll 16
                for (int j = 0; j < 16; ++j) {
                    if (j < rows) {
                        __builtin_prefetch(wk + j * K + 256);
                        t[j] = _mm512_castsi512_ps(_mm512_maskz_loadu_epi16(mask, wk + j * K));
                    } else {
                        t[j] = _mm512_setzero_ps();
                    }
                }
                Avx512::transpose(t);  // t[s]: pair s of the 16 rows
                const uint32_t* xk = x + (k0 >> 1) + p0;
                if (n == 16) {  // a whole tile: unrolled, so t stays in registers
#pragma GCC unroll 16
                    for (int s = 0; s < 16; ++s)
#pragma GCC unroll 8
                        for (int m = 0; m < MM; ++m)
                            acc[m] = _mm512_dpbf16_ps(acc[m], (__m512bh)_mm512_set1_epi32(int(xk[m * ldx + s])),
                                                      (__m512bh)t[s]);
                } else {
                    for (int s = 0; s < n; ++s)
#pragma GCC unroll 8
                        for (int m = 0; m < MM; ++m)
                            acc[m] = _mm512_dpbf16_ps(acc[m], (__m512bh)_mm512_set1_epi32(int(xk[m * ldx + s])),
                                                      (__m512bh)t[s]);
                }
            }
#pragma GCC unroll 8
            for (int m = 0; m < MM; ++m) total[m] = k0 == 0 ? acc[m] : _mm512_add_ps(acc[m], total[m]);
        }
    }
    template <class T>
    static void pack_b(const T* src, int64_t ld, int rows, int64_t kc, P* dst) {
        pack_pairs<NR>(src, ld, rows, kc, dst);
    }
};

using Avx512Bf16Kernel = Bf16DotKernel<14, 1024, 128>;

bool has_avx512bf16() {
    static const bool has = [] {
        __builtin_cpu_init();
        return __builtin_cpu_supports("avx512bf16") != 0;
    }();
    return has;
}

}  // namespace

void run_avx512(const Args& a) {
    switch (a.dtype) {
        case kF32: return run_typed<Avx512, Avx512Kernel, float>(a);
        case kF16: return run_typed<Avx512, Avx512Kernel, f16_t>(a);
        case kBF16:
            if (has_avx512bf16() && bf16dot_allowed())
                return run_typed<Avx512, Avx512Bf16Kernel, bf16_t>(a);
            return run_typed<Avx512, Avx512Kernel, bf16_t>(a);
        default: unsupported_dtype(a.dtype);
    }
}

}  // namespace llaisys::cpu::linear
