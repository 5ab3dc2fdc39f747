// Vec8 (8 f32 lanes) and Vec8i (8 x 32-bit integer lanes) in AArch64 Advanced SIMD (NEON), for the neon and
// dotprod builds. A NEON register holds 4 f32 lanes (128 bits); Vec8 is a pair of them (lo: lanes 0..3, hi: lanes
// 4..7), as the portable Vec8 is a pair of SSE registers on x86-64, so every kernel written over Vec8 / Vec8i (the
// tiles, the block formats' 16-row halves, attention's row and lane forms) runs unchanged. Most ops' register
// tiles take their portable sizes in these builds (self_attention its avx2 ones): AArch64's 32 vector registers
// hold 16 Vec8, as AVX2's 16 ymm do, but tiles sized for them want ARM hardware to measure on.
//
// The interface of vec256.h (see simd.h) with the avx2 build's arithmetic: fmadd / fnmadd fused (fmla / fmls),
// f16 <-> f32 through the base ISA's fcvtl / fcvtn (exact widening, round to nearest even), bf16 through the
// shared bit rounding of scalar.h; vmin / vmax return the second operand when either is NaN (as x86's minps /
// maxps, unlike NEON's fmin / fmax); reduce_add and reduce_max combine the lanes in the same pairs as vec256.h
// (reduce_add_each in its own order, as vec256.h's differs from its reduce_add too).
// Partial loads and stores touch lanes [0, n) only, through a small stack buffer. Byte dot products: sdot
// (vdotq_s32) in the dotprod build, else smull + pairwise adds; both exact.
#pragma once

#include <arm_neon.h>

#include <cstdint>
#include <cstring>
#include <type_traits>

#include "scalar.h"

namespace llaisys::cpu::LLAISYS_ISA {

struct Vec8i {
    uint32x4_t lo, hi;
    Vec8i() = default;
    Vec8i(uint32x4_t l, uint32x4_t h) : lo(l), hi(h) {}
    explicit Vec8i(uint32_t c) : lo(vdupq_n_u32(c)), hi(vdupq_n_u32(c)) {}
    static Vec8i load(const void* p) {  // 32 bytes
        const uint8_t* b = static_cast<const uint8_t*>(p);
        return {vreinterpretq_u32_u8(vld1q_u8(b)), vreinterpretq_u32_u8(vld1q_u8(b + 16))};
    }
    static Vec8i load_halves_partial(const void* p, int n) {  // n of 16 16-bit values, the rest 0
        uint16_t buf[16] = {};
        std::memcpy(buf, p, sizeof(uint16_t) * size_t(n));
        return load(buf);
    }
};
inline Vec8i operator+(Vec8i a, Vec8i b) { return {vaddq_u32(a.lo, b.lo), vaddq_u32(a.hi, b.hi)}; }
inline Vec8i operator&(Vec8i a, Vec8i b) { return {vandq_u32(a.lo, b.lo), vandq_u32(a.hi, b.hi)}; }
inline Vec8i operator|(Vec8i a, Vec8i b) { return {vorrq_u32(a.lo, b.lo), vorrq_u32(a.hi, b.hi)}; }
inline Vec8i operator^(Vec8i a, Vec8i b) { return {veorq_u32(a.lo, b.lo), veorq_u32(a.hi, b.hi)}; }
// Shifts by a count that is a constant once inlined (GCC then emits the immediate forms).
inline Vec8i operator>>(Vec8i a, int n) {  // logical
    const int32x4_t s = vdupq_n_s32(-n);
    return {vshlq_u32(a.lo, s), vshlq_u32(a.hi, s)};
}
inline Vec8i operator<<(Vec8i a, int n) {
    const int32x4_t s = vdupq_n_s32(n);
    return {vshlq_u32(a.lo, s), vshlq_u32(a.hi, s)};
}
inline Vec8i sra(Vec8i a, int n) {  // arithmetic (sign-filling) shift right
    const int32x4_t s = vdupq_n_s32(-n);
    return {vreinterpretq_u32_s32(vshlq_s32(vreinterpretq_s32_u32(a.lo), s)),
            vreinterpretq_u32_s32(vshlq_s32(vreinterpretq_s32_u32(a.hi), s))};
}

struct Mask8 {  // all-ones lanes where true
    uint32x4_t lo, hi;
};
inline Mask8 operator|(Mask8 a, Mask8 b) { return Mask8{vorrq_u32(a.lo, b.lo), vorrq_u32(a.hi, b.hi)}; }
inline Mask8 operator&(Mask8 a, Mask8 b) { return Mask8{vandq_u32(a.lo, b.lo), vandq_u32(a.hi, b.hi)}; }
inline Mask8& operator|=(Mask8& a, Mask8 b) { return a = a | b; }
inline Mask8& operator&=(Mask8& a, Mask8 b) { return a = a & b; }
inline uint32_t bits(Mask8 a) {  // bit i = lane i
    static constexpr uint32_t kLow[4] = {1, 2, 4, 8}, kHigh[4] = {16, 32, 64, 128};
    return vaddvq_u32(vandq_u32(a.lo, vld1q_u32(kLow))) + vaddvq_u32(vandq_u32(a.hi, vld1q_u32(kHigh)));
}

struct Vec8;
inline Vec8 as_f32(Vec8i a);  // (declared ahead: Vec8's members use it)

struct Vec8 {
    static constexpr int W = 8;
    using Mask = Mask8;
    using Int = Vec8i;
    float32x4_t lo, hi;

    Vec8() = default;
    Vec8(float32x4_t l, float32x4_t h) : lo(l), hi(h) {}
    static Vec8 zero() { return set1(0.0f); }
    static Vec8 set1(float x) { return {vdupq_n_f32(x), vdupq_n_f32(x)}; }
    static Vec8 broadcast(const float* p) {  // every lane = *p
        const float32x4_t v = vld1q_dup_f32(p);
        return {v, v};
    }
    // lanes [0, n), 0 <= n <= W
    static Mask first(int n) {
        static constexpr uint32_t kLanes[8] = {0, 1, 2, 3, 4, 5, 6, 7};
        const uint32x4_t limit = vdupq_n_u32(uint32_t(n));
        return Mask{vcltq_u32(vld1q_u32(kLanes), limit), vcltq_u32(vld1q_u32(kLanes + 4), limit)};
    }

    static Vec8 load(const float* p) { return {vld1q_f32(p), vld1q_f32(p + 4)}; }
    template <class T> static Vec8 load(const T* p) { return widen(vld1q_u16(reinterpret_cast<const uint16_t*>(p)), p); }
    // 8 bytes as f32 lanes (exact): unsigned or signed integers (block scales, llaisys.ops.quant)
    static Vec8 load(const uint8_t* p) {
        const uint16x8_t w = vmovl_u8(vld1_u8(p));
        return {vcvtq_f32_u32(vmovl_u16(vget_low_u16(w))), vcvtq_f32_u32(vmovl_high_u16(w))};
    }
    static Vec8 load(const int8_t* p) {
        const int16x8_t w = vmovl_s8(vld1_s8(p));
        return {vcvtq_f32_s32(vmovl_s16(vget_low_s16(w))), vcvtq_f32_s32(vmovl_high_s16(w))};
    }
    // lanes [0, n) from p, the rest 0; nothing past p + n is read
    static Vec8 load_partial(const float* p, int n) {
        float buf[W] = {};
        std::memcpy(buf, p, sizeof(float) * size_t(n));
        return load(buf);
    }
    template <class T> static Vec8 load_partial(const T* p, int n) {
        uint16_t buf[W] = {};
        std::memcpy(buf, static_cast<const void*>(p), sizeof(uint16_t) * size_t(n));
        return widen(vld1q_u16(buf), p);
    }

    void store(float* p) const {
        vst1q_f32(p, lo);
        vst1q_f32(p + 4, hi);
    }
    // lanes holding integers in [-128, 127] (e.g. rounded and clamped), as W bytes (truncated, saturated: as
    // x86's cvttps + packs)
    void store(int8_t* p) const {
        const int16x8_t words = vcombine_s16(vqmovn_s32(vcvtq_s32_f32(lo)), vqmovn_s32(vcvtq_s32_f32(hi)));
        vst1_s8(p, vqmovn_s16(words));
    }
    template <class T> void store(T* p) const { vst1q_u16(reinterpret_cast<uint16_t*>(p), narrow(p)); }
    void store_partial(float* p, int n) const {
        float buf[W];
        store(buf);
        std::memcpy(p, buf, sizeof(float) * size_t(n));
    }
    template <class T> void store_partial(T* p, int n) const {
        uint16_t buf[W];
        vst1q_u16(buf, narrow(p));
        std::memcpy(static_cast<void*>(p), buf, sizeof(uint16_t) * size_t(n));
    }

    // the value after a round trip through T (round to nearest even), still in f32 lanes
    template <class T> Vec8 round_to() const;

    // 8 16-bit values (bf16 or f16 bits) <-> f32 lanes
    static Vec8 widen(uint16x8_t h, const bf16_t*) {
        return {vreinterpretq_f32_u32(vshll_n_u16(vget_low_u16(h), 16)), vreinterpretq_f32_u32(vshll_high_n_u16(h, 16))};
    }
    static Vec8 widen(uint16x8_t h, const f16_t*) {
        const float16x8_t f = vreinterpretq_f16_u16(h);
        return {vcvt_f32_f16(vget_low_f16(f)), vcvt_high_f32_f16(f)};
    }
    uint16x8_t narrow(const bf16_t*) const;
    uint16x8_t narrow(const f16_t*) const { return vreinterpretq_u16_f16(vcvt_high_f16_f32(vcvt_f16_f32(lo), hi)); }
};

inline Vec8i bits_of(Vec8 a) { return {vreinterpretq_u32_f32(a.lo), vreinterpretq_u32_f32(a.hi)}; }
inline Vec8 as_f32(Vec8i a) { return {vreinterpretq_f32_u32(a.lo), vreinterpretq_f32_u32(a.hi)}; }
inline Vec8 int_to_f32(Vec8i a) {  // the int32 lanes' values, rounded to f32
    return {vcvtq_f32_s32(vreinterpretq_s32_u32(a.lo)), vcvtq_f32_s32(vreinterpretq_s32_u32(a.hi))};
}

// Byte dot products (see vec512.h): lane i = acc[i] + sum over j < 4 of a.byte[4i + j] * b.byte[4i + j], int32,
// exact. dot4_i8: signed a and b; dot4_u7i8: a in [0, 127] (4- and 6-bit codes), so the same signed product.
inline int32x4_t dot4_i8_q(int32x4_t acc, uint32x4_t a, uint32x4_t b) {
    const int8x16_t x = vreinterpretq_s8_u32(a), y = vreinterpretq_s8_u32(b);
#if defined(__ARM_FEATURE_DOTPROD)
    return vdotq_s32(acc, x, y);  // sdot
#else
    // 16 products in int16 (|product| <= 2^14), pairwise widened to int32, then pairs of pairs: lane i
    const int32x4_t low = vpaddlq_s16(vmull_s8(vget_low_s8(x), vget_low_s8(y)));
    const int32x4_t high = vpaddlq_s16(vmull_high_s8(x, y));
    return vaddq_s32(acc, vpaddq_s32(low, high));
#endif
}
inline Vec8i dot4_i8(Vec8i acc, Vec8i a, Vec8i b) {
    return {vreinterpretq_u32_s32(dot4_i8_q(vreinterpretq_s32_u32(acc.lo), a.lo, b.lo)),
            vreinterpretq_u32_s32(dot4_i8_q(vreinterpretq_s32_u32(acc.hi), a.hi, b.hi))};
}
inline Vec8i dot4_u7i8(Vec8i acc, Vec8i a, Vec8i b) { return dot4_i8(acc, a, b); }

inline Vec8 operator+(Vec8 a, Vec8 b) { return {vaddq_f32(a.lo, b.lo), vaddq_f32(a.hi, b.hi)}; }
inline Vec8 operator-(Vec8 a, Vec8 b) { return {vsubq_f32(a.lo, b.lo), vsubq_f32(a.hi, b.hi)}; }
inline Vec8 operator*(Vec8 a, Vec8 b) { return {vmulq_f32(a.lo, b.lo), vmulq_f32(a.hi, b.hi)}; }
inline Vec8 operator/(Vec8 a, Vec8 b) { return {vdivq_f32(a.lo, b.lo), vdivq_f32(a.hi, b.hi)}; }
inline Vec8 fmadd(Vec8 a, Vec8 b, Vec8 c) {  // a * b + c, one rounding (fmla)
    return {vfmaq_f32(c.lo, a.lo, b.lo), vfmaq_f32(c.hi, a.hi, b.hi)};
}
inline Vec8 fnmadd(Vec8 a, Vec8 b, Vec8 c) {  // c - a * b, one rounding (fmls)
    return {vfmsq_f32(c.lo, a.lo, b.lo), vfmsq_f32(c.hi, a.hi, b.hi)};
}
// a * b rounded to f32 even when an add follows (GCC contracts a * b + c into fmla by default; see vec256.h)
inline Vec8 mul_unfused(Vec8 a, Vec8 b) {
    float32x4_t lo = vmulq_f32(a.lo, b.lo), hi = vmulq_f32(a.hi, b.hi);
    __asm__("" : "+w"(lo), "+w"(hi));
    return {lo, hi};
}
// b if either is NaN (x86's minps / maxps; NEON's fmin / fmax would return the NaN)
inline Vec8 vmin(Vec8 a, Vec8 b) {
    return {vbslq_f32(vcltq_f32(a.lo, b.lo), a.lo, b.lo), vbslq_f32(vcltq_f32(a.hi, b.hi), a.hi, b.hi)};
}
inline Vec8 vmax(Vec8 a, Vec8 b) {
    return {vbslq_f32(vcgtq_f32(a.lo, b.lo), a.lo, b.lo), vbslq_f32(vcgtq_f32(a.hi, b.hi), a.hi, b.hi)};
}
inline Vec8 vsqrt(Vec8 a) { return {vsqrtq_f32(a.lo), vsqrtq_f32(a.hi)}; }
inline Vec8 round_nearest(Vec8 a) { return {vrndnq_f32(a.lo), vrndnq_f32(a.hi)}; }  // ties to even
// a * 2^n for integral n in [-252, 254] held in f32 lanes, rounded once: overflows to inf, underflows
// gradually (subnormals) to 0. 2^n as 2^h * 2^(n - h), h = n / 2 rounded down: both factors are normal numbers.
inline float32x4_t mul_pow2_q(float32x4_t a, float32x4_t n) {
    const int32x4_t ni = vcvtnq_s32_f32(n), h = vshrq_n_s32(ni, 1), bias = vdupq_n_s32(127);
    const float32x4_t ph = vreinterpretq_f32_s32(vshlq_n_s32(vaddq_s32(h, bias), 23));
    const float32x4_t pl = vreinterpretq_f32_s32(vshlq_n_s32(vaddq_s32(vsubq_s32(ni, h), bias), 23));
    return vmulq_f32(vmulq_f32(a, ph), pl);
}
inline Vec8 mul_pow2(Vec8 a, Vec8 n) { return {mul_pow2_q(a.lo, n.lo), mul_pow2_q(a.hi, n.hi)}; }
// ((l0 + l4) + (l2 + l6)) + ((l1 + l5) + (l3 + l7)): the pairs of vec256.h and vec_portable.h
inline float reduce_add(Vec8 a) {
    const float32x4_t s = vaddq_f32(a.lo, a.hi);
    const float32x2_t t = vadd_f32(vget_low_f32(s), vget_high_f32(s));
    return vget_lane_f32(t, 0) + vget_lane_f32(t, 1);
}
inline float lane0(Vec8 a) { return vgetq_lane_f32(a.lo, 0); }

inline Mask8 isnan_mask(Vec8 a) { return Mask8{vmvnq_u32(vceqq_f32(a.lo, a.lo)), vmvnq_u32(vceqq_f32(a.hi, a.hi))}; }
inline Mask8 eq_mask(Vec8 a, Vec8 b) { return Mask8{vceqq_f32(a.lo, b.lo), vceqq_f32(a.hi, b.hi)}; }
inline Mask8 lt_mask(Vec8 a, Vec8 b) { return Mask8{vcltq_f32(a.lo, b.lo), vcltq_f32(a.hi, b.hi)}; }
inline Mask8 gt_mask(Vec8 a, Vec8 b) { return Mask8{vcgtq_f32(a.lo, b.lo), vcgtq_f32(a.hi, b.hi)}; }
inline Mask8 ge_mask(Vec8 a, Vec8 b) { return Mask8{vcgeq_f32(a.lo, b.lo), vcgeq_f32(a.hi, b.hi)}; }
inline Vec8 select(Mask8 m, Vec8 if_true, Vec8 if_false) {
    return {vbslq_f32(m.lo, if_true.lo, if_false.lo), vbslq_f32(m.hi, if_true.hi, if_false.hi)};
}
inline Vec8i select(Mask8 m, Vec8i if_true, Vec8i if_false) {
    return {vbslq_u32(m.lo, if_true.lo, if_false.lo), vbslq_u32(m.hi, if_true.hi, if_false.hi)};
}

// max of the lanes in vec256.h's pairs (l, l + 4), (l, l + 2), (0, 1), with its NaN rule (vmax)
inline float reduce_max(Vec8 a) {
    const Vec8 m = vmax(a, Vec8{a.hi, a.hi});
    const float32x4_t s = m.lo, s2 = vextq_f32(s, s, 2);
    const float32x4_t t = vbslq_f32(vcgtq_f32(s, s2), s, s2);
    const float32x4_t t1 = vextq_f32(t, t, 1);
    return vgetq_lane_f32(vbslq_f32(vcgtq_f32(t, t1), t, t1), 0);
}

inline uint16x8_t Vec8::narrow(const bf16_t*) const {
    const Vec8i b = bf16_bits(*this);  // each lane <= 0xffff: the narrowing keeps it
    return vcombine_u16(vmovn_u32(b.lo), vmovn_u32(b.hi));
}
template <class T> inline Vec8 Vec8::round_to() const {
    if constexpr (std::is_same_v<T, bf16_t>) return widen_bf16(bf16_bits(*this));
    else if constexpr (std::is_same_v<T, f16_t>) return widen(narrow(static_cast<const f16_t*>(nullptr)), static_cast<const f16_t*>(nullptr));
    else return *this;
}

// Lane j = the sum of the lanes of a[j]: (l0 + l4) + (l1 + l5) + ((l2 + l6) + (l3 + l7)) by pairwise adds.
inline Vec8 reduce_add_each(const Vec8 (&a)[8]) {
    float32x4_t s[8];
    for (int j = 0; j < 8; ++j) s[j] = vaddq_f32(a[j].lo, a[j].hi);
    const float32x4_t lo = vpaddq_f32(vpaddq_f32(s[0], s[1]), vpaddq_f32(s[2], s[3]));
    const float32x4_t hi = vpaddq_f32(vpaddq_f32(s[4], s[5]), vpaddq_f32(s[6], s[7]));
    return {lo, hi};
}

#if defined(LLAISYS_ISA_DOTPROD)
// acc + a[2i] * b[2i] + a[2i + 1] * b[2i + 1] in f32 lane i, for a and b holding 8 pairs of bf16 values (bfdot,
// AArch64's FEAT_BF16: the pair's products and their sum with acc under the architecture's own rounding, which
// is not vdpbf16ps'; both within linear's bf16 tolerance). Only for CPUs with it (has_feature(Feature::
// kBf16Pairs)); the caller carries LLAISYS_TARGET_BF16_PAIRS too.
LLAISYS_TARGET_BF16_PAIRS inline Vec8 dot_bf16_pairs(Vec8 acc, Vec8i a, Vec8i b) {
    return {vbfdotq_f32(acc.lo, vreinterpretq_bf16_u32(a.lo), vreinterpretq_bf16_u32(b.lo)),
            vbfdotq_f32(acc.hi, vreinterpretq_bf16_u32(a.hi), vreinterpretq_bf16_u32(b.hi))};
}
#endif

}  // namespace llaisys::cpu::LLAISYS_ISA
