// linear_i8's SIMD kernel (avx2 and avx512 builds) over the weight's blocks of 16 rows (linear_i8.h).
//
// In a block, the 64 bytes at step s of group g hold the 4 bytes k = 32 g + 4 s .. + 3 of each of the 16 rows:
// loaded as vectors of W 32-bit lanes (one zmm, or two ymm halves), lane j holds row j's 4 bytes. A group is
// then, per row of x, 8 byte-dot steps: acc = dot(acc, the step's weights, the 4 bytes of xq at that k
// broadcast), which leaves the rows' exact int32 group sums in the lanes; they become f32 and join each row's
// f32 total with one FMA: total = (scales[rows, g] * sx[m, g]) * acc + total, g in order (the same for every M).
// No transposes, no masks: blocks and groups are whole (zero padded), only the last block's stores are partial.
//
// The byte dot (a Dot policy):
// - DotVnni (AVX512-VNNI): vpdpbusd multiplies unsigned by signed bytes; the weights are made unsigned by
//   flipping their sign bit (q + 128) and each group's sum starts at -128 * sum(xq of the group)
//   (QuantizedX::corr), which removes the offset exactly.
// - DotSigned (AVX2, AVX-512 without VNNI): dot4_i8, vpmaddubsw with the sign trick and vpmaddwd.
//
// Decode (M <= 8) reads each weight byte exactly once, as one sequential stream per thread: the blocks are
// shared among the threads in chunks (each thread takes its own consecutive chunks first, see thread_pool.h),
// and the hardware prefetchers follow the stream (prefetching the next block as well made decode 25% slower
// when the 2-core Zen 4 streamed ~60 GB/s). Larger M re-reads a block (from L1 / L2) per group of 8 rows of x,
// which the prefetchers do not follow: its first pass prefetches the next block into L2.
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

// total[p][m] (p < P vectors of W rows, m < MM) = the block w (scales sc: [G, 16]) against rows m0 + m of x,
// before the bias: the groups in order of k, so each total is the same f32 chain whatever M is.
// next: the block to prefetch into L2 meanwhile (the one that follows in memory), or null.
template <class V, class Dot, int MM>
LLAISYS_ALWAYS_INLINE void i8_block(const int8_t* __restrict w, const bf16_t* __restrict sc, const QuantizedX& xq,
                                    int64_t m0, const int8_t* next, V (&total)[kI8BlockRows / V::W][MM]) {
    using VI = typename V::Int;
    constexpr int W = V::W, P = kI8BlockRows / W, S = kI8Steps;
#pragma GCC unroll 2
    for (int p = 0; p < P; ++p)
#pragma GCC unroll 8
        for (int m = 0; m < MM; ++m) total[p][m] = V::zero();
    for (int64_t g = 0; g < xq.G; ++g) {
        const int8_t* wg = w + g * kI8GroupBytes;
        if (next)
#pragma GCC unroll 8
            for (int line = 0; line < int(kI8GroupBytes) / 64; ++line)
                __builtin_prefetch(next + g * kI8GroupBytes + line * 64, 0, 2);
#pragma GCC unroll 2
        for (int p = 0; p < P; ++p) {
            VI wt[S];  // step s: k = 32 g + 4 s .. + 3 of rows p W .. p W + W - 1
#pragma GCC unroll 8
            for (int s = 0; s < S; ++s) wt[s] = Dot::prep(VI::load(wg + s * 4 * kI8BlockRows + p * 4 * W));
            const V scale = V::load(sc + g * kI8BlockRows + p * W);
#pragma GCC unroll 8
            for (int m = 0; m < MM; ++m) {
                const int8_t* xk = xq.q + (m0 + m) * xq.ld + g * kI8Group;
                // two chains of 4 dependent dot steps (half the latency of one); integer sums, so exact either way
                VI even = Dot::start(xq.corr[(m0 + m) * xq.G + g]), odd = VI(0u);
#pragma GCC unroll 8
                for (int s = 0; s < S; s += 2) {
                    even = Dot::dot(even, wt[s], broadcast4<VI>(xk + 4 * s));
                    odd = Dot::dot(odd, wt[s + 1], broadcast4<VI>(xk + 4 * s + 4));
                }
                total[p][m] = fmadd(scale * V::set1(xq.sx[(m0 + m) * xq.G + g]), int_to_f32(even + odd), total[p][m]);
            }
        }
    }
}

// Block blk of the weight (of ceil(N / 16)) against rows [r0, r1) of x, in groups of up to kGemvMaxRows rows:
// + bias, rounded once, stored to the same rows of out. (moe_linear_i8 calls it per expert, with the expert's
// weight, scales, quantized rows and outputs.)
template <class V, class Dot, class T>
void i8_block_rows(const LinearI8Args& a, const QuantizedX& xq, int64_t blk, int64_t r0, int64_t r1) {
    constexpr int W = V::W, P = kI8BlockRows / W;
    const int64_t N = a.N, blocks = ceil_div(N, kI8BlockRows), block_bytes = xq.G * kI8GroupBytes;
    const T* bias = static_cast<const T*>(a.bias);
    T* out = static_cast<T*>(a.out);
    const int8_t* w = a.weight + blk * block_bytes;
    const bf16_t* sc = a.scales + blk * xq.G * kI8BlockRows;
    // More than one group of rows of x reads the block again from cache, which breaks the stream the
    // hardware prefetchers follow: the first pass then prefetches the next block itself.
    const int8_t* next = r1 - r0 > kGemvMaxRows && blk + 1 < blocks ? w + block_bytes : nullptr;
    for (int64_t m0 = r0; m0 < r1; m0 += kGemvMaxRows) {
        auto group = [&](auto mm) {
            constexpr int MM = decltype(mm)::value;
            V total[P][MM];
            i8_block<V, Dot, MM>(w, sc, xq, m0, m0 == r0 ? next : nullptr, total);
            for (int p = 0; p < P; ++p) {
                const int64_t n0 = blk * kI8BlockRows + p * W;
                const int rows = int(std::clamp<int64_t>(N - n0, 0, W));
                if (rows == 0) break;  // the last block's padding rows
                const V b = !bias ? V::zero() : rows == W ? V::load(bias + n0) : V::load_partial(bias + n0, rows);
                for (int m = 0; m < MM; ++m) {  // + bias, then rounded once
                    const V v = bias ? total[p][m] + b : total[p][m];
                    T* o = out + (m0 + m) * N + n0;
                    if (rows == W) v.store(o);
                    else v.store_partial(o, rows);
                }
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
}

// Blocks of weight rows per task: several chunks per thread, so a thread works through its own consecutive
// chunks, then helps the others (other processes may hold a core).
inline int64_t i8_chunk(int64_t blocks, int threads) {
    return std::clamp<int64_t>(blocks / (int64_t(threads) * 8), 1, 64);
}

// Rows of x per pass over the weight: as many (a multiple of 8) as keep their xq within ~256 KiB, so a weight
// block's groups of rows read xq from L2. Decode (M <= 8) is one pass: each weight byte is read once.
inline int64_t i8_tile_rows(const QuantizedX& xq) {
    return std::max<int64_t>(kGemvMaxRows, (int64_t(256) << 10) / xq.ld / kGemvMaxRows * kGemvMaxRows);
}

// Rows [r0, r1) of x against all the weight's blocks, the blocks shared among the threads.
template <class V, class Dot, class T>
void i8_rows(const LinearI8Args& a, const QuantizedX& xq, int64_t r0, int64_t r1) {
    const int64_t blocks = ceil_div(a.N, kI8BlockRows), chunk = i8_chunk(blocks, team_size());
    const bool parallel = team_size() > 1 && a.N * a.K * (r1 - r0) >= (int64_t(1) << 16) && blocks > 1;
    run_tasks(ceil_div(blocks, chunk), [&](int64_t c) {
        for (int64_t blk = c * chunk; blk < std::min(blocks, (c + 1) * chunk); ++blk)
            i8_block_rows<V, Dot, T>(a, xq, blk, r0, r1);
    }, parallel);
}

// All M rows, a tile of rows (i8_tile_rows) at a time.
template <class V, class Dot, class T>
void linear_i8_simd(const LinearI8Args& a, const QuantizedX& xq) {
    const int64_t tile = i8_tile_rows(xq);
    for (int64_t r0 = 0; r0 < a.M; r0 += tile) i8_rows<V, Dot, T>(a, xq, r0, std::min(a.M, r0 + tile));
}

// f(V{}, Dot{}) with this build's vector type and byte dot: AVX-512 with VNNI (unless LLAISYS_CPU_LINEAR_VNNI=0)
// or without, AVX2.
template <class F>
void with_i8_path(F&& f) {
#if defined(LLAISYS_ISA_AVX512)
    if (has_feature(Feature::kAvx512Vnni) && linear_vnni_allowed()) f(Vec16{}, DotVnni<Vec16i>{});
    else f(Vec16{}, DotSigned<Vec16i>{});
#else
    f(Vec8{}, DotSigned<Vec8i>{});
#endif
}

}  // namespace llaisys::cpu::LLAISYS_ISA
