// The block formats of linear_q and embedding_q on the device (backend.h, linear_q; llaisys.ops.quant builds
// them): blocks of 16 weight rows, groups of 32 k, every 64 bytes holding 4 bytes of each of the 16 rows (row
// r at bytes 4 r .. 4 r + 3). A thread reads one row's 4-byte words of a group (the 16 rows of a block read
// one 64-byte chunk together) and turns them into the group's 32 integers (the format's offset subtracted:
// Q4_0's 8, Q6_K's 32) and its scale(s) and min, computed in f32 exactly as ggml's dequantize_row_* does.
//   Q8_0  512 B / group: 8 chunks of int8 (k = 4 c + i);                  scales [G][16] f16 d
//   Q4_0  256 B / group: 4 chunks, low nibble k = 4 c + i, high k + 16;   scales [G][16] f16 d
//   Q4_1  as Q4_0;                                                         scales [G][2][16] f16 d, m
//   Q4_K  units of 64 k (512 B): low nibbles the unit's first group, high its second;
//         per 256 k a record of 320 B: D [16] f16, Dm [16] f16, sc [8][16] u8, mn [8][16] u8
//   Q6_K  units of 128 k (1536 B): 16 chunks of nibbles (k, k + 64), 8 chunks of 2-bit fields (k + 32 j at
//         bits 2 j), ordered nibbles 0, fields 0, .., nibbles 7, fields 7, nibbles 8 .. 15 (the CPU's reading
//         order); per 256 k a record of 288 B: D [16] f16, sc [16][16] int8 (a scale per 16 k)
#pragma once

#include <cstdint>

#include "../common/dtype.cuh"

namespace llaisys::cuda {

constexpr int kQGroup = 32;      // k per group (llaisys.ops.QUANT_GROUP)
constexpr int kQHalf = 16;       // k per half group (Q6_K's scales)
constexpr int kQBlockRows = 16;  // weight rows per block (llaisys.ops.QUANT_BLOCK_ROWS)

__device__ __forceinline__ uint32_t word_at(const uint8_t* p) { return *reinterpret_cast<const uint32_t*>(p); }
__device__ __forceinline__ float f16_at(const uint8_t* p) { return to_float(*reinterpret_cast<const f16*>(p)); }
// byte i of row r's word in chunk c of the bytes at p
__device__ __forceinline__ uint32_t row_word(const uint8_t* p, int64_t c, int r) { return word_at(p + c * 64 + r * 4); }

template <int FMT> struct QFormat;

template <>
struct QFormat<LLAISYS_QFORMAT_Q8_0> {
    static constexpr int64_t kWeightBytes = 512, kScaleBytes = 32;
    static constexpr int kSubs = 1;
    static constexpr bool kMin = false;
    __device__ static void codes(const uint8_t* w, int r, int64_t g, int (&q)[kQGroup]) {
#pragma unroll
        for (int c = 0; c < 8; ++c) {
            const uint32_t word = row_word(w + g * kWeightBytes, c, r);
#pragma unroll
            for (int i = 0; i < 4; ++i) q[4 * c + i] = int8_t(uint8_t(word >> (8 * i)));
        }
    }
    __device__ static float scale(const uint8_t* s, int r, int64_t g, int) { return f16_at(s + g * 32 + r * 2); }
    __device__ static float min(const uint8_t*, int, int64_t) { return 0.0f; }
};

template <>
struct QFormat<LLAISYS_QFORMAT_Q4_0> {
    static constexpr int64_t kWeightBytes = 256, kScaleBytes = 32;
    static constexpr int kSubs = 1;
    static constexpr bool kMin = false;
    __device__ static void nibbles(const uint8_t* w, int r, int64_t g, int offset, int (&q)[kQGroup]) {
#pragma unroll
        for (int c = 0; c < 4; ++c) {
            const uint32_t word = row_word(w + g * kWeightBytes, c, r);
#pragma unroll
            for (int i = 0; i < 4; ++i) {
                q[4 * c + i] = int((word >> (8 * i)) & 15u) - offset;
                q[16 + 4 * c + i] = int((word >> (8 * i + 4)) & 15u) - offset;
            }
        }
    }
    __device__ static void codes(const uint8_t* w, int r, int64_t g, int (&q)[kQGroup]) { nibbles(w, r, g, 8, q); }
    __device__ static float scale(const uint8_t* s, int r, int64_t g, int) { return f16_at(s + g * 32 + r * 2); }
    __device__ static float min(const uint8_t*, int, int64_t) { return 0.0f; }
};

template <>
struct QFormat<LLAISYS_QFORMAT_Q4_1> {
    static constexpr int64_t kWeightBytes = 256, kScaleBytes = 64;
    static constexpr int kSubs = 1;
    static constexpr bool kMin = true;
    __device__ static void codes(const uint8_t* w, int r, int64_t g, int (&q)[kQGroup]) {
        QFormat<LLAISYS_QFORMAT_Q4_0>::nibbles(w, r, g, 0, q);
    }
    __device__ static float scale(const uint8_t* s, int r, int64_t g, int) { return f16_at(s + g * 64 + r * 2); }
    __device__ static float min(const uint8_t* s, int r, int64_t g) { return f16_at(s + g * 64 + 32 + r * 2); }
};

template <>
struct QFormat<LLAISYS_QFORMAT_Q4_K> {
    static constexpr int64_t kWeightBytes = 256, kScaleBytes = 40, kRecord = 320;
    static constexpr int kSubs = 1;
    static constexpr bool kMin = true;
    __device__ static void codes(const uint8_t* w, int r, int64_t g, int (&q)[kQGroup]) {
        const int shift = int(g % 2) * 4;  // the unit's first group: low nibbles; its second: high
#pragma unroll
        for (int c = 0; c < 8; ++c) {
            const uint32_t word = row_word(w + (g / 2) * 512, c, r);
#pragma unroll
            for (int i = 0; i < 4; ++i) q[4 * c + i] = int((word >> (8 * i + shift)) & 15u);
        }
    }
    __device__ static float scale(const uint8_t* s, int r, int64_t g, int) {
        const uint8_t* rec = s + (g / 8) * kRecord;
        return f16_at(rec + r * 2) * float(rec[64 + (g % 8) * 16 + r]);
    }
    __device__ static float min(const uint8_t* s, int r, int64_t g) {
        const uint8_t* rec = s + (g / 8) * kRecord;
        return -(f16_at(rec + 32 + r * 2) * float(rec[192 + (g % 8) * 16 + r]));
    }
};

template <>
struct QFormat<LLAISYS_QFORMAT_Q6_K> {
    static constexpr int64_t kWeightBytes = 384, kScaleBytes = 36, kRecord = 288, kUnitBytes = 1536;
    static constexpr int kSubs = 2;
    static constexpr bool kMin = false;
    __device__ static void codes(const uint8_t* w, int r, int64_t g, int (&q)[kQGroup]) {
        const uint8_t* unit = w + (g / 4) * kUnitBytes;
        const int j = int(g % 4), shift = (j / 2) * 4;  // the group within the unit: k = 32 j ..
#pragma unroll
        for (int c = 0; c < 8; ++c) {
            const uint32_t low = row_word(unit, j % 2 ? 16 + c : 2 * c, r), high = row_word(unit, 2 * c + 1, r);
#pragma unroll
            for (int i = 0; i < 4; ++i)
                q[4 * c + i] = int(((low >> (8 * i + shift)) & 15u) | (((high >> (8 * i + 2 * j)) & 3u) << 4)) - 32;
        }
    }
    __device__ static float scale(const uint8_t* s, int r, int64_t g, int t) {
        const uint8_t* rec = s + (g / 8) * kRecord;
        return f16_at(rec + r * 2) * float(int8_t(rec[32 + ((g % 8) * 2 + t) * 16 + r]));
    }
    __device__ static float min(const uint8_t*, int, int64_t) { return 0.0f; }
};

// Calls f(std::integral_constant<int, FMT>{}) for a known LLAISYS_QFORMAT_* code; NOT_SUPPORTED otherwise.
template <class F>
void dispatch_qformat(int fmt, F&& f) {
    switch (fmt) {
        case LLAISYS_QFORMAT_Q8_0: f(std::integral_constant<int, LLAISYS_QFORMAT_Q8_0>{}); break;
        case LLAISYS_QFORMAT_Q4_0: f(std::integral_constant<int, LLAISYS_QFORMAT_Q4_0>{}); break;
        case LLAISYS_QFORMAT_Q4_1: f(std::integral_constant<int, LLAISYS_QFORMAT_Q4_1>{}); break;
        case LLAISYS_QFORMAT_Q4_K: f(std::integral_constant<int, LLAISYS_QFORMAT_Q4_K>{}); break;
        case LLAISYS_QFORMAT_Q6_K: f(std::integral_constant<int, LLAISYS_QFORMAT_Q6_K>{}); break;
        default: throw NotSupported("unsupported weight format code " + std::to_string(fmt));
    }
}

}  // namespace llaisys::cuda
