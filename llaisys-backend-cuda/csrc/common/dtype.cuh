// Element types on the device: f32, and f16 / bf16 kept as their bit patterns (so that the same code
// serves nvcc, CoreX clang and host execution), with conversions that round to nearest even. All
// arithmetic is in f32; an f16 / bf16 result is rounded once, when stored.
#pragma once

#include <cstdint>

#include "../compat.h"
#include "api.h"

namespace llaisys::cuda {

struct alignas(2) f16 { uint16_t bits; };
struct alignas(2) bf16 { uint16_t bits; };

__device__ __forceinline__ float to_float(float x) { return x; }
__device__ __forceinline__ float to_float(bf16 x) { return __uint_as_float(uint32_t(x.bits) << 16); }
__device__ __forceinline__ float to_float(f16 x) { return __half2float(__ushort_as_half(x.bits)); }

template <class T> __device__ __forceinline__ T from_float(float f);
template <> __device__ __forceinline__ float from_float<float>(float f) { return f; }
template <> __device__ __forceinline__ f16 from_float<f16>(float f) { return f16{__half_as_ushort(__float2half_rn(f))}; }
template <> __device__ __forceinline__ bf16 from_float<bf16>(float f) {
    uint32_t u = __float_as_uint(f);
    if ((u & 0x7fffffffu) > 0x7f800000u) return bf16{uint16_t((u >> 16) | 0x40u)};  // NaN stays a (quiet) NaN
    u += 0x7fffu + ((u >> 16) & 1u);                                                  // round to nearest even
    return bf16{uint16_t(u >> 16)};
}

// f rounded to T and widened back (LLAISYS_NUMERICS_HF: where HF's tensors change dtype).
template <class T> __device__ __forceinline__ float round_to(float f) { return to_float(from_float<T>(f)); }

// `count` elements of T in one aligned load / store (16 bytes).
template <class T, int N>
struct alignas(sizeof(T) * N) Pack {
    T v[N];
};
template <class T> constexpr int kPack = int(16 / sizeof(T));

inline bool aligned16(const void* p) { return (reinterpret_cast<uintptr_t>(p) & 15u) == 0; }

// Calls f(T{}) with T the element type of dtype (f32, f16, bf16); other dtypes are NOT_SUPPORTED.
template <class F>
void dispatch_float(int dtype, F&& f) {
    switch (dtype) {
        case kF32: f(float{}); break;
        case kF16: f(f16{}); break;
        case kBF16: f(bf16{}); break;
        default: unsupported_dtype(dtype);
    }
}

}  // namespace llaisys::cuda
