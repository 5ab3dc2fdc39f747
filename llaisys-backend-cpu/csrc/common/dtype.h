// Scalar f16 / bf16 <-> f32 conversions (round to nearest even) and typed load/store.
#pragma once

#include <cstdint>
#include <cstring>

namespace llaisys {

struct bf16_t { uint16_t bits; };
struct f16_t { uint16_t bits; };

inline float bits_to_f32(uint32_t u) { float f; std::memcpy(&f, &u, 4); return f; }
inline uint32_t f32_to_bits(float f) { uint32_t u; std::memcpy(&u, &f, 4); return u; }

inline float to_f32(bf16_t x) { return bits_to_f32(uint32_t(x.bits) << 16); }

inline bf16_t to_bf16(float f) {
    uint32_t u = f32_to_bits(f);
    if ((u & 0x7fffffffu) > 0x7f800000u) return bf16_t{uint16_t((u >> 16) | 0x40)};  // quiet NaN
    u += 0x7fffu + ((u >> 16) & 1u);  // round to nearest even
    return bf16_t{uint16_t(u >> 16)};
}

inline float to_f32(f16_t x) {
    uint32_t h = x.bits, sign = (h & 0x8000u) << 16, exp = (h >> 10) & 0x1fu, mant = h & 0x3ffu;
    if (exp == 0x1f) return bits_to_f32(sign | 0x7f800000u | (mant << 13));  // inf / NaN
    if (exp == 0) {
        if (mant == 0) return bits_to_f32(sign);
        float v = float(mant) * (1.0f / 16777216.0f);  // subnormal: mant * 2^-24
        return sign ? -v : v;
    }
    return bits_to_f32(sign | ((exp + 112) << 23) | (mant << 13));
}

inline f16_t to_f16(float f) {
    uint32_t u = f32_to_bits(f), sign = (u >> 16) & 0x8000u, a = u & 0x7fffffffu;
    if (a > 0x7f800000u) return f16_t{uint16_t(sign | 0x7e00u)};   // NaN
    if (a >= 0x477ff000u) return f16_t{uint16_t(sign | 0x7c00u)};  // overflow (after rounding) -> inf
    if (a < 0x38800000u) {                                           // subnormal or zero in f16
        // value * 2^24 rounded to nearest even gives the subnormal mantissa
        float v = bits_to_f32(a) * 16777216.0f;
        uint32_t m = uint32_t(v);
        float rem = v - float(m);
        if (rem > 0.5f || (rem == 0.5f && (m & 1u))) ++m;
        return f16_t{uint16_t(sign | m)};
    }
    uint32_t r = a + 0x0fffu + ((a >> 13) & 1u);  // round to nearest even at bit 13
    return f16_t{uint16_t(sign | ((r - 0x38000000u) >> 13))};
}

inline float to_f32(float x) { return x; }
template <class T> inline T from_f32(float f);
template <> inline float from_f32<float>(float f) { return f; }
template <> inline bf16_t from_f32<bf16_t>(float f) { return to_bf16(f); }
template <> inline f16_t from_f32<f16_t>(float f) { return to_f16(f); }

}  // namespace llaisys
