// The byte formats of a quantized paged KV cache (backend.h, llaisys_kv_format; llaisys.ops.quantize_kv is the
// numpy definition these follow bit for bit). A (token, kv head) row of n values is n bytes and one f16 scale:
//     scale = f16(min(amax / QMAX, 65504))   (round to nearest even; amax = max |x| over the row, in f32)
//     byte  = encode(clamp(x / scale, -QMAX, QMAX))   (an IEEE f32 division, rounded to nearest even)
//     x'    = decode(byte) * scale   (f32)
// A row whose scale is 0 (or NaN: a NaN in the row) stores zero bytes.
//
// Everything is written with integer and f32 arithmetic that nvcc, clang (CoreX's and the clang-22 check) and
// host execution all compute alike: cuda_fp8.h is not allowed in the shared sources (CoreX lacks it), so the
// e4m3fn conversions are bit manipulation. The divisions rely on the builds' IEEE-correct f32 division (nvcc's
// default -prec-div=true, clang's default; no build uses fast math) and on denormals being kept (no -ftz).
#pragma once

#include <cstdint>

#include "../common/dtype.cuh"

namespace llaisys::cuda {

constexpr float kF16Max = 65504.0f;

// |x| as an ordered integer: for non-negative floats the bit patterns order like the values, and every NaN
// (0x7f800001..) lies above +inf, so an integer max over a row is its amax with NaN propagated (fmaxf drops NaN).
__device__ __forceinline__ uint32_t abs_bits(float x) { return __float_as_uint(x) & 0x7fffffffu; }

// The row's f16 scale from its amax: f16(min(amax / qmax, 65504)) rounded to nearest even, as bits. A NaN
// amax keeps NaN (the comparison is false for it, where fminf would return 65504).
__device__ __forceinline__ f16 kv_scale(float amax, float qmax) {
    float s = amax / qmax;
    if (s > kF16Max) s = kF16Max;
    return from_float<f16>(s);
}

// ---- int8: two's complement, QMAX 127 ------------------------------------------------------------------------

struct KvInt8 {
    static constexpr float kQmax = 127.0f;
    // y already in [-127, 127]: rintf rounds half to even, the CUDA and C default rounding mode.
    __device__ static uint8_t encode(float y) { return uint8_t(int8_t(int(rintf(y)))); }
    __device__ static float decode(uint8_t b) { return float(int8_t(b)); }
};

// ---- fp8: OCP float8 e4m3fn (1 sign, 4 exponent bits with bias 7, 3 mantissa bits; no infinities, 0x7f and
// 0xff are NaN; the largest finite value 0x7e = 448, the smallest normal 2^-6, subnormals m * 2^-9) -----------

struct KvFp8E4M3 {
    static constexpr float kQmax = 448.0f;

    // y already in [-448, 448] (never NaN): round to nearest even, keeping the sign (-0 -> 0x80, as ml_dtypes).
    __device__ static uint8_t encode(float y) {
        const uint32_t u = __float_as_uint(y), sign = (u >> 24) & 0x80u, a = u & 0x7fffffffu;
        if (a < 0x3c800000u) {  // |y| < 2^-6: a subnormal or zero, m * 2^-9 with m = rne(|y| * 2^9) in 0..8
            // (exact: a power-of-two scaling; m = 8 is 0x08, the smallest normal, as it should be)
            return uint8_t(sign | uint32_t(rintf(__uint_as_float(a) * 512.0f)));
        }
        // normal: drop 20 of f32's 23 mantissa bits, to nearest even (a carry into the exponent is right too),
        // then rebias the exponent from 127 to 7 (120 << 3 in the byte's position). |y| <= 448 stays <= 0x7e.
        const uint32_t rounded = a + 0x7ffffu + ((a >> 20) & 1u);
        return uint8_t(sign | ((rounded >> 20) - (120u << 3)));
    }

    __device__ static float decode(uint8_t b) {
        const uint32_t sign = uint32_t(b & 0x80u) << 24, e = (b >> 3) & 0xfu, m = b & 0x7u;
        float magnitude;
        if ((b & 0x7fu) == 0x7fu) magnitude = __uint_as_float(0x7fc00000u);      // NaN
        else if (e == 0) magnitude = float(m) * (1.0f / 512.0f);                 // subnormal: m * 2^-9 (exact)
        else magnitude = __uint_as_float(((e + 120u) << 23) | (m << 20));        // normal: rebias 7 -> 127
        return __uint_as_float(__float_as_uint(magnitude) | sign);
    }
};

// One value of a stored row: x / scale as a byte of Format (scale is the row's f16 scale widened, > 0).
template <class Format>
__device__ __forceinline__ uint8_t kv_encode(float x, float scale) {
    const float y = fminf(Format::kQmax, fmaxf(-Format::kQmax, x / scale));  // x is never NaN here (see above)
    return Format::encode(y);
}

// A stored byte back to f32: decode(b) * scale (one f32 multiplication, as dequantize_kv).
template <class Format>
__device__ __forceinline__ float kv_decode(uint8_t b, f16 scale) {
    return Format::decode(b) * to_float(scale);
}

}  // namespace llaisys::cuda
