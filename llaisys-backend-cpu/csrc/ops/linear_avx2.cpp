// linear, AVX2 + FMA + F16C path (8 f32 lanes): 6 x 16 GEMM micro-kernel (12 accumulators).
#include <immintrin.h>

#include "linear_impl.h"

namespace llaisys::cpu::linear {

namespace {

struct Avx2 {
    using vec = __m256;
    static constexpr int W = 8;

    static inline vec zero() { return _mm256_setzero_ps(); }
    static inline vec set1(float f) { return _mm256_set1_ps(f); }
    static inline vec load(const float* p) { return _mm256_loadu_ps(p); }
    static inline vec load(const bf16_t* p) {
        __m256i h = _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
        return _mm256_castsi256_ps(_mm256_slli_epi32(h, 16));
    }
    static inline vec load(const f16_t* p) {
        return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
    }
    static inline vec fma(vec a, vec b, vec c) { return _mm256_fmadd_ps(a, b, c); }
    static inline vec add(vec a, vec b) { return _mm256_add_ps(a, b); }
    static inline float reduce(vec v) {
        __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
        s = _mm_add_ps(s, _mm_movehl_ps(s, s));
        s = _mm_add_ss(s, _mm_movehdup_ps(s));
        return _mm_cvtss_f32(s);
    }
    static inline void store(float* p, vec v) { _mm256_storeu_ps(p, v); }
    static inline void store(bf16_t* p, vec v) {
        const __m256i u = _mm256_castps_si256(v);
        const __m256i lsb = _mm256_and_si256(_mm256_srli_epi32(u, 16), _mm256_set1_epi32(1));
        __m256i r = _mm256_srli_epi32(_mm256_add_epi32(u, _mm256_add_epi32(_mm256_set1_epi32(0x7fff), lsb)), 16);
        const __m256i quiet = _mm256_or_si256(_mm256_srli_epi32(u, 16), _mm256_set1_epi32(0x40));
        r = _mm256_blendv_epi8(r, quiet, _mm256_castps_si256(_mm256_cmp_ps(v, v, _CMP_UNORD_Q)));
        const __m128i packed = _mm_packus_epi32(_mm256_castsi256_si128(r), _mm256_extracti128_si256(r, 1));
        _mm_storeu_si128(reinterpret_cast<__m128i*>(p), packed);
    }
    static inline void store(f16_t* p, vec v) {
        _mm_storeu_si128(reinterpret_cast<__m128i*>(p), _mm256_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT));
    }
    static inline float f16_to_f32(uint16_t h) { return _cvtsh_ss(h); }
    static inline uint16_t f32_to_f16(float f) { return uint16_t(_cvtss_sh(f, _MM_FROUND_TO_NEAREST_INT)); }

    static inline __m256i first(int64_t n) {
        return _mm256_cmpgt_epi32(_mm256_set1_epi32(int(n)), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
    }
    static inline vec load_n(const float* p, int64_t n) { return _mm256_maskload_ps(p, first(n)); }
    static inline void store_n(float* p, vec v, int64_t n) { _mm256_maskstore_ps(p, first(n), v); }
    template <class T> static inline vec load_n(const T* p, int64_t n) { return load_n_via_stack<Avx2>(p, n); }
    template <class T> static inline void store_n(T* p, vec v, int64_t n) { store_n_via_stack<Avx2>(p, v, n); }

    static inline void transpose(vec (&r)[8]) {
        vec t[8], s[8];
        for (int i = 0; i < 4; ++i) {
            t[2 * i] = _mm256_unpacklo_ps(r[2 * i], r[2 * i + 1]);
            t[2 * i + 1] = _mm256_unpackhi_ps(r[2 * i], r[2 * i + 1]);
        }
        for (int i = 0; i < 2; ++i) {  // s[4i + c], 128-bit lane L: rows 4i..4i+3 of column 4L + c
            s[4 * i + 0] = _mm256_shuffle_ps(t[4 * i], t[4 * i + 2], _MM_SHUFFLE(1, 0, 1, 0));
            s[4 * i + 1] = _mm256_shuffle_ps(t[4 * i], t[4 * i + 2], _MM_SHUFFLE(3, 2, 3, 2));
            s[4 * i + 2] = _mm256_shuffle_ps(t[4 * i + 1], t[4 * i + 3], _MM_SHUFFLE(1, 0, 1, 0));
            s[4 * i + 3] = _mm256_shuffle_ps(t[4 * i + 1], t[4 * i + 3], _MM_SHUFFLE(3, 2, 3, 2));
        }
        for (int c = 0; c < 4; ++c) {
            r[c] = _mm256_permute2f128_ps(s[c], s[4 + c], 0x20);
            r[4 + c] = _mm256_permute2f128_ps(s[c], s[4 + c], 0x31);
        }
    }
};

// 6 x 16 tile: 12 ymm accumulators + 2 B vectors + 1 broadcast.
using Avx2Kernel = F32Kernel<Avx2, 6, 2, 256, 256>;

}  // namespace

void run_avx2(const Args& a) {
    switch (a.dtype) {
        case kF32: return run_typed<Avx2, Avx2Kernel, float>(a);
        case kF16: return run_typed<Avx2, Avx2Kernel, f16_t>(a);
        case kBF16: return run_typed<Avx2, Avx2Kernel, bf16_t>(a);
        default: unsupported_dtype(a.dtype);
    }
}

}  // namespace llaisys::cpu::linear
