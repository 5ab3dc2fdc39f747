// linear_i8's SIMD kernel (avx2 and avx512 builds): W weight rows in the W 32-bit lanes of a vector, every
// weight byte read once per group of up to 8 rows of x, no repacking.
//
// Per chunk of 4W consecutive k (64 with zmm, 32 with ymm) the W rows' bytes are loaded straight from the
// row-major [N, K] weight (one vector per row: W dwords of 4 k each) and transposed in registers as a W x W
// matrix of dwords, so that t[s] holds, in lane j, the 4 bytes k0 + 4s .. k0 + 4s + 3 of row j. Each group of
// 32 k is then 8 byte-dot steps per row of x: acc = dot(acc, t[s], the 4 bytes of xq at k0 + 4s broadcast),
// giving the W rows' exact int32 group sums in the lanes, which become f32 and join the row's f32 total with
// one FMA: total = (scales[g, rows] * sx[m, g]) * acc + total, g in order (the same for every M).
//
// The byte dot (a Dot policy):
// - DotVnni (AVX512-VNNI): vpdpbusd multiplies unsigned by signed bytes; the weights are made unsigned by
//   flipping their sign bit (q + 128) and each group's sum starts at -128 * sum(xq of the group)
//   (QuantizedX::corr), which removes the offset exactly.
// - DotSigned (AVX2, AVX-512 without VNNI): dot4_i8, vpmaddubsw with the sign trick and vpmaddwd.
// Decode (M <= 8) reads each weight byte exactly once; blocks of W rows are shared among the threads in
// chunks (each thread takes its own consecutive chunks first, see thread_pool.h); larger M re-reads a block
// (from L1 / L2) per group of 8 rows of x. The avx512 build takes W = 8 (ymm) for one row of x (linear_i8.cpp).
// Prefetch (decode is bound by the weight reads): a block is W consecutive rows, so contiguous; while one is
// read row-parallel, the next one is prefetched into L2 in address order (a stream the hardware prefetchers
// join), and the scales, one strided line per group, a dozen groups ahead. On the 2-core Zen 4 this was
// measured on, that beat prefetching each row a fixed distance ahead by 10-40% (short rows most).
#pragma once

#include <cstring>
#include <type_traits>

#include "../common/thread_pool.h"
#include "linear_i8.h"

namespace llaisys::cpu::LLAISYS_ISA {

template <class VI>
struct DotVnni {
    static VI prep(VI w) { return w ^ VI(0x80808080u); }          // q + 128 as unsigned bytes
    static VI start(int32_t corr) { return VI(uint32_t(corr)); }  // -128 * sum(xq): removes the + 128
    static VI dot(VI acc, VI w, VI x) { return dot4_u8i8(acc, w, x); }
};

template <class VI>
struct DotSigned {
    static VI prep(VI w) { return w; }
    static VI start(int32_t) { return VI(0u); }
    static VI dot(VI acc, VI w, VI x) { return dot4_i8(acc, w, x); }
};

// The 4 bytes of xq at p as one broadcast dword.
template <class VI>
LLAISYS_ALWAYS_INLINE VI broadcast4(const int8_t* p) {
    uint32_t u;
    std::memcpy(&u, p, 4);
    return VI(u);
}

// How far ahead (in k) a block's scales are prefetched: a dozen groups.
constexpr int64_t kScalesAhead = 384;

// One chunk of CK = 4W consecutive k (from k0) of the block at w: total[m] += its groups, for rows m0 + m of x.
// kWhole: all W rows and all CK bytes are there (no masks, no tests); else rows <= W and nb <= CK bytes.
// ahead: W * CK bytes of the weights to prefetch into L2 (the next block's, in address order), or null.
template <class V, class Dot, int MM, bool kWhole>
LLAISYS_ALWAYS_INLINE void i8_chunk(const int8_t* __restrict w, int64_t K, int64_t k0, int rows, int nb,
                                    const bf16_t* __restrict scales, int64_t N, const QuantizedX& xq, int64_t m0,
                                    const int8_t* ahead, V (&total)[MM]) {
    using VI = typename V::Int;
    constexpr int W = V::W, CK = 4 * W, GC = CK / int(kI8Group);  // k per chunk, groups per chunk
    V t[W];
#pragma GCC unroll 16
    for (int j = 0; j < W; ++j) {
        const int8_t* p = w + j * K + k0;
        if (ahead) __builtin_prefetch(ahead + j * CK, 0, 2);  // into L2
        t[j] = kWhole || nb == CK ? (kWhole || j < rows ? as_f32(VI::load(p)) : V::zero())
                                  : (j < rows ? as_f32(VI::load_bytes_partial(p, nb)) : V::zero());
    }
    // this block's scales kScalesAhead k ahead (strided lines the hardware does not fetch early), continuing
    // into the next block's at the end
#pragma GCC unroll 2
    for (int gc = 0; gc < GC; ++gc) {
        const int64_t g = (k0 + kScalesAhead) / kI8Group + gc;
        if (g < xq.G) __builtin_prefetch(scales + g * N);
        else if (ahead) __builtin_prefetch(scales + (g - xq.G) * N + W);
    }
    transpose(t);  // t[s], lane j: bytes k0 + 4s .. k0 + 4s + 3 of row j
    VI wt[W];
#pragma GCC unroll 16
    for (int s = 0; s < W; ++s) wt[s] = Dot::prep(bits_of(t[s]));
#pragma GCC unroll 2
    for (int gc = 0; gc < GC; ++gc) {
        const int64_t g = k0 / kI8Group + gc;
        if (!kWhole && g >= xq.G) break;  // the last chunk's padding beyond K
        const bf16_t* sg = scales + g * N;
        const V sc = kWhole || rows == W ? V::load(sg) : V::load_partial(sg, rows);
#pragma GCC unroll 8
        for (int m = 0; m < MM; ++m) {
            const int8_t* xk = xq.q + (m0 + m) * xq.ld + k0 + gc * kI8Group;
            // two chains of 4 dependent dot steps (half the latency of one); integer sums, so exact either way
            VI even = Dot::start(xq.corr[(m0 + m) * xq.G + g]), odd = VI(0u);
#pragma GCC unroll 8
            for (int s = 0; s < 8; s += 2) {
                even = Dot::dot(even, wt[gc * 8 + s], broadcast4<VI>(xk + 4 * s));
                odd = Dot::dot(odd, wt[gc * 8 + s + 1], broadcast4<VI>(xk + 4 * s + 4));
            }
            total[m] = fmadd(sc * V::set1(xq.sx[(m0 + m) * xq.G + g]), int_to_f32(even + odd), total[m]);
        }
    }
}

// total[m] (m < MM) = the rows [0, rows) (rows <= W) of the block at w, for rows m0 + m of x, before the bias.
// scales points at this block's first row in group 0 (scales + n0; group g is at + g * N). The chunks run in
// order of k whatever the path, so each total is the same f32 chain over the groups for every M.
// next: the block to prefetch meanwhile (the W * K bytes that follow this block), or null: W * CK bytes of it
// per chunk, so all of it by the time this one ends.
template <class V, class Dot, int MM>
LLAISYS_ALWAYS_INLINE void i8_block(const int8_t* __restrict w, int64_t K, int rows, const bf16_t* __restrict scales,
                                    int64_t N, const QuantizedX& xq, int64_t m0, const int8_t* next, V (&total)[MM]) {
    constexpr int W = V::W, CK = 4 * W;
#pragma GCC unroll 8
    for (int m = 0; m < MM; ++m) total[m] = V::zero();
    int64_t k0 = 0;
    if (rows == W)
        for (; k0 + CK <= K; k0 += CK)
            i8_chunk<V, Dot, MM, true>(w, K, k0, W, CK, scales, N, xq, m0, next ? next + k0 * W : nullptr, total);
    for (; k0 < K; k0 += CK)
        i8_chunk<V, Dot, MM, false>(w, K, k0, rows, int(std::min<int64_t>(CK, K - k0)), scales, N, xq, m0,
                                    next ? next + k0 * W : nullptr, total);
}

// Rows [r0, r1) of x against all N weight rows: blocks of W weight rows shared among the threads, each block
// used for groups of up to kGemvMaxRows rows of x in turn.
template <class V, class Dot, class T>
void i8_rows(const LinearI8Args& a, const QuantizedX& xq, int64_t r0, int64_t r1) {
    constexpr int W = V::W;
    const int64_t N = a.N, K = a.K;
    const T* bias = static_cast<const T*>(a.bias);
    T* out = static_cast<T*>(a.out);
    const int64_t blocks = ceil_div(N, W);
    const int threads = team_size();
    // Chunks of blocks, several per thread: a thread works through its own consecutive chunks, then helps
    // the others (other processes may hold a core).
    const int64_t chunk = std::clamp<int64_t>(blocks / (int64_t(threads) * 8), 1, 64);
    const bool parallel = threads > 1 && N * K * (r1 - r0) >= (int64_t(1) << 16) && blocks > 1;
    auto block_rows = [&](int64_t blk) {
        const int64_t n0 = blk * W;
        const int rows = int(std::min<int64_t>(W, N - n0));
        const V b = !bias ? V::zero() : rows == W ? V::load(bias + n0) : V::load_partial(bias + n0, rows);
        for (int64_t m0 = r0; m0 < r1; m0 += kGemvMaxRows) {
            auto group = [&](auto mm) {
                constexpr int MM = decltype(mm)::value;
                V total[MM];
                // the next block while reading this one the first time (it is in cache for the next groups)
                const int8_t* next = m0 == r0 && blk + 1 < blocks ? a.weight + (n0 + W) * K : nullptr;
                i8_block<V, Dot, MM>(a.weight + n0 * K, K, rows, a.scales + n0, N, xq, m0, next, total);
                for (int m = 0; m < MM; ++m) {  // + bias, then rounded once
                    const V v = bias ? total[m] + b : total[m];
                    T* o = out + (m0 + m) * N + n0;
                    if (rows == W) v.store(o);
                    else v.store_partial(o, rows);
                }
            };
            switch (std::min<int64_t>(r1 - m0, kGemvMaxRows)) {
                case 1: group(std::integral_constant<int, 1>{}); break;
                case 2: group(std::integral_constant<int, 2>{}); break;
                case 3: group(std::integral_constant<int, 3>{}); break;
                case 4: group(std::integral_constant<int, 4>{}); break;
                case 5: group(std::integral_constant<int, 5>{}); break;
                case 6: group(std::integral_constant<int, 6>{}); break;
                case 7: group(std::integral_constant<int, 7>{}); break;
                default: group(std::integral_constant<int, 8>{}); break;
            }
        }
    };
    run_tasks(ceil_div(blocks, chunk), [&](int64_t c) {
        for (int64_t blk = c * chunk; blk < std::min(blocks, (c + 1) * chunk); ++blk) block_rows(blk);
    }, parallel);
}

// All M rows, in tiles of as many rows (a multiple of 8) as keep their xq within ~256 KiB: a weight block's
// groups of rows then read xq from L2. Decode (M <= 8) is one tile: each weight byte is read once.
template <class V, class Dot, class T>
void linear_i8_simd(const LinearI8Args& a, const QuantizedX& xq) {
    const int64_t tile = std::max<int64_t>(kGemvMaxRows, (int64_t(256) << 10) / xq.ld / kGemvMaxRows * kGemvMaxRows);
    for (int64_t r0 = 0; r0 < a.M; r0 += tile) i8_rows<V, Dot, T>(a, xq, r0, std::min(a.M, r0 + tile));
}

}  // namespace llaisys::cpu::LLAISYS_ISA
