// Vec16 (16 f32 lanes in a zmm register) and Vec16i (16 x 32-bit integer lanes), avx512 build only.
// Masks are k-registers; partial loads and stores are masked (never touch memory past the n lanes).
// With AVX512-BF16 (checked at run time, see has_feature), dot_bf16_pairs multiplies bf16 pairs.
#pragma once

#include <cstdint>
#include <type_traits>

#include "scalar.h"

namespace llaisys::cpu::LLAISYS_ISA {

struct Vec16i {
    __m512i r;
    Vec16i() = default;
    Vec16i(__m512i x) : r(x) {}
    explicit Vec16i(uint32_t c) : r(_mm512_set1_epi32(int(c))) {}
    static Vec16i load(const void* p) { return _mm512_loadu_si512(p); }  // 64 bytes
    // the first n (<= 32) 16-bit values at p, the rest 0 (lane i holds values 2i and 2i + 1)
    static Vec16i load_halves_partial(const void* p, int n) {
        return _mm512_maskz_loadu_epi16(__mmask32((uint64_t(1) << n) - 1), p);
    }
};
inline Vec16i operator+(Vec16i a, Vec16i b) { return _mm512_add_epi32(a.r, b.r); }
inline Vec16i operator&(Vec16i a, Vec16i b) { return _mm512_and_si512(a.r, b.r); }
inline Vec16i operator|(Vec16i a, Vec16i b) { return _mm512_or_si512(a.r, b.r); }
inline Vec16i operator^(Vec16i a, Vec16i b) { return _mm512_xor_si512(a.r, b.r); }
inline Vec16i operator>>(Vec16i a, int n) { return _mm512_srli_epi32(a.r, unsigned(n)); }  // logical
inline Vec16i operator<<(Vec16i a, int n) { return _mm512_slli_epi32(a.r, unsigned(n)); }
inline Vec16i sra(Vec16i a, int n) { return _mm512_srai_epi32(a.r, unsigned(n)); }  // arithmetic (sign-filling)

struct Vec16;
inline Vec16 as_f32(Vec16i a);  // (declared ahead: Vec16's members use it)

struct Vec16 {
    static constexpr int W = 16;
    using Mask = __mmask16;
    using Int = Vec16i;
    __m512 r;

    Vec16() = default;
    Vec16(__m512 x) : r(x) {}
    static Vec16 zero() { return _mm512_setzero_ps(); }
    static Vec16 set1(float x) { return _mm512_set1_ps(x); }
    static Vec16 broadcast(const float* p) { return _mm512_set1_ps(*p); }  // every lane = *p
    static Mask first(int n) { return Mask((1u << n) - 1u); }  // lanes [0, n), 0 <= n <= W

    static Vec16 load(const float* p) { return _mm512_loadu_ps(p); }
    template <class T> static Vec16 load(const T* p) {
        return widen(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)), p);
    }
    // 16 bytes as f32 lanes (exact): unsigned or signed integers (block scales, llaisys.ops.quant)
    static Vec16 load(const uint8_t* p) { return _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(bytes16(p))); }
    static Vec16 load(const int8_t* p) { return _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(bytes16(p))); }
    static __m128i bytes16(const void* p) { return _mm_loadu_si128(static_cast<const __m128i*>(p)); }
    // lanes [0, n) from p, the rest 0; nothing past p + n is read
    static Vec16 load_partial(const float* p, int n) { return _mm512_maskz_loadu_ps(first(n), p); }
    template <class T> static Vec16 load_partial(const T* p, int n) {
        return widen(_mm256_maskz_loadu_epi16(first(n), p), p);
    }

    void store(float* p) const { _mm512_storeu_ps(p, r); }
    template <class T> void store(T* p) const { _mm256_storeu_si256(reinterpret_cast<__m256i*>(p), narrow(p)); }
    // lanes holding integers in [-128, 127] (e.g. rounded and clamped), as W bytes
    void store(int8_t* p) const {
        _mm_storeu_si128(reinterpret_cast<__m128i*>(p), _mm512_cvtepi32_epi8(_mm512_cvttps_epi32(r)));
    }
    void store_partial(float* p, int n) const { _mm512_mask_storeu_ps(p, first(n), r); }
    template <class T> void store_partial(T* p, int n) const { _mm256_mask_storeu_epi16(p, first(n), narrow(p)); }

    // the value after a round trip through T (round to nearest even), still in f32 lanes
    template <class T> Vec16 round_to() const;

    // 16 16-bit values (bf16 or f16 bits) <-> f32 lanes
    static Vec16 widen(__m256i h, const bf16_t*) { return widen_bf16(Vec16i(_mm512_cvtepu16_epi32(h))); }
    static Vec16 widen(__m256i h, const f16_t*) { return _mm512_cvtph_ps(h); }
    __m256i narrow(const bf16_t*) const;
    __m256i narrow(const f16_t*) const { return _mm512_cvtps_ph(r, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC); }
};

inline Vec16i bits_of(Vec16 a) { return _mm512_castps_si512(a.r); }
inline Vec16 as_f32(Vec16i a) { return _mm512_castsi512_ps(a.r); }
inline Vec16 int_to_f32(Vec16i a) { return _mm512_cvtepi32_ps(a.r); }  // the int32 lanes' values, rounded to f32

inline Vec16 operator+(Vec16 a, Vec16 b) { return _mm512_add_ps(a.r, b.r); }
inline Vec16 operator-(Vec16 a, Vec16 b) { return _mm512_sub_ps(a.r, b.r); }
inline Vec16 operator*(Vec16 a, Vec16 b) { return _mm512_mul_ps(a.r, b.r); }
inline Vec16 operator/(Vec16 a, Vec16 b) { return _mm512_div_ps(a.r, b.r); }
inline Vec16 fmadd(Vec16 a, Vec16 b, Vec16 c) { return _mm512_fmadd_ps(a.r, b.r, c.r); }    // a * b + c
inline Vec16 fnmadd(Vec16 a, Vec16 b, Vec16 c) { return _mm512_fnmadd_ps(a.r, b.r, c.r); }  // c - a * b
// a * b rounded to f32 even when an add follows (see vec256.h)
inline Vec16 mul_unfused(Vec16 a, Vec16 b) {
    __m512 p = _mm512_mul_ps(a.r, b.r);
    __asm__("" : "+v"(p));
    return p;
}
inline Vec16 vmin(Vec16 a, Vec16 b) { return _mm512_min_ps(a.r, b.r); }  // b if either is NaN
inline Vec16 vmax(Vec16 a, Vec16 b) { return _mm512_max_ps(a.r, b.r); }  // b if either is NaN
inline Vec16 vsqrt(Vec16 a) { return _mm512_sqrt_ps(a.r); }
inline Vec16 round_nearest(Vec16 a) { return _mm512_roundscale_ps(a.r, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC); }
// a * 2^n for integral n held in f32 lanes (vscalefps), rounded once: overflows to inf, underflows
// gradually (subnormals) to 0
inline Vec16 mul_pow2(Vec16 a, Vec16 n) { return _mm512_scalef_ps(a.r, n.r); }
inline float reduce_add(Vec16 a) {
    const __m256 hi = _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(a.r), 1));
    const __m256 s8 = _mm256_add_ps(_mm512_castps512_ps256(a.r), hi);
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(s8), _mm256_extractf128_ps(s8, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}
// Lane k = reduce_add(a[k]) bit for bit, 16 at once: the same additions in the same pairs (lane l + l + 8,
// then + 4, + 2, + 1), with the shuffles shared (45 instructions instead of 16 x 8).
inline Vec16 reduce_add_x16(const Vec16 (&a)[16]) {
    __m512 b[8], c[4], d[2];
    for (int i = 0; i < 8; ++i)  // b[i] = [a[2i] lanes l + l+8 | a[2i+1] lanes l + l+8], l < 8
        b[i] = _mm512_add_ps(_mm512_shuffle_f32x4(a[2 * i].r, a[2 * i + 1].r, 0x44),
                             _mm512_shuffle_f32x4(a[2 * i].r, a[2 * i + 1].r, 0xEE));
    for (int i = 0; i < 4; ++i)  // 128-bit lane q of c[i]: the 4 partial sums (+ 4) of a[4i + q]
        c[i] = _mm512_add_ps(_mm512_shuffle_f32x4(b[2 * i], b[2 * i + 1], 0x88),
                             _mm512_shuffle_f32x4(b[2 * i], b[2 * i + 1], 0xDD));
    for (int i = 0; i < 2; ++i)  // lane q of d[i]: (+ 2) of a[8i + q] (2 values), then of a[8i + 4 + q]
        d[i] = _mm512_add_ps(_mm512_shuffle_ps(c[2 * i], c[2 * i + 1], 0x44),
                             _mm512_shuffle_ps(c[2 * i], c[2 * i + 1], 0xEE));
    // lane 4q + r: the sum of a[4r + q]; then reordered to lane k = the sum of a[k]
    const __m512 e = _mm512_add_ps(_mm512_shuffle_ps(d[0], d[1], 0x88), _mm512_shuffle_ps(d[0], d[1], 0xDD));
    const __m512i order = _mm512_setr_epi32(0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15);
    return _mm512_permutexvar_ps(order, e);
}
inline float reduce_max(Vec16 a) { return _mm512_reduce_max_ps(a.r); }
inline float lane0(Vec16 a) { return _mm512_cvtss_f32(a.r); }

inline __mmask16 isnan_mask(Vec16 a) { return _mm512_cmp_ps_mask(a.r, a.r, _CMP_UNORD_Q); }
inline __mmask16 eq_mask(Vec16 a, Vec16 b) { return _mm512_cmp_ps_mask(a.r, b.r, _CMP_EQ_OQ); }
inline __mmask16 lt_mask(Vec16 a, Vec16 b) { return _mm512_cmp_ps_mask(a.r, b.r, _CMP_LT_OQ); }
inline __mmask16 gt_mask(Vec16 a, Vec16 b) { return _mm512_cmp_ps_mask(a.r, b.r, _CMP_GT_OQ); }
inline __mmask16 ge_mask(Vec16 a, Vec16 b) { return _mm512_cmp_ps_mask(a.r, b.r, _CMP_GE_OQ); }
inline Vec16 select(__mmask16 m, Vec16 if_true, Vec16 if_false) { return _mm512_mask_blend_ps(m, if_false.r, if_true.r); }
inline Vec16i select(__mmask16 m, Vec16i if_true, Vec16i if_false) {
    return _mm512_mask_blend_epi32(m, if_false.r, if_true.r);
}

inline __m256i Vec16::narrow(const bf16_t*) const { return _mm512_cvtepi32_epi16(bf16_bits(*this).r); }
template <class T> inline Vec16 Vec16::round_to() const {
    if constexpr (std::is_same_v<T, bf16_t>) return widen_bf16(bf16_bits(*this));
    else if constexpr (std::is_same_v<T, f16_t>) return _mm512_cvtph_ps(narrow(static_cast<const f16_t*>(nullptr)));
    else return *this;
}

// acc + a[2i] * b[2i] + a[2i + 1] * b[2i + 1] in f32 lane i, for a and b holding 16 pairs of bf16 values
// (vdpbf16ps: exact products, f32 sums; like every AVX512-BF16 op it reads bf16 subnormals as zero).
// Only for CPUs with AVX512-BF16 (has_feature(Feature::kBf16Pairs)); the caller carries
// LLAISYS_TARGET_BF16_PAIRS too.
LLAISYS_TARGET_BF16_PAIRS inline Vec16 dot_bf16_pairs(Vec16 acc, Vec16i a, Vec16i b) {
    return _mm512_dpbf16_ps(acc.r, (__m512bh)a.r, (__m512bh)b.r);
}

// Byte dot products, 4 bytes per 32-bit lane: lane i of the result = acc[i] + sum over j < 4 of
// a.byte[4i + j] * b.byte[4i + j], in int32.
// dot4_i8: signed a (any) and signed b in [-127, 127] (not -128), exact. Without VNNI: vpmaddubsw on |a| and b
// with a's sign (|a| <= 128, so each pair of products fits int16 unsaturated) and vpmaddwd by 1.
inline Vec16i dot4_i8(Vec16i acc, Vec16i a, Vec16i b) {
    const __m512i b_signed = _mm512_mask_sub_epi8(b.r, _mm512_movepi8_mask(a.r), _mm512_setzero_si512(), b.r);
    const __m512i pairs = _mm512_maddubs_epi16(_mm512_abs_epi8(a.r), b_signed);
    return _mm512_add_epi32(acc.r, _mm512_madd_epi16(pairs, _mm512_set1_epi16(1)));
}
// dot4_u7i8: a in [0, 127] (4- and 6-bit codes), signed b in [-127, 127], exact without VNNI: vpmaddubsw (no
// saturation: 2 * 127 * 127 < 32767) and vpmaddwd by 1.
inline Vec16i dot4_u7i8(Vec16i acc, Vec16i a, Vec16i b) {
    const __m512i pairs = _mm512_maddubs_epi16(a.r, b.r);
    return _mm512_add_epi32(acc.r, _mm512_madd_epi16(pairs, _mm512_set1_epi16(1)));
}
// dot4_u8i8: unsigned a, signed b, exact (vpdpbusd). Only for CPUs with AVX512-VNNI
// (has_feature(Feature::kAvx512Vnni)); written as inline assembly so that it inlines into code compiled for
// plain AVX-512 (GCC refuses to inline a target("avx512vnni") intrinsic there).
inline Vec16i dot4_u8i8(Vec16i acc, Vec16i a, Vec16i b) {
    __asm__("vpdpbusd %2, %1, %0" : "+v"(acc.r) : "v"(a.r), "v"(b.r));
    return acc;
}
// dot4_u8i8 with b = the 4 signed bytes at p in every lane, broadcast by the instruction itself ({1to16}: no
// separate broadcast, which the block linears would pay once per dot product).
inline Vec16i dot4_u8i8_bcast(Vec16i acc, Vec16i a, const int8_t* p) {
    __asm__("vpdpbusd %2%{1to16%}, %1, %0" : "+v"(acc.r) : "v"(a.r), "m"(*reinterpret_cast<const uint32_t*>(p)));
    return acc;
}

}  // namespace llaisys::cpu::LLAISYS_ISA
