// Vec8 (8 f32 lanes in a ymm register) and Vec8i (8 x 32-bit integer lanes), for the avx2 and the avx512
// builds. With AVX-512 (VL + BW) masks are k-registers and partial loads / stores are masked; with AVX2 a
// mask is a vector of all-ones / all-zeros lanes, and 16-bit tails go through a small stack buffer.
#pragma once

#include <cstdint>
#include <cstring>
#include <type_traits>

#include "scalar.h"

namespace llaisys::cpu::LLAISYS_ISA {

struct Vec8i {
    __m256i r;
    Vec8i() = default;
    Vec8i(__m256i x) : r(x) {}
    explicit Vec8i(uint32_t c) : r(_mm256_set1_epi32(int(c))) {}
    static Vec8i load(const void* p) { return _mm256_loadu_si256(static_cast<const __m256i*>(p)); }  // 32 bytes
};
inline Vec8i operator+(Vec8i a, Vec8i b) { return _mm256_add_epi32(a.r, b.r); }
inline Vec8i operator&(Vec8i a, Vec8i b) { return _mm256_and_si256(a.r, b.r); }
inline Vec8i operator|(Vec8i a, Vec8i b) { return _mm256_or_si256(a.r, b.r); }
inline Vec8i operator^(Vec8i a, Vec8i b) { return _mm256_xor_si256(a.r, b.r); }
inline Vec8i operator>>(Vec8i a, int n) { return _mm256_srli_epi32(a.r, n); }  // logical
inline Vec8i operator<<(Vec8i a, int n) { return _mm256_slli_epi32(a.r, n); }
inline Vec8i sra(Vec8i a, int n) { return _mm256_srai_epi32(a.r, n); }  // arithmetic (sign-filling) shift right

#if defined(LLAISYS_ISA_AVX512)
using Mask8 = __mmask8;
#else
struct Mask8 {  // all-ones lanes where true
    __m256 m;
};
inline Mask8 operator|(Mask8 a, Mask8 b) { return Mask8{_mm256_or_ps(a.m, b.m)}; }
inline Mask8 operator&(Mask8 a, Mask8 b) { return Mask8{_mm256_and_ps(a.m, b.m)}; }
inline Mask8& operator|=(Mask8& a, Mask8 b) { return a = a | b; }
inline Mask8& operator&=(Mask8& a, Mask8 b) { return a = a & b; }
inline uint32_t bits(Mask8 a) { return uint32_t(_mm256_movemask_ps(a.m)); }
#endif

struct Vec8;
inline Vec8 as_f32(Vec8i a);  // (declared ahead: Vec8's members use it)

struct Vec8 {
    static constexpr int W = 8;
    using Mask = Mask8;
    using Int = Vec8i;
    __m256 r;

    Vec8() = default;
    Vec8(__m256 x) : r(x) {}
    static Vec8 zero() { return _mm256_setzero_ps(); }
    static Vec8 set1(float x) { return _mm256_set1_ps(x); }
    static Vec8 broadcast(const float* p) { return _mm256_broadcast_ss(p); }  // every lane = *p

    // lanes [0, n), 0 <= n <= W
    static Mask first(int n) {
#if defined(LLAISYS_ISA_AVX512)
        return Mask((1u << n) - 1u);
#else
        const __m256i lane = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
        return Mask{_mm256_castsi256_ps(_mm256_cmpgt_epi32(_mm256_set1_epi32(n), lane))};
#endif
    }

    static Vec8 load(const float* p) { return _mm256_loadu_ps(p); }
    template <class T> static Vec8 load(const T* p) { return widen(halves(p), p); }
    // 8 bytes as f32 lanes (exact): unsigned or signed integers (block scales, llaisys.ops.quant)
    static Vec8 load(const uint8_t* p) { return _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(bytes8(p))); }
    static Vec8 load(const int8_t* p) { return _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(bytes8(p))); }
    static __m128i bytes8(const void* p) { return _mm_loadl_epi64(static_cast<const __m128i*>(p)); }
    // lanes [0, n) from p, the rest 0; nothing past p + n is read
    static Vec8 load_partial(const float* p, int n) {
#if defined(LLAISYS_ISA_AVX512)
        return _mm256_maskz_loadu_ps(first(n), p);
#else
        return _mm256_maskload_ps(p, _mm256_castps_si256(first(n).m));
#endif
    }
    template <class T> static Vec8 load_partial(const T* p, int n) { return widen(halves_partial(p, n), p); }

    void store(float* p) const { _mm256_storeu_ps(p, r); }
    // lanes holding integers in [-128, 127] (e.g. rounded and clamped), as W bytes
    void store(int8_t* p) const {
        const __m256i i = _mm256_cvttps_epi32(r);
        const __m128i words = _mm_packs_epi32(_mm256_castsi256_si128(i), _mm256_extracti128_si256(i, 1));
        _mm_storel_epi64(reinterpret_cast<__m128i*>(p), _mm_packs_epi16(words, words));
    }
    template <class T> void store(T* p) const { _mm_storeu_si128(reinterpret_cast<__m128i*>(p), narrow(p)); }
    void store_partial(float* p, int n) const {
#if defined(LLAISYS_ISA_AVX512)
        _mm256_mask_storeu_ps(p, first(n), r);
#else
        _mm256_maskstore_ps(p, _mm256_castps_si256(first(n).m), r);
#endif
    }
    template <class T> void store_partial(T* p, int n) const {
#if defined(LLAISYS_ISA_AVX512)
        _mm_mask_storeu_epi16(p, first(n), narrow(p));
#else
        alignas(16) uint16_t buf[W];
        _mm_store_si128(reinterpret_cast<__m128i*>(buf), narrow(p));
        std::memcpy(static_cast<void*>(p), buf, sizeof(uint16_t) * size_t(n));
#endif
    }

    // the value after a round trip through T (round to nearest even), still in f32 lanes
    template <class T> Vec8 round_to() const;

    // 8 16-bit values (bf16 or f16 bits) <-> a 128-bit register
    static __m128i halves(const void* p) { return _mm_loadu_si128(static_cast<const __m128i*>(p)); }
    static __m128i halves_partial(const void* p, int n) {
#if defined(LLAISYS_ISA_AVX512)
        return _mm_maskz_loadu_epi16(first(n), p);
#else
        alignas(16) uint16_t buf[W] = {};
        std::memcpy(buf, p, sizeof(uint16_t) * size_t(n));
        return _mm_load_si128(reinterpret_cast<const __m128i*>(buf));
#endif
    }
    static Vec8 widen(__m128i h, const bf16_t*) { return widen_bf16(Vec8i(_mm256_cvtepu16_epi32(h))); }
    static Vec8 widen(__m128i h, const f16_t*) { return _mm256_cvtph_ps(h); }
    __m128i narrow(const bf16_t*) const;
    __m128i narrow(const f16_t*) const { return _mm256_cvtps_ph(r, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC); }
};

inline Vec8i bits_of(Vec8 a) { return _mm256_castps_si256(a.r); }
inline Vec8 as_f32(Vec8i a) { return _mm256_castsi256_ps(a.r); }
inline Vec8 int_to_f32(Vec8i a) { return _mm256_cvtepi32_ps(a.r); }  // the int32 lanes' values, rounded to f32

// Byte dot products (see vec512.h): lane i = acc[i] + sum over j < 4 of a.byte[4i + j] * b.byte[4i + j], int32;
// signed a (any) and signed b in [-127, 127], exact: vpmaddubsw on |a| and b with a's sign, vpmaddwd by 1.
inline Vec8i dot4_i8(Vec8i acc, Vec8i a, Vec8i b) {
    const __m256i pairs = _mm256_maddubs_epi16(_mm256_abs_epi8(a.r), _mm256_sign_epi8(b.r, a.r));
    return _mm256_add_epi32(acc.r, _mm256_madd_epi16(pairs, _mm256_set1_epi16(1)));
}
// dot4_u7i8: a in [0, 127] (4- and 6-bit codes), signed b in [-127, 127], exact: vpmaddubsw (2 * 127 * 127 fits
// int16 unsaturated) and vpmaddwd by 1.
inline Vec8i dot4_u7i8(Vec8i acc, Vec8i a, Vec8i b) {
    const __m256i pairs = _mm256_maddubs_epi16(a.r, b.r);
    return _mm256_add_epi32(acc.r, _mm256_madd_epi16(pairs, _mm256_set1_epi16(1)));
}

inline Vec8 operator+(Vec8 a, Vec8 b) { return _mm256_add_ps(a.r, b.r); }
inline Vec8 operator-(Vec8 a, Vec8 b) { return _mm256_sub_ps(a.r, b.r); }
inline Vec8 operator*(Vec8 a, Vec8 b) { return _mm256_mul_ps(a.r, b.r); }
inline Vec8 operator/(Vec8 a, Vec8 b) { return _mm256_div_ps(a.r, b.r); }
inline Vec8 fmadd(Vec8 a, Vec8 b, Vec8 c) { return _mm256_fmadd_ps(a.r, b.r, c.r); }    // a * b + c
inline Vec8 fnmadd(Vec8 a, Vec8 b, Vec8 c) { return _mm256_fnmadd_ps(a.r, b.r, c.r); }  // c - a * b
// a * b rounded to f32 even when an add follows: GCC contracts a * b + c into one FMA by default
// (-ffp-contract=fast), which torch's separate ops do not; use it where matching torch bit for bit matters.
inline Vec8 mul_unfused(Vec8 a, Vec8 b) {
    __m256 p = _mm256_mul_ps(a.r, b.r);
    __asm__("" : "+v"(p));
    return p;
}
inline Vec8 vmin(Vec8 a, Vec8 b) { return _mm256_min_ps(a.r, b.r); }  // b if either is NaN
inline Vec8 vmax(Vec8 a, Vec8 b) { return _mm256_max_ps(a.r, b.r); }  // b if either is NaN
inline Vec8 vsqrt(Vec8 a) { return _mm256_sqrt_ps(a.r); }
inline Vec8 round_nearest(Vec8 a) { return _mm256_round_ps(a.r, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC); }
// a * 2^n for integral n in [-252, 254] held in f32 lanes, rounded once: overflows to inf, underflows
// gradually (subnormals) to 0
inline Vec8 mul_pow2(Vec8 a, Vec8 n) {
#if defined(LLAISYS_ISA_AVX512)
    return _mm256_scalef_ps(a.r, n.r);
#else
    // 2^n as 2^h * 2^(n - h), h = n / 2 rounded down: both factors are normal numbers
    const __m256i ni = _mm256_cvtps_epi32(n.r), h = _mm256_srai_epi32(ni, 1), bias = _mm256_set1_epi32(127);
    const __m256 ph = _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(h, bias), 23));
    const __m256 pl = _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(_mm256_sub_epi32(ni, h), bias), 23));
    return _mm256_mul_ps(_mm256_mul_ps(a.r, ph), pl);
#endif
}
inline float reduce_add(Vec8 a) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(a.r), _mm256_extractf128_ps(a.r, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}
inline float reduce_max(Vec8 a) {
    __m128 s = _mm_max_ps(_mm256_castps256_ps128(a.r), _mm256_extractf128_ps(a.r, 1));
    s = _mm_max_ps(s, _mm_movehl_ps(s, s));
    s = _mm_max_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}
inline float lane0(Vec8 a) { return _mm256_cvtss_f32(a.r); }

#if defined(LLAISYS_ISA_AVX512)
inline Mask8 isnan_mask(Vec8 a) { return _mm256_cmp_ps_mask(a.r, a.r, _CMP_UNORD_Q); }
inline Mask8 eq_mask(Vec8 a, Vec8 b) { return _mm256_cmp_ps_mask(a.r, b.r, _CMP_EQ_OQ); }
inline Mask8 lt_mask(Vec8 a, Vec8 b) { return _mm256_cmp_ps_mask(a.r, b.r, _CMP_LT_OQ); }
inline Mask8 gt_mask(Vec8 a, Vec8 b) { return _mm256_cmp_ps_mask(a.r, b.r, _CMP_GT_OQ); }
inline Mask8 ge_mask(Vec8 a, Vec8 b) { return _mm256_cmp_ps_mask(a.r, b.r, _CMP_GE_OQ); }
inline Vec8 select(Mask8 m, Vec8 if_true, Vec8 if_false) { return _mm256_mask_blend_ps(m, if_false.r, if_true.r); }
inline Vec8i select(Mask8 m, Vec8i if_true, Vec8i if_false) { return _mm256_mask_blend_epi32(m, if_false.r, if_true.r); }
inline __m128i Vec8::narrow(const bf16_t*) const { return _mm256_cvtepi32_epi16(bf16_bits(*this).r); }
#else
inline Mask8 isnan_mask(Vec8 a) { return Mask8{_mm256_cmp_ps(a.r, a.r, _CMP_UNORD_Q)}; }
inline Mask8 eq_mask(Vec8 a, Vec8 b) { return Mask8{_mm256_cmp_ps(a.r, b.r, _CMP_EQ_OQ)}; }
inline Mask8 lt_mask(Vec8 a, Vec8 b) { return Mask8{_mm256_cmp_ps(a.r, b.r, _CMP_LT_OQ)}; }
inline Mask8 gt_mask(Vec8 a, Vec8 b) { return Mask8{_mm256_cmp_ps(a.r, b.r, _CMP_GT_OQ)}; }
inline Mask8 ge_mask(Vec8 a, Vec8 b) { return Mask8{_mm256_cmp_ps(a.r, b.r, _CMP_GE_OQ)}; }
inline Vec8 select(Mask8 m, Vec8 if_true, Vec8 if_false) { return _mm256_blendv_ps(if_false.r, if_true.r, m.m); }
inline Vec8i select(Mask8 m, Vec8i if_true, Vec8i if_false) {
    return _mm256_blendv_epi8(if_false.r, if_true.r, _mm256_castps_si256(m.m));
}
inline __m128i Vec8::narrow(const bf16_t*) const {
    const __m256i b = bf16_bits(*this).r;  // each lane <= 0xffff, so the unsigned saturating pack is exact
    return _mm_packus_epi32(_mm256_castsi256_si128(b), _mm256_extracti128_si256(b, 1));
}
#endif

template <class T> inline Vec8 Vec8::round_to() const {
    if constexpr (std::is_same_v<T, bf16_t>) return widen_bf16(bf16_bits(*this));
    else if constexpr (std::is_same_v<T, f16_t>) return _mm256_cvtph_ps(narrow(static_cast<const f16_t*>(nullptr)));
    else return *this;
}

// Lane j = the sum of the lanes of a[j] (a transpose folded into the adds).
inline Vec8 reduce_add_each(const Vec8 (&a)[8]) {
    __m256 t[4], u[2];
    for (int i = 0; i < 4; ++i)
        t[i] = _mm256_add_ps(_mm256_unpacklo_ps(a[2 * i].r, a[2 * i + 1].r), _mm256_unpackhi_ps(a[2 * i].r, a[2 * i + 1].r));
    for (int i = 0; i < 2; ++i) {
        const __m256d x = _mm256_castps_pd(t[2 * i]), y = _mm256_castps_pd(t[2 * i + 1]);
        u[i] = _mm256_add_ps(_mm256_castpd_ps(_mm256_unpacklo_pd(x, y)), _mm256_castpd_ps(_mm256_unpackhi_pd(x, y)));
    }
    return _mm256_add_ps(_mm256_permute2f128_ps(u[0], u[1], 0x20), _mm256_permute2f128_ps(u[0], u[1], 0x31));
}

}  // namespace llaisys::cpu::LLAISYS_ISA
