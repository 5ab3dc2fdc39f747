// Quantized paged KV rows (backend.h, llaisys_kv_format): one byte per key or value and one f16 scale per
// (token, kv head) row. The scalar rules, bit for bit those of llaisys.ops.paged_q (quantize_kv /
// dequantize_kv):
//   write: amax = max |x| (f32), scale = f16(min(amax / QMAX, 65504)) rounded to nearest even, each byte =
//          encode(clamp(x / scale, -QMAX, QMAX)) rounded to nearest even (the division in f32); a row whose
//          f16 scale is 0 (or NaN) stores zero bytes;
//   read:  x = decode(b) * scale, one f32 product.
// Compiled once per instruction set like the op sources that include it (namespace llaisys::cpu::<isa>).
#pragma once

#include <array>
#include <cmath>
#include <cstdint>
#include <cstring>

#include "../simd/simd.h"
#include "llaisys/backend.h"

namespace llaisys::cpu::LLAISYS_ISA {

namespace kvq {

template <int Fmt> constexpr float kQmax = Fmt == LLAISYS_KV_INT8 ? 127.0f : 448.0f;

// f32 -> OCP float8 e4m3fn bits (bias 7, subnormals m * 2^-9), round to nearest even, for |y| <= 448 (the
// caller clamps: nothing rounds up to 0x7f, the NaN). The sign is kept, -0 included (as ml_dtypes does).
inline uint8_t e4m3_bits(float y) {
    const uint32_t u = bits_of(y), sign = (u >> 24) & 0x80u, a = u & 0x7fffffffu;
    if (a < 0x3c800000u) {  // below 2^-6: a subnormal of 2^-9 steps (m = 8 is 2^-6, code 0x08, as it should)
        return uint8_t(sign | uint32_t(std::nearbyint(as_f32(a) * 512.0f)));
    }
    const uint32_t r = a + 0x7ffffu + ((a >> 20) & 1u);  // round to nearest even at bit 20 (3 mantissa bits kept)
    return uint8_t(sign | ((r >> 20) - (120u << 3)));      // exponent bias 127 -> 7
}

// One encoded byte of y = x / scale already clamped to [-QMAX, QMAX].
template <int Fmt>
inline uint8_t encode(float y) {
    if constexpr (Fmt == LLAISYS_KV_INT8) {
        return uint8_t(int8_t(std::nearbyint(y)));  // (the default rounding mode: to nearest even)
    } else {
        return e4m3_bits(y);
    }
}

// decode(b) as f32, exact: int8 two's complement, or e4m3fn (bias 7, subnormals m * 2^-9; 0x7f / 0xff NaN).
template <int Fmt>
constexpr float decode_exact(uint32_t b) {
    if (Fmt == LLAISYS_KV_INT8) return float(int8_t(uint8_t(b)));
    const uint32_t e = (b >> 3) & 15u, m = b & 7u;
    if (e == 15u && m == 7u) return __builtin_nanf("");
    float v = float(e ? 8u + m : m) / 512.0f;    // m * 2^-9, or (8 + m) * 2^-9 to be scaled by 2^(e - 1)
    for (uint32_t i = 1; i < e; ++i) v *= 2.0f;  // (exact: powers of two)
    return b & 0x80u ? -v : v;
}

template <int Fmt>
constexpr std::array<float, 256> make_table() {
    std::array<float, 256> t{};
    for (uint32_t b = 0; b < 256; ++b) t[b] = decode_exact<Fmt>(b);
    return t;
}

// The 256 decoded bytes of a format.
template <int Fmt> inline constexpr std::array<float, 256> kDecode = make_table<Fmt>();

// Quantizes the row x[0, n) (f32 / f16 / bf16) into bytes[0, n) and *scale.
template <int Fmt, class T>
inline void quantize_row(const T* x, int64_t n, uint8_t* bytes, f16_t* scale) {
    constexpr float qmax = kQmax<Fmt>;
    float amax = 0.0f;
    for (int64_t c = 0; c < n; ++c) {
        const float a = std::fabs(to_f32(x[c]));
        amax = a > amax || a != a ? a : amax;  // (a NaN stays, as numpy's max keeps it)
    }
    const float ratio = amax / qmax;
    const f16_t s16 = to_f16(ratio > 65504.0f ? 65504.0f : ratio);  // (a NaN ratio stays NaN)
    *scale = s16;
    const float s = to_f32(s16);
    if (!(s > 0.0f)) {  // zero (or NaN) scale: zero bytes
        for (int64_t c = 0; c < n; ++c) bytes[c] = 0;
        return;
    }
    for (int64_t c = 0; c < n; ++c) {
        float y = to_f32(x[c]) / s;
        y = y < -qmax ? -qmax : y > qmax ? qmax : y;
        bytes[c] = encode<Fmt>(y);
    }
}

// dst[0, n) = decode(bytes[c]) * scale, one f32 product each: int8 W bytes at a time, widened exactly in vector
// lanes (the tail from a zero-padded copy); e4m3 through the table (an e4m3 decode in vector arithmetic takes
// a dozen vector operations per W bytes, slower than the table's loads here).
template <int Fmt>
inline void dequantize_row(const uint8_t* __restrict bytes, f16_t scale, int64_t n, float* __restrict dst) {
    constexpr int W = Vec8::W;
    const float s = to_f32(scale);
    if constexpr (Fmt == LLAISYS_KV_INT8) {
        const Vec8 vs = Vec8::set1(s);
        int64_t c = 0;
        for (; c + W <= n; c += W) (Vec8::load(reinterpret_cast<const int8_t*>(bytes + c)) * vs).store(dst + c);
        if (c < n) {
            int8_t tail[W] = {};
            std::memcpy(tail, bytes + c, size_t(n - c));
            (Vec8::load(tail) * vs).store_partial(dst + c, int(n - c));
        }
    } else {
        const float* table = kDecode<Fmt>.data();
        for (int64_t c = 0; c < n; ++c) dst[c] = table[bytes[c]] * s;
    }
}

}  // namespace kvq

}  // namespace llaisys::cpu::LLAISYS_ISA
