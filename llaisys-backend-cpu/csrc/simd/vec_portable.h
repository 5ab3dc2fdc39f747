// Vec8 on the portable path (baseline x86-64, or any CPU): 8 f32 lanes as an array, every operation a loop
// over the lanes that the compiler turns into SSE2 code. Same interface as vec256.h (see simd.h).
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>

#include "scalar.h"

namespace llaisys::cpu::LLAISYS_ISA {

// A lane mask: all ones (-1) where true, so that combining and selecting are plain lane loops too.
struct Mask8 {
    int32_t m[8];
};
template <class C>
inline Mask8 lane_mask(C cond) {
    Mask8 r;
    for (int i = 0; i < 8; ++i) r.m[i] = cond(i) ? -1 : 0;
    return r;
}
inline Mask8 operator|(Mask8 a, Mask8 b) {
    for (int i = 0; i < 8; ++i) a.m[i] |= b.m[i];
    return a;
}
inline Mask8 operator&(Mask8 a, Mask8 b) {
    for (int i = 0; i < 8; ++i) a.m[i] &= b.m[i];
    return a;
}
inline Mask8& operator|=(Mask8& a, Mask8 b) { return a = a | b; }
inline Mask8& operator&=(Mask8& a, Mask8 b) { return a = a & b; }
inline uint32_t bits(Mask8 a) {
    uint32_t b = 0;
    for (int i = 0; i < 8; ++i) b |= uint32_t(a.m[i] & 1) << i;
    return b;
}

// 8 x 32-bit integer lanes (bit work, codes unpacked from bytes), as an array: the lane loops become SSE2 code.
struct Vec8i {
    uint32_t v[8];
    Vec8i() = default;
    explicit Vec8i(uint32_t c) {
        for (int i = 0; i < 8; ++i) v[i] = c;
    }
    static Vec8i load(const void* p) {  // 32 bytes
        Vec8i r;
        std::memcpy(r.v, p, sizeof(r.v));
        return r;
    }
    template <class F>
    static Vec8i lanes(F f) {
        Vec8i r;
        for (int i = 0; i < 8; ++i) r.v[i] = f(i);
        return r;
    }
};
inline Vec8i operator+(Vec8i a, Vec8i b) { return Vec8i::lanes([&](int i) { return a.v[i] + b.v[i]; }); }
inline Vec8i operator&(Vec8i a, Vec8i b) { return Vec8i::lanes([&](int i) { return a.v[i] & b.v[i]; }); }
inline Vec8i operator|(Vec8i a, Vec8i b) { return Vec8i::lanes([&](int i) { return a.v[i] | b.v[i]; }); }
inline Vec8i operator^(Vec8i a, Vec8i b) { return Vec8i::lanes([&](int i) { return a.v[i] ^ b.v[i]; }); }
inline Vec8i operator>>(Vec8i a, int n) { return Vec8i::lanes([&](int i) { return a.v[i] >> n; }); }  // logical
inline Vec8i operator<<(Vec8i a, int n) { return Vec8i::lanes([&](int i) { return a.v[i] << n; }); }

struct Vec8 {
    static constexpr int W = 8;
    using Mask = Mask8;
    using Int = Vec8i;
    float v[W];

    template <class F>
    static Vec8 lanes(F f) {
        Vec8 r;
        for (int i = 0; i < W; ++i) r.v[i] = f(i);
        return r;
    }
    static Vec8 zero() { return set1(0.0f); }
    static Vec8 set1(float x) { return lanes([&](int) { return x; }); }
    static Vec8 broadcast(const float* p) { return set1(*p); }  // every lane = *p
    static Mask first(int n) { return lane_mask([&](int i) { return i < n; }); }  // lanes [0, n), 0 <= n <= W

    template <class T> static Vec8 load(const T* p) { return lanes([&](int i) { return to_f32(p[i]); }); }
    // lanes [0, n) from p, the rest 0; nothing past p + n is read
    template <class T> static Vec8 load_partial(const T* p, int n) {
        return lanes([&](int i) { return i < n ? to_f32(p[i]) : 0.0f; });
    }
    // lanes holding integers in [-128, 127] (e.g. rounded and clamped), as W bytes
    void store(int8_t* p) const {
        for (int i = 0; i < W; ++i) p[i] = int8_t(v[i]);
    }
    template <class T> void store(T* p) const {
        for (int i = 0; i < W; ++i) p[i] = from_f32<T>(v[i]);
    }
    template <class T> void store_partial(T* p, int n) const {
        for (int i = 0; i < n; ++i) p[i] = from_f32<T>(v[i]);
    }
    // the value after a round trip through T (round to nearest even), still in f32 lanes
    template <class T> Vec8 round_to() const { return lanes([&](int i) { return to_f32(from_f32<T>(v[i])); }); }
};

inline Vec8 operator+(Vec8 a, Vec8 b) { return Vec8::lanes([&](int i) { return a.v[i] + b.v[i]; }); }
inline Vec8 operator-(Vec8 a, Vec8 b) { return Vec8::lanes([&](int i) { return a.v[i] - b.v[i]; }); }
inline Vec8 operator*(Vec8 a, Vec8 b) { return Vec8::lanes([&](int i) { return a.v[i] * b.v[i]; }); }
inline Vec8 operator/(Vec8 a, Vec8 b) { return Vec8::lanes([&](int i) { return a.v[i] / b.v[i]; }); }
// baseline x86-64 has no FMA: a * b + c rounds twice here, and nothing can fuse a product
inline Vec8 fmadd(Vec8 a, Vec8 b, Vec8 c) { return Vec8::lanes([&](int i) { return a.v[i] * b.v[i] + c.v[i]; }); }
inline Vec8 fnmadd(Vec8 a, Vec8 b, Vec8 c) { return Vec8::lanes([&](int i) { return c.v[i] - a.v[i] * b.v[i]; }); }
inline Vec8 mul_unfused(Vec8 a, Vec8 b) { return a * b; }
inline Vec8 vmin(Vec8 a, Vec8 b) { return Vec8::lanes([&](int i) { return a.v[i] < b.v[i] ? a.v[i] : b.v[i]; }); }
inline Vec8 vmax(Vec8 a, Vec8 b) { return Vec8::lanes([&](int i) { return a.v[i] > b.v[i] ? a.v[i] : b.v[i]; }); }
inline Vec8 vsqrt(Vec8 a) { return Vec8::lanes([&](int i) { return std::sqrt(a.v[i]); }); }
// nearest integer, ties to even, for |a| < 2^22 (adding 1.5 * 2^23 leaves no fraction bits; SSE2 has no round)
inline Vec8 round_nearest(Vec8 a) {
    return Vec8::lanes([&](int i) { return (a.v[i] + 12582912.0f) - 12582912.0f; });
}
// a * 2^n for integral n in [-252, 254] held in f32 lanes, rounded once: overflows to inf, underflows
// gradually (subnormals) to 0. 2^n is applied as 2^h * 2^(n - h), h = n / 2 rounded down, both normal.
inline Vec8 mul_pow2(Vec8 a, Vec8 n) {
    return Vec8::lanes([&](int i) {
        const int32_t ni = int32_t(n.v[i]), h = ni >> 1;
        return a.v[i] * as_f32(uint32_t(h + 127) << 23) * as_f32(uint32_t(ni - h + 127) << 23);
    });
}
inline float reduce_add(Vec8 a) {
    return ((a.v[0] + a.v[4]) + (a.v[2] + a.v[6])) + ((a.v[1] + a.v[5]) + (a.v[3] + a.v[7]));
}
inline float reduce_max(Vec8 a) {
    float m = a.v[0];
    for (int i = 1; i < Vec8::W; ++i) m = a.v[i] > m ? a.v[i] : m;
    return m;
}
inline float lane0(Vec8 a) { return a.v[0]; }
// the int32 lanes' values, rounded to f32
inline Vec8 int_to_f32(Vec8i a) { return Vec8::lanes([&](int i) { return float(int32_t(a.v[i])); }); }

inline Mask8 isnan_mask(Vec8 a) { return lane_mask([&](int i) { return a.v[i] != a.v[i]; }); }
inline Mask8 eq_mask(Vec8 a, Vec8 b) { return lane_mask([&](int i) { return a.v[i] == b.v[i]; }); }
inline Mask8 lt_mask(Vec8 a, Vec8 b) { return lane_mask([&](int i) { return a.v[i] < b.v[i]; }); }
inline Mask8 gt_mask(Vec8 a, Vec8 b) { return lane_mask([&](int i) { return a.v[i] > b.v[i]; }); }
inline Mask8 ge_mask(Vec8 a, Vec8 b) { return lane_mask([&](int i) { return a.v[i] >= b.v[i]; }); }
inline Vec8 select(Mask8 m, Vec8 if_true, Vec8 if_false) {
    return Vec8::lanes([&](int i) { return m.m[i] ? if_true.v[i] : if_false.v[i]; });
}

// Lane j = the sum of the lanes of a[j].
inline Vec8 reduce_add_each(const Vec8 (&a)[8]) { return Vec8::lanes([&](int j) { return reduce_add(a[j]); }); }

}  // namespace llaisys::cpu::LLAISYS_ISA
