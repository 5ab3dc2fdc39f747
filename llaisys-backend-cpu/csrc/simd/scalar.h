// The scalar part of the SIMD vocabulary (see simd.h): bit casts and the f32 <-> bf16 / f16 conversions.
// The bf16 rounding is written once, as a template over the lane type: a float here, a vector in vec*.h.
#pragma once

#include <cstdint>
#include <cstring>
#include <utility>

#include "../common/dtype.h"

namespace llaisys::cpu::LLAISYS_ISA {

inline uint32_t bits_of(float f) {
    uint32_t u;
    std::memcpy(&u, &f, sizeof(u));
    return u;
}
inline float as_f32(uint32_t u) {
    float f;
    std::memcpy(&f, &u, sizeof(f));
    return f;
}
inline bool isnan_mask(float x) { return x != x; }
inline uint32_t select(bool m, uint32_t if_true, uint32_t if_false) { return m ? if_true : if_false; }

// The bf16 bits of the f32 lanes of x (in the low half of each 32-bit lane), rounded to nearest even;
// NaN becomes a quiet NaN of the same sign. X is a float or a vector type; I its 32-bit integer lanes.
template <class X, class I = decltype(bits_of(std::declval<X>()))>
inline I bf16_bits(X x) {
    const I u = bits_of(x), hi = u >> 16;
    const I rounded = (u + (hi & I(1)) + I(0x7fff)) >> 16;
    return select(isnan_mask(x), hi | I(0x40), rounded);
}

// f32 lanes from bf16 bits (in the low half of each lane): exact.
template <class I>
inline auto widen_bf16(I halves) { return as_f32(halves << 16); }

inline float to_f32(float x) { return x; }
inline float to_f32(bf16_t x) { return widen_bf16(uint32_t(x.bits)); }
inline bf16_t to_bf16(float f) { return bf16_t{uint16_t(bf16_bits(f))}; }

// f16 -> f32, exact, without branches (so loops of it vectorise): normal numbers move their exponent
// from bias 15 to bias 127, subnormals are mantissa * 2^-24, inf / NaN keep an all-ones exponent.
inline float to_f32(f16_t x) {
    const uint32_t h = x.bits, sign = (h & 0x8000u) << 16, em = h & 0x7fffu;
    const float normal = as_f32((em << 13) + (112u << 23));
    const float special = as_f32((em << 13) | 0x7f800000u);
    const float subnormal = float(em) * 0x1p-24f;
    const float magnitude = em >= 0x7c00u ? special : em >= 0x0400u ? normal : subnormal;
    return as_f32(bits_of(magnitude) | sign);
}

// f32 -> f16, round to nearest even; overflow gives inf, NaN a quiet NaN.
inline f16_t to_f16(float f) {
    const uint32_t u = bits_of(f), sign = (u >> 16) & 0x8000u, a = u & 0x7fffffffu;
    if (a > 0x7f800000u) return f16_t{uint16_t(sign | 0x7e00u)};   // NaN
    if (a >= 0x477ff000u) return f16_t{uint16_t(sign | 0x7c00u)};  // rounds to >= 2^16: inf
    if (a < 0x38800000u) {                                           // below 2^-14: subnormal or zero in f16
        // the subnormal mantissa is value * 2^24, rounded to nearest even
        const float v = as_f32(a) * 16777216.0f;
        uint32_t m = uint32_t(v);
        const float rem = v - float(m);
        if (rem > 0.5f || (rem == 0.5f && (m & 1u))) ++m;
        return f16_t{uint16_t(sign | m)};
    }
    const uint32_t r = a + 0x0fffu + ((a >> 13) & 1u);  // round to nearest even at bit 13
    return f16_t{uint16_t(sign | ((r - 0x38000000u) >> 13))};
}

template <class T> inline T from_f32(float f);
template <> inline float from_f32<float>(float f) { return f; }
template <> inline bf16_t from_f32<bf16_t>(float f) { return to_bf16(f); }
template <> inline f16_t from_f32<f16_t>(float f) { return to_f16(f); }

}  // namespace llaisys::cpu::LLAISYS_ISA
