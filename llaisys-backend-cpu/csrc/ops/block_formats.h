// The weight formats of the block linears (linear_i8, linear_q) and of embedding_q: how a kernel finds, in
// blocks of 16 weight rows, the integers of a group of 32 k and the scales (and mins) that turn them into
// weights. The byte layouts are llaisys.ops.quant's (and llaisys.ops.int8's for I8); in short, per block of
// 16 rows and group g of 32 k:
//
//   format  weight bytes / group      integers q (stored)             w[n, k]                       scales
//   I8      512: 8 steps x 16 rows x 4  int8 in [-127, 127]             s q                           bf16 s per group
//   Q8_0    512, as I8                  int8                            d q                           f16 d per group
//   Q4_0    256: 4 chunks of 64 B        4-bit u, pairs (k, k + 16)      d (u - 8)                     f16 d per group
//   Q4_1    256, as Q4_0                 4-bit u                         d u + m                       f16 d, m per group
//   Q4_K    256: units of 64 k (512 B)   4-bit u, pairs (k, k + 32)      (D sc) u - (Dm mn)            per 256 k: f16 D, Dm;
//                                                                                                      u8 sc, mn per group
//   Q6_K    384: units of 128 k (1536 B) 4-bit low, pairs (k, k + 64),   (D sc) (q - 32)               per 256 k: f16 D;
//                                        + 2-bit high fields: q 6-bit,                                 i8 sc per 16 k
//                                        chunks in reading order
//
// A 64-byte chunk of a block always holds 4 bytes of each of the 16 rows (row r at bytes 4 r .. 4 r + 3), so a
// vector load takes rows as lanes; each byte holds the same k of every row. A "step" is 4 consecutive k: the
// kernels take the 8 steps of a group as vectors of unsigned bytes (I8 / Q8_0 signed, see below), then dot
// products with 4 bytes of xq broadcast (linear_blocks.h). The 4-bit formats keep the nibble pairing of the
// ggml type they hold, so that the loader moves 4-byte words and never splits a nibble.
//
// The integers a dot product sees are the stored ones; what a format subtracts (Q4_0's 8, Q6_K's 32, and 128
// where vpdpbusd makes I8 / Q8_0 unsigned) is folded into the start of the group's integer sum as
// -offset * sum(xq), which is exact. A min (Q4_1, Q4_K) is added per group as min * (sx * sum(xq)) in f32.
// Q6_K has a scale per 16 k, so its groups have two integer sums (kSubs = 2), one per half group.
#pragma once

#include <cstdint>
#include <cstring>

#include "../simd/simd.h"
#include "quantized_x.h"

namespace llaisys::cpu {

constexpr int kQBlockRows = 16;  // weight rows per block (llaisys.ops.QUANT_BLOCK_ROWS, INT8_BLOCK_ROWS)
constexpr int kQSteps = int(kQGroup) / 4;  // steps of 4 k per group
constexpr int64_t kQSuper = 256;  // k per super-block of the K formats (their per-256 scales)

// Throws NotSupported for a format code this backend does not know (linear_q.cpp).
void require_qformat(int fmt);

}  // namespace llaisys::cpu

namespace llaisys::cpu::LLAISYS_ISA {

// ---- what every format shares -------------------------------------------------------------------------

// A format's pointers into one block of 16 rows: its weight bytes and its scale bytes.
struct BlockPtrs {
    const uint8_t* w;
    const uint8_t* s;
};

inline float f16_at(const uint8_t* p) {
    f16_t h;
    std::memcpy(&h, p, 2);
    return to_f32(h);
}
inline float bf16_at(const uint8_t* p) {
    bf16_t h;
    std::memcpy(&h, p, 2);
    return to_f32(h);
}

// byte i of row r in chunk c (of 64 bytes) of a block's bytes at p
inline uint8_t chunk_byte(const uint8_t* p, int64_t c, int r, int i) { return p[c * 64 + r * 4 + i]; }

#if !defined(LLAISYS_ISA_PORTABLE)
// Vector views of a block (V: the f32 vector; its Int: as many 32-bit lanes, one row's 4 bytes each; the 16
// rows are kQBlockRows / V::W parts of V::W rows).
template <class V>
struct Lanes {
    using VI = typename V::Int;
    static constexpr int W = V::W;
    // chunk c of p, rows of part `part`
    static VI chunk(const uint8_t* p, int64_t c, int part) { return VI::load(p + c * 64 + part * 4 * W); }
    static VI low(VI v) { return v & VI(0x0F0F0F0Fu); }
    static VI high(VI v) { return (v >> 4) & VI(0x0F0F0F0Fu); }
    static VI nibble(VI v, bool hi) { return hi ? high(v) : low(v); }
    // the low nibbles, or the high ones: shifted down, or with kInPlace left in place (16 u: one AND, for
    // vpdpbusd, whose unsigned bytes may reach 240; the group's integer sum is shifted back once, group_sum)
    template <bool kInPlace>
    static VI nibble_as(VI v, bool hi) { return !hi ? low(v) : kInPlace ? v & VI(0xF0F0F0F0u) : high(v); }
    template <class T>  // W scales of type T (f16_t, bf16_t, uint8_t, int8_t) for the rows of `part`
    static V at(const uint8_t* p, int part) { return V::load(reinterpret_cast<const T*>(p) + part * W); }
};

// The 4 bytes of xq at p as one broadcast dword.
template <class VI>
LLAISYS_ALWAYS_INLINE VI broadcast4(const int8_t* p) {
    uint32_t u;
    std::memcpy(&u, p, 4);
    return VI(u);
}
#endif

// ---- the formats ---------------------------------------------------------------------------------------
// Each format F: kWeightBytes, kScaleBytes (per group of one block), kSubs (integer sums per group), kMin;
// scalar access for the portable kernel and embedding_q:
//   q(b, r, k)        the integer of row r at k (the stored integer minus the format's offset)
//   scale(b, r, g, t) f32 scale of group g (half t when kSubs = 2); min(b, r, g) f32 min (kMin)
// and the SIMD access (avx2 / avx512 builds), rows of `part`:
//   steps<V, vnni>(b, g, part, wt)  the group's 8 step vectors as the dot product takes them
//   Record<V>(b, r, part)   the scales of record r (kRecordGroups groups: 1, or 8 for the K formats' 256 k),
//                     what is per record converted once: .scale(j, t) and .min(j) of its group j
//   offset<vnni>()    what the integer sum starts at, per unit of sum(xq) (of the half when kSubs = 2)
//   dot<VI, vnni>(acc, w, x4)  the byte dot product for these integers, with the 4 bytes of xq at x4 in every lane
//   group_sum<vnni>(g, first, second)  (kSubs = 1) the group's exact integer sum from the dot products of its
//                     first and second 4 steps (the 4-bit formats' high nibbles come in place with vnni)

// I8 (linear_i8): int8 q, a bf16 scale per group. With VNNI the bytes are made unsigned (q + 128).
struct FormatI8 {
    static constexpr int64_t kWeightBytes = 512, kScaleBytes = 32;
    static constexpr int kSubs = 1;
    static constexpr bool kMin = false;
    static int32_t q(const BlockPtrs& b, int r, int64_t k) {
        return int8_t(chunk_byte(b.w, (k / kQGroup) * 8 + (k % kQGroup) / 4, r, int(k % 4)));
    }
    static float scale(const BlockPtrs& b, int r, int64_t g, int) { return bf16_at(b.s + g * 32 + r * 2); }
    static float min(const BlockPtrs&, int, int64_t) { return 0.0f; }
#if !defined(LLAISYS_ISA_PORTABLE)
    template <class V, bool kVnni>
    static void steps(const BlockPtrs& b, int64_t g, int part, typename V::Int (&wt)[kQSteps]) {
        using VI = typename V::Int;
        for (int s = 0; s < kQSteps; ++s) {
            const VI v = Lanes<V>::chunk(b.w + g * kWeightBytes, s, part);
            wt[s] = kVnni ? v ^ VI(0x80808080u) : v;
        }
    }
    static constexpr int kRecordGroups = 1;
    template <class V, class S = bf16_t>
    struct Record {  // one scale per group
        V s;
        Record() = default;
        Record(const BlockPtrs& b, int64_t r, int part) : s(Lanes<V>::template at<S>(b.s + r * 32, part)) {}
        V scale(int, int) const { return s; }
        V min(int) const { return V::zero(); }
    };
    template <bool kVnni> static constexpr int32_t offset() { return kVnni ? 128 : 0; }
    template <class VI, bool kVnni> static VI dot(VI acc, VI w, const int8_t* x4) {
        if constexpr (kVnni) return dot4_u8i8_bcast(acc, w, x4);
        else return dot4_i8(acc, w, broadcast4<VI>(x4));
    }
    template <bool, class VI> static VI group_sum(int64_t, VI first, VI second) { return first + second; }
#endif
};

// Q8_0: I8's bytes with an f16 scale d per group.
struct FormatQ8_0 : FormatI8 {
    static float scale(const BlockPtrs& b, int r, int64_t g, int) { return f16_at(b.s + g * 32 + r * 2); }
#if !defined(LLAISYS_ISA_PORTABLE)
    template <class V> using Record = FormatI8::Record<V, f16_t>;
#endif
};

// The 4-bit and 6-bit formats: unsigned integers (at most 63), the same dot product on every path.
struct UnsignedCodes {
#if !defined(LLAISYS_ISA_PORTABLE)
    template <class VI, bool kVnni> static VI dot(VI acc, VI w, const int8_t* x4) {
        if constexpr (kVnni) return dot4_u8i8_bcast(acc, w, x4);
        else return dot4_u7i8(acc, w, broadcast4<VI>(x4));
    }
#endif
};

// Q4_0: a group is 4 chunks; chunk c holds k = 4c .. 4c + 3 (low nibbles) and k + 16 (high). w = d (u - 8).
struct FormatQ4_0 : UnsignedCodes {
    static constexpr int64_t kWeightBytes = 256, kScaleBytes = 32;
    static constexpr int kSubs = 1;
    static constexpr bool kMin = false;
    static int32_t code(const BlockPtrs& b, int r, int64_t k) {
        const int64_t kk = k % kQGroup;
        const uint8_t byte = chunk_byte(b.w + (k / kQGroup) * kWeightBytes, (kk % 16) / 4, r, int(k % 4));
        return kk < 16 ? byte & 0x0F : byte >> 4;
    }
    static int32_t q(const BlockPtrs& b, int r, int64_t k) { return code(b, r, k) - 8; }
    static float scale(const BlockPtrs& b, int r, int64_t g, int) { return f16_at(b.s + g * 32 + r * 2); }
    static float min(const BlockPtrs&, int, int64_t) { return 0.0f; }
#if !defined(LLAISYS_ISA_PORTABLE)
    template <class V, bool kVnni>  // steps 4 .. 7 (the high nibbles) as 16 u with vnni
    static void steps(const BlockPtrs& b, int64_t g, int part, typename V::Int (&wt)[kQSteps]) {
        for (int s = 0; s < kQSteps; ++s)
            wt[s] = Lanes<V>::template nibble_as<kVnni>(Lanes<V>::chunk(b.w + g * kWeightBytes, s % 4, part),
                                                        s >= 4);
    }
    template <bool kVnni, class VI> static VI group_sum(int64_t, VI first, VI second) {
        return kVnni ? first + sra(second, 4) : first + second;  // (second: a multiple of 16 with vnni)
    }
    static constexpr int kRecordGroups = 1;
    template <class V> using Record = FormatI8::Record<V, f16_t>;
    template <bool> static constexpr int32_t offset() { return 8; }
#endif
};

// Q4_1: Q4_0's nibbles, w = d u + m; scales per group: 16 f16 d, then 16 f16 m.
struct FormatQ4_1 : FormatQ4_0 {
    static constexpr int64_t kScaleBytes = 64;
    static constexpr bool kMin = true;
    static int32_t q(const BlockPtrs& b, int r, int64_t k) { return code(b, r, k); }
    static float scale(const BlockPtrs& b, int r, int64_t g, int) { return f16_at(b.s + g * 64 + r * 2); }
    static float min(const BlockPtrs& b, int r, int64_t g) { return f16_at(b.s + g * 64 + 32 + r * 2); }
#if !defined(LLAISYS_ISA_PORTABLE)
    template <class V>
    struct Record {  // a scale and a min per group
        V s, m;
        Record() = default;
        Record(const BlockPtrs& b, int64_t r, int part)
            : s(Lanes<V>::template at<f16_t>(b.s + r * 64, part)), m(Lanes<V>::template at<f16_t>(b.s + r * 64 + 32, part)) {}
        V scale(int, int) const { return s; }
        V min(int) const { return m; }
    };
    template <bool> static constexpr int32_t offset() { return 0; }
#endif
};

// Q4_K: units of 64 k (2 groups, 8 chunks): chunk c holds k = 4c .. 4c + 3 of the unit's first group (low
// nibbles) and of its second (high). Scales per 256 k (320 bytes): D f16 [16], Dm f16 [16], sc u8 [8][16],
// mn u8 [8][16]; w = (D sc) u - (Dm mn), both products exact in f32.
struct FormatQ4_K : UnsignedCodes {
    static constexpr int64_t kWeightBytes = 256, kScaleBytes = 320 / 8, kRecord = 320;
    static constexpr int kSubs = 1;
    static constexpr bool kMin = true;
    static int32_t q(const BlockPtrs& b, int r, int64_t k) {
        const int64_t kk = k % 64;
        const uint8_t byte = chunk_byte(b.w + (k / 64) * 512, (kk % 32) / 4, r, int(k % 4));
        return kk < 32 ? byte & 0x0F : byte >> 4;
    }
    static const uint8_t* record(const BlockPtrs& b, int64_t g) { return b.s + (g / 8) * kRecord; }
    static float scale(const BlockPtrs& b, int r, int64_t g, int) {
        const uint8_t* rec = record(b, g);
        return f16_at(rec + r * 2) * float(rec[64 + (g % 8) * 16 + r]);
    }
    static float min(const BlockPtrs& b, int r, int64_t g) {
        const uint8_t* rec = record(b, g);
        return -(f16_at(rec + 32 + r * 2) * float(rec[192 + (g % 8) * 16 + r]));
    }
#if !defined(LLAISYS_ISA_PORTABLE)
    template <class V, bool kVnni>  // an odd group's (the high nibbles) as 16 u with vnni
    static void steps(const BlockPtrs& b, int64_t g, int part, typename V::Int (&wt)[kQSteps]) {
        for (int s = 0; s < kQSteps; ++s)
            wt[s] = Lanes<V>::template nibble_as<kVnni>(Lanes<V>::chunk(b.w + (g / 2) * 512, s, part), g % 2 == 1);
    }
    template <bool kVnni, class VI> static VI group_sum(int64_t g, VI first, VI second) {
        return kVnni && g % 2 ? sra(first + second, 4) : first + second;  // (then a multiple of 16)
    }
    static constexpr int kRecordGroups = 8;
    template <class V>
    struct Record {  // D and -Dm of the 256 k, converted once; the groups' 6-bit sc and mn
        V d, neg_dmin;
        const uint8_t* sc;
        int part;
        Record() = default;
        Record(const BlockPtrs& b, int64_t r, int p)
            : d(Lanes<V>::template at<f16_t>(b.s + r * kRecord, p)),
              neg_dmin(V::zero() - Lanes<V>::template at<f16_t>(b.s + r * kRecord + 32, p)),
              sc(b.s + r * kRecord + 64), part(p) {}
        V scale(int j, int) const { return d * Lanes<V>::template at<uint8_t>(sc + j * 16, part); }
        V min(int j) const { return neg_dmin * Lanes<V>::template at<uint8_t>(sc + 128 + j * 16, part); }
    };
    template <bool> static constexpr int32_t offset() { return 0; }
#endif
};

// Q6_K: units of 128 k (4 groups, 1536 bytes, 24 chunks): low-nibble chunks c = 0 .. 15 (k = 4c .. 4c + 3 low,
// k + 64 high) and 2-bit high-field chunks c = 0 .. 7 (field j at bits 2j: k = 32 j + 4c .. + 3), in the order
// the unit's first two groups first read them: low 0, fields 0, low 1, fields 1, .., low 7, fields 7, then low
// 8 .. 15 (low_chunk, field_chunk). Group 0 then reads 1 KiB front to back, group 1 the last 512 B, and groups
// 2 and 3 what is cached: each unit streams from memory in order (ggml's order, the fields after all the
// nibbles, took the lm_head of a Q4_0 file from 36 to 20 GB/s: groups jumping back and forth defeated the
// hardware prefetchers). q = low | high << 4 in [0, 63]. Scales per 256 k (288 bytes): D f16 [16], then sc int8
// [16][16], one per 16 k; w = (D sc) (q - 32), D sc exact in f32.
struct FormatQ6_K : UnsignedCodes {
    static constexpr int64_t kWeightBytes = 384, kScaleBytes = 288 / 8, kRecord = 288, kUnitBytes = 1536;
    static constexpr int kSubs = 2;
    static constexpr bool kMin = false;
    static constexpr int64_t low_chunk(int64_t c) { return c < 8 ? 2 * c : 8 + c; }  // where low-nibble chunk c is
    static constexpr int64_t field_chunk(int64_t c) { return 2 * c + 1; }           // where field chunk c is
    static int32_t q(const BlockPtrs& b, int r, int64_t k) {
        const uint8_t* unit = b.w + (k / 128) * kUnitBytes;
        const int64_t kk = k % 128;
        const uint8_t low = chunk_byte(unit, low_chunk((kk % 64) / 4), r, int(k % 4));
        const uint8_t high = chunk_byte(unit, field_chunk((kk % 32) / 4), r, int(k % 4));
        return int32_t((kk < 64 ? low & 0x0F : low >> 4) | (((high >> (2 * (kk / 32))) & 3) << 4)) - 32;
    }
    static const uint8_t* record(const BlockPtrs& b, int64_t g) { return b.s + (g / 8) * kRecord; }
    static float scale(const BlockPtrs& b, int r, int64_t g, int t) {
        const uint8_t* rec = record(b, g);
        return f16_at(rec + r * 2) * float(int8_t(rec[32 + ((g % 8) * 2 + t) * 16 + r]));
    }
    static float min(const BlockPtrs&, int, int64_t) { return 0.0f; }
#if !defined(LLAISYS_ISA_PORTABLE)
    template <class V, bool>
    static void steps(const BlockPtrs& b, int64_t g, int part, typename V::Int (&wt)[kQSteps]) {
        using VI = typename V::Int;
        const uint8_t* unit = b.w + (g / 4) * kUnitBytes;
        const int j = int(g % 4);  // the group within the unit: k = 32 j ..
        for (int s = 0; s < kQSteps; ++s) {
            const VI low = Lanes<V>::nibble(Lanes<V>::chunk(unit, low_chunk((j % 2) * 8 + s), part), j >= 2);
            const VI fields = Lanes<V>::chunk(unit, field_chunk(s), part);  // field j (bits 2j, 2j + 1) to bits 4, 5
            const VI high = (j <= 2 ? fields << (4 - 2 * j) : fields >> 2) & VI(0x30303030u);
            wt[s] = low | high;
        }
    }
    static constexpr int kRecordGroups = 8;
    template <class V>
    struct Record {  // D of the 256 k, converted once; a scale per 16 k
        V d;
        const uint8_t* sc;
        int part;
        Record() = default;
        Record(const BlockPtrs& b, int64_t r, int p)
            : d(Lanes<V>::template at<f16_t>(b.s + r * kRecord, p)), sc(b.s + r * kRecord + 32), part(p) {}
        V scale(int j, int t) const { return d * Lanes<V>::template at<int8_t>(sc + (j * 2 + t) * 16, part); }
        V min(int) const { return V::zero(); }
    };
    template <bool> static constexpr int32_t offset() { return 32; }
#endif
};

// Calls f(F{}) with F the format of a LLAISYS_QFORMAT_* code; an unknown code is NOT_SUPPORTED.
template <class Fn>
inline void with_qformat(int fmt, Fn&& f) {
    switch (fmt) {
        case LLAISYS_QFORMAT_Q8_0: f(FormatQ8_0{}); break;
        case LLAISYS_QFORMAT_Q4_0: f(FormatQ4_0{}); break;
        case LLAISYS_QFORMAT_Q4_1: f(FormatQ4_1{}); break;
        case LLAISYS_QFORMAT_Q4_K: f(FormatQ4_K{}); break;
        case LLAISYS_QFORMAT_Q6_K: f(FormatQ6_K{}); break;
        default: break;
    }
}

}  // namespace llaisys::cpu::LLAISYS_ISA
