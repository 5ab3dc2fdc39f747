// 256-bit (AVX2 + FMA + F16C) traits for self_attention.h, included by self_attention_avx2.cpp and
// self_attention_avx512.cpp. Everything is in an anonymous namespace: each TU gets its own copy,
// compiled with its own -m flags (see the ODR note in self_attention.h).
#pragma once

#include <immintrin.h>

#include <cstdint>
#include <cstring>

#include "../common/dtype.h"  // the bf16_t / f16_t types only; its inline functions are not used here

namespace {

struct V256 {
    using vec = __m256;
    static constexpr int W = 8;
    static vec zero() { return _mm256_setzero_ps(); }
    static vec set1(float x) { return _mm256_set1_ps(x); }
    static vec load(const float* p) { return _mm256_loadu_ps(p); }
    static void store(float* p, vec x) { _mm256_storeu_ps(p, x); }
    static vec bcast(const float* p) { return _mm256_broadcast_ss(p); }
    static vec fma(vec a, vec b, vec c) { return _mm256_fmadd_ps(a, b, c); }
    static vec add(vec a, vec b) { return _mm256_add_ps(a, b); }
    static vec sub(vec a, vec b) { return _mm256_sub_ps(a, b); }
    static vec mul(vec a, vec b) { return _mm256_mul_ps(a, b); }
    static vec max(vec a, vec b) { return _mm256_max_ps(a, b); }
    static vec min(vec a, vec b) { return _mm256_min_ps(a, b); }
    static vec round(vec x) { return _mm256_round_ps(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC); }
    static vec pow2(vec n) {  // 2^n for integral n in [-126, 127]
        const __m256i e = _mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127));
        return _mm256_castsi256_ps(_mm256_slli_epi32(e, 23));
    }
    static vec select_lt(vec x, vec y, vec a, vec b) {  // x < y ? a : b
        return _mm256_blendv_ps(b, a, _mm256_cmp_ps(x, y, _CMP_LT_OQ));
    }
    // r[j] = sum of the lanes of a[j], j < 8 (transpose-add)
    static vec hsum(const vec* a) {
        vec t[4];
        for (int i = 0; i < 4; ++i)
            t[i] = _mm256_add_ps(_mm256_unpacklo_ps(a[2 * i], a[2 * i + 1]), _mm256_unpackhi_ps(a[2 * i], a[2 * i + 1]));
        vec u[2];
        for (int i = 0; i < 2; ++i) {
            const __m256d x = _mm256_castps_pd(t[2 * i]), y = _mm256_castps_pd(t[2 * i + 1]);
            u[i] = _mm256_add_ps(_mm256_castpd_ps(_mm256_unpacklo_pd(x, y)), _mm256_castpd_ps(_mm256_unpackhi_pd(x, y)));
        }
        return _mm256_add_ps(_mm256_permute2f128_ps(u[0], u[1], 0x20), _mm256_permute2f128_ps(u[0], u[1], 0x31));
    }
};

// f32 -> bf16, round to nearest even, NaN stays (quiet) NaN; 8 lanes -> 8 x u16.
inline __m128i f32_to_bf16x8(__m256 x) {
    const __m256i u = _mm256_castps_si256(x);
    const __m256i odd = _mm256_and_si256(_mm256_srli_epi32(u, 16), _mm256_set1_epi32(1));
    __m256i r = _mm256_srli_epi32(_mm256_add_epi32(_mm256_add_epi32(u, _mm256_set1_epi32(0x7fff)), odd), 16);
    const __m256i qnan = _mm256_or_si256(_mm256_srli_epi32(u, 16), _mm256_set1_epi32(0x40));
    r = _mm256_castps_si256(_mm256_blendv_ps(_mm256_castsi256_ps(r), _mm256_castsi256_ps(qnan),
                                             _mm256_cmp_ps(x, x, _CMP_UNORD_Q)));
    const __m256i packed = _mm256_permute4x64_epi64(_mm256_packus_epi32(r, r), 0x08);
    return _mm256_castsi256_si128(packed);
}

// Row converters (n elements, any n) built on 8-lane ops; tails go through a small buffer.
struct Cvt256 {
    template <class T>
    static void load_row(const T* src, float* dst, int64_t n) {
        if constexpr (sizeof(T) == 4) {
            std::memcpy(dst, src, sizeof(float) * n);
        } else {
            int64_t i = 0;
            for (; i + 8 <= n; i += 8)
                _mm256_storeu_ps(dst + i, expand(_mm_loadu_si128(reinterpret_cast<const __m128i*>(src + i)), src));
            if (i < n) {
                alignas(16) uint16_t tmp[8] = {0, 0, 0, 0, 0, 0, 0, 0};
                alignas(32) float f[8];
                std::memcpy(tmp, src + i, sizeof(uint16_t) * (n - i));
                _mm256_store_ps(f, expand(_mm_load_si128(reinterpret_cast<const __m128i*>(tmp)), src));
                std::memcpy(dst + i, f, sizeof(float) * (n - i));
            }
        }
    }

    template <class T>
    static void store_row(const float* src, T* dst, int64_t n) {
        if constexpr (sizeof(T) == 4) {
            std::memcpy(dst, src, sizeof(float) * n);
        } else {
            int64_t i = 0;
            for (; i + 8 <= n; i += 8)
                _mm_storeu_si128(reinterpret_cast<__m128i*>(dst + i), narrow(_mm256_loadu_ps(src + i), dst));
            if (i < n) {
                alignas(32) float f[8] = {0, 0, 0, 0, 0, 0, 0, 0};
                alignas(16) uint16_t tmp[8];
                std::memcpy(f, src + i, sizeof(float) * (n - i));
                _mm_store_si128(reinterpret_cast<__m128i*>(tmp), narrow(_mm256_load_ps(f), dst));
                std::memcpy(dst + i, tmp, sizeof(uint16_t) * (n - i));
            }
        }
    }

    static __m256 expand(__m128i h, const llaisys::bf16_t*) {
        return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
    }
    static __m256 expand(__m128i h, const llaisys::f16_t*) { return _mm256_cvtph_ps(h); }
    static __m128i narrow(__m256 x, const llaisys::bf16_t*) { return f32_to_bf16x8(x); }
    static __m128i narrow(__m256 x, const llaisys::f16_t*) {
        return _mm256_cvtps_ph(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    }
};

}  // namespace
