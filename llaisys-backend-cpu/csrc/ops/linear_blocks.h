// The block linears: out[M, N] = x[M, K] @ w[N, K]^T + bias[N] with w stored in blocks of 16 rows in one of
// the formats of block_formats.h (linear_i8: I8; linear_q: Q8_0, Q4_0, Q4_1, Q4_K, Q6_K). One algorithm for
// every format, written once here:
//
// Every row of x is quantized on the fly per group of 32 k (quantized_x.h): sx = max|x| / 127, xq =
// round-half-to-even(x / sx). Then, per output and group g in order of k,
//     total += (scale(n, g) * sx[m, g]) * dot_g          (per half group, with its own scale, for Q6_K)
//     total += min(n, g) * (sx[m, g] * sum_g(xq))        (formats with a min: Q4_1, Q4_K)
// where dot_g = sum over the group of q[n, k] * xq[m, k] is an exact int32 (q: the format's integers, offset
// included), and the rest f32, rounded once to the output dtype after the bias. A row of out depends on its
// row of x only: the integer dots are exact and the f32 chain over g runs in the same order whatever M is
// (batch invariance).
//
// SIMD (avx2, avx512 builds): a block's group is 8 step vectors (4 k of each of the 16 rows per 32-bit lane:
// one zmm, or two ymm parts of 8 rows), each dotted with 4 bytes of xq broadcast, leaving the rows' group
// sums in the lanes: no transposes, no masks (blocks and groups are zero padded; only the last block's stores
// are partial). Byte dots: vpdpbusd with AVX512-VNNI (unsigned weights: see block_formats.h), else vpmaddubsw.
// Decode (M <= 8) reads each weight byte once, as one sequential stream per thread: the blocks are shared
// among the threads in chunks (each thread takes its own consecutive chunks first, see thread_pool.h), and
// the hardware prefetchers follow the stream (prefetching the next block as well made int8 decode 25% slower
// when the 2-core Zen 4 streamed ~60 GB/s). Larger M re-reads a block (from L1 / L2) per group of 8 rows of x,
// which the prefetchers do not follow: its first pass prefetches the next block into L2.
// The portable build runs block_linear_scalar: one output at a time, the same arithmetic in scalar code.
#pragma once

#include <cstdint>
#include <type_traits>

#include "../common/thread_pool.h"
#include "block_formats.h"
#include "linear.h"
#include "quantized_x.h"

namespace llaisys::cpu {

struct BlockLinearArgs {
    int dtype;                 // LLAISYS_F32 / _F16 / _BF16: out, x and bias
    int fmt;                   // LLAISYS_QFORMAT_* (linear_q; linear_i8 ignores it)
    int64_t M, N, K;           // M, N >= 1 (the entry points return before), K >= 0
    void* out;                 // [M, N]
    const void* x;             // [M, K]
    const uint8_t* weight;     // the blocks: [NB, G * F::kWeightBytes]
    const uint8_t* scales;     // [NB, G * F::kScaleBytes]
    const void* bias;          // [N] or nullptr
};

// LLAISYS_CPU_LINEAR_VNNI=0: no AVX512-VNNI (vpdpbusd) even where the CPU has it (the avx512 build then
// takes the path of AVX-512 CPUs without VNNI). Read once per process; tests use it to reach every path.
bool linear_vnni_allowed();

}  // namespace llaisys::cpu

LLAISYS_DECLARE_PER_ISA(void linear_i8(const BlockLinearArgs& args))
LLAISYS_DECLARE_PER_ISA(void linear_q(const BlockLinearArgs& args))

namespace llaisys::cpu::LLAISYS_ISA {

template <class F>
BlockPtrs block_at(const BlockLinearArgs& a, int64_t G, int64_t blk) {
    return BlockPtrs{a.weight + blk * G * F::kWeightBytes, a.scales + blk * G * F::kScaleBytes};
}

// The portable build's kernel: one output at a time, the same arithmetic in scalar code (without FMA).
template <class F, class T>
void block_linear_scalar(const BlockLinearArgs& a, const QuantizedX& xq) {
    const int64_t M = a.M, N = a.N, G = xq.G;
    const T* bias = static_cast<const T*>(a.bias);
    T* out = static_cast<T*>(a.out);
    constexpr int64_t kSubK = kQGroup / F::kSubs;
    run_ranges(N, [&](int64_t n_begin, int64_t n_end) {
        for (int64_t n = n_begin; n < n_end; ++n) {
            const BlockPtrs b = block_at<F>(a, G, n / kQBlockRows);
            const int r = int(n % kQBlockRows);
            for (int64_t m = 0; m < M; ++m) {
                const int8_t* x = xq.q + m * xq.ld;
                float acc = 0.0f;
                for (int64_t g = 0; g < G; ++g) {
                    const float sx = xq.sx[m * G + g];
                    for (int t = 0; t < F::kSubs; ++t) {
                        int32_t dot = 0;  // the padding past K is zero in x
                        for (int64_t k = g * kQGroup + t * kSubK; k < g * kQGroup + (t + 1) * kSubK; ++k)
                            dot += F::q(b, r, k) * int32_t(x[k]);
                        acc += (F::scale(b, r, g, t) * sx) * float(dot);
                    }
                    if constexpr (F::kMin) acc += F::min(b, r, g) * (sx * float(xq.group_sum(m, g)));
                }
                if (bias) acc += to_f32(bias[n]);
                out[m * N + n] = from_f32<T>(acc);
            }
        }
    }, N * a.K * M >= (int64_t(1) << 16));
}

#if !defined(LLAISYS_ISA_PORTABLE)

// total[p][m] (p < P vectors of W rows, m < MM) = the block b against rows m0 + m of x, before the bias: the
// groups in order of k, so each total is the same f32 chain whatever M is.
// next: the block to prefetch into L2 meanwhile (the one that follows in memory), or null.
template <class V, class F, bool kVnni, int MM>
LLAISYS_ALWAYS_INLINE void block_totals(const BlockPtrs& b, const QuantizedX& xq, int64_t m0, const uint8_t* next,
                                        V (&total)[kQBlockRows / V::W][MM]) {
    using VI = typename V::Int;
    constexpr int W = V::W, P = kQBlockRows / W, S = kQSteps, kSubs = F::kSubs;
    constexpr int32_t kOffset = F::template offset<kVnni>();
#pragma GCC unroll 2
    for (int p = 0; p < P; ++p)
#pragma GCC unroll 8
        for (int m = 0; m < MM; ++m) total[p][m] = V::zero();
    constexpr int kRecordGroups = F::kRecordGroups;
    for (int64_t r = 0; r < xq.G / kRecordGroups; ++r) {  // (the K formats' K is a multiple of 256)
        typename F::template Record<V> rec[P];
#pragma GCC unroll 2
        for (int p = 0; p < P; ++p) rec[p] = typename F::template Record<V>(b, r, p);
        for (int j = 0; j < kRecordGroups; ++j) {
            const int64_t g = r * kRecordGroups + j;
            if (next)
#pragma GCC unroll 8
                for (int line = 0; line < int(F::kWeightBytes) / 64; ++line)
                    __builtin_prefetch(next + g * F::kWeightBytes + line * 64, 0, 2);
#pragma GCC unroll 2
            for (int p = 0; p < P; ++p) {
                VI wt[S];  // step s: k = 32 g + 4 s .. + 3 of rows p W .. p W + W - 1
                F::template steps<V, kVnni>(b, g, p, wt);
                V scale[kSubs];
#pragma GCC unroll 2
                for (int t = 0; t < kSubs; ++t) scale[t] = rec[p].scale(j, t);
                const V min = F::kMin ? rec[p].min(j) : V::zero();
#pragma GCC unroll 8
                for (int m = 0; m < MM; ++m) {
                    const int64_t row = m0 + m;
                    const int8_t* xk = xq.q + row * xq.ld + g * kQGroup;
                    const int32_t* sums = xq.sum + (row * xq.G + g) * 2;
                    const V sx = V::set1(xq.sx[row * xq.G + g]);
                    if constexpr (kSubs == 1) {
                        // two chains of 4 dependent dot steps (half the latency of one), the group's first and
                        // second 4 steps; integer sums, so exact
                        VI first = VI(uint32_t(-kOffset * (sums[0] + sums[1]))), second = VI(0u);
#pragma GCC unroll 8
                        for (int s = 0; s < S / 2; ++s) {
                            first = F::template dot<VI, kVnni>(first, wt[s], xk + 4 * s);
                            second = F::template dot<VI, kVnni>(second, wt[s + S / 2], xk + 4 * s + kQHalf);
                        }
                        const VI sum = F::template group_sum<kVnni>(g, first, second);
                        total[p][m] = fmadd(scale[0] * sx, int_to_f32(sum), total[p][m]);
                    } else {  // a scale per half group: one chain each
                        VI half[2] = {VI(uint32_t(-kOffset * sums[0])), VI(uint32_t(-kOffset * sums[1]))};
#pragma GCC unroll 8
                        for (int s = 0; s < S / 2; ++s) {
                            half[0] = F::template dot<VI, kVnni>(half[0], wt[s], xk + 4 * s);
                            half[1] = F::template dot<VI, kVnni>(half[1], wt[s + S / 2], xk + 4 * s + kQHalf);
                        }
                        total[p][m] = fmadd(scale[0] * sx, int_to_f32(half[0]), total[p][m]);
                        total[p][m] = fmadd(scale[1] * sx, int_to_f32(half[1]), total[p][m]);
                    }
                    if constexpr (F::kMin) {
                        const float sum_x = xq.sx[row * xq.G + g] * float(sums[0] + sums[1]);
                        total[p][m] = fmadd(min, V::set1(sum_x), total[p][m]);
                    }
                }
            }
        }
    }
}

// Block blk of the weight (of ceil(N / 16)) against rows [r0, r1) of x, in groups of up to kGemvMaxRows rows:
// + bias, rounded once, stored to the same rows of out. (moe_blocks.h calls it per expert, with the expert's
// blocks, quantized rows and outputs.)
template <class V, class F, bool kVnni, class T>
void block_rows_at(const BlockLinearArgs& a, const QuantizedX& xq, int64_t blk, int64_t r0, int64_t r1) {
    constexpr int W = V::W, P = kQBlockRows / W;
    const int64_t N = a.N;
    const T* bias = static_cast<const T*>(a.bias);
    T* out = static_cast<T*>(a.out);
    const int64_t blocks = ceil_div(N, kQBlockRows), block_bytes = xq.G * F::kWeightBytes;
    const BlockPtrs b = block_at<F>(a, xq.G, blk);
    // More than one group of rows of x reads the block again from cache, which breaks the stream the
    // hardware prefetchers follow: the first pass then prefetches the next block itself.
    const uint8_t* next = r1 - r0 > kGemvMaxRows && blk + 1 < blocks ? b.w + block_bytes : nullptr;
    for (int64_t m0 = r0; m0 < r1; m0 += kGemvMaxRows) {
        auto group = [&](auto mm) {
            constexpr int MM = decltype(mm)::value;
            V total[P][MM];
            block_totals<V, F, kVnni, MM>(b, xq, m0, m0 == r0 ? next : nullptr, total);
            for (int p = 0; p < P; ++p) {
                const int64_t n0 = blk * kQBlockRows + p * W;
                const int rows = int(std::clamp<int64_t>(N - n0, 0, W));
                if (rows == 0) break;  // the last block's padding rows
                const V bv = !bias ? V::zero() : rows == W ? V::load(bias + n0) : V::load_partial(bias + n0, rows);
                for (int m = 0; m < MM; ++m) {  // + bias, then rounded once
                    const V v = bias ? total[p][m] + bv : total[p][m];
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
inline int64_t block_chunk(int64_t blocks, int threads) {
    return std::clamp<int64_t>(blocks / (int64_t(threads) * 8), 1, 64);
}

// Rows of x per pass over the weight: as many (a multiple of 8) as keep their xq within ~256 KiB, so a weight
// block's groups of rows read xq from L2. Decode (M <= 8) is one pass: each weight byte is read once.
inline int64_t block_tile_rows(const QuantizedX& xq) {
    return std::max<int64_t>(kGemvMaxRows, (int64_t(256) << 10) / xq.ld / kGemvMaxRows * kGemvMaxRows);
}

// Rows [r0, r1) of x against all the weight's blocks, the blocks shared among the threads.
template <class V, class F, bool kVnni, class T>
void block_rows(const BlockLinearArgs& a, const QuantizedX& xq, int64_t r0, int64_t r1) {
    const int64_t blocks = ceil_div(a.N, kQBlockRows), chunk = block_chunk(blocks, team_size());
    const bool parallel = team_size() > 1 && a.N * a.K * (r1 - r0) >= (int64_t(1) << 16) && blocks > 1;
    run_tasks(ceil_div(blocks, chunk), [&](int64_t c) {
        for (int64_t blk = c * chunk; blk < std::min(blocks, (c + 1) * chunk); ++blk)
            block_rows_at<V, F, kVnni, T>(a, xq, blk, r0, r1);
    }, parallel);
}

// All M rows, a tile of rows (block_tile_rows) at a time.
template <class V, class F, bool kVnni, class T>
void block_linear_simd(const BlockLinearArgs& a, const QuantizedX& xq) {
    const int64_t tile = block_tile_rows(xq);
    for (int64_t r0 = 0; r0 < a.M; r0 += tile) block_rows<V, F, kVnni, T>(a, xq, r0, std::min(a.M, r0 + tile));
}

// f(V{}, std::bool_constant<vnni>{}) with this build's vector type and byte dot: AVX-512 with VNNI (unless
// LLAISYS_CPU_LINEAR_VNNI=0) or without, AVX2.
template <class Fn>
void with_block_path(Fn&& f) {
#if defined(LLAISYS_ISA_AVX512)
    if (has_feature(Feature::kAvx512Vnni) && linear_vnni_allowed()) f(Vec16{}, std::true_type{});
    else f(Vec16{}, std::false_type{});
#else
    f(Vec8{}, std::false_type{});
#endif
}

#endif  // !LLAISYS_ISA_PORTABLE

// The linear of format F in this build: x quantized, then the SIMD kernel of the CPU's level (VNNI or not) or
// the scalar one.
template <class F>
void block_linear(const BlockLinearArgs& a) {
    with_float_type(a.dtype, [&](auto tag) {
        using T = decltype(tag);
        if (a.K == 0) return fill_rows_with_bias(static_cast<T*>(a.out), static_cast<const T*>(a.bias), a.M, a.N);
        const QuantizedX xq = quantize_x(static_cast<const T*>(a.x), a.M, a.K);
#if defined(LLAISYS_ISA_PORTABLE)
        block_linear_scalar<F, T>(a, xq);
#else
        with_block_path([&](auto v, auto vnni) { block_linear_simd<decltype(v), F, decltype(vnni)::value, T>(a, xq); });
#endif
    });
}

}  // namespace llaisys::cpu::LLAISYS_ISA
