// The grouped expert linear over blocks of 16 rows (linear_blocks.h), for every block format F: moe_linear_i8
// (F = FormatI8) and moe_linear_q (Q8_0, Q4_0, Q4_1, Q4_K, Q6_K: a GGUF file's stacked experts as stored):
//     out[m, j] = x_mj @ w_e^T for e = experts[m, j]
//     weight [E, NB, G * F::kWeightBytes], scales [E, NB, G * F::kScaleBytes]: expert e's blocks at [e]
// (NB = ceil(N / 16), G = ceil(K / 32).)
//
// Each input row is quantized once (quantize_x, as the dense block linear quantizes it), the (row, slot) pairs are
// grouped by expert (moe_groups.h) and their quantized rows gathered into one block of rows per expert; each
// selected expert's blocks then stream once past its rows through the dense linear's own block kernel
// (block_rows_at<F> of linear_blocks.h, or the portable build's block_linear_scalar<F>). Every output is thus, bit
// for bit, what linear_i8 / linear_q gives for that input row and expert alone, whatever else is in the batch. The
// results are scattered back to out; experts no row chose are never read.
#pragma once

#include <algorithm>
#include <cstring>

#include "../common/api.h"
#include "linear_blocks.h"
#include "moe_groups.h"

namespace llaisys::cpu {

struct MoeBlockArgs {
    int dtype;                 // LLAISYS_F32 / _F16 / _BF16: out and x
    int fmt;                   // LLAISYS_QFORMAT_* (moe_linear_q; moe_linear_i8 ignores it)
    int64_t M, k, E, N, K;     // M, k, N >= 1 (the entry points return before), K >= 0
    bool x_per_slot;           // x [M, k, K] (one input per slot) rather than x [M, K] (one per row)
    void* out;                 // [M, k, N]
    const void* x;             // [M, K] or [M, k, K]
    const uint8_t* weight;     // [E, NB, G * F::kWeightBytes]
    const uint8_t* scales;     // [E, NB, G * F::kScaleBytes]
    const int64_t* experts;    // [M, k], each in [0, E)
};

}  // namespace llaisys::cpu

namespace llaisys::cpu::LLAISYS_ISA {

// The quantized input of every pair, in the groups' order ([pairs, ld]; per-thread scratch).
inline QuantizedX gather_rows(const QuantizedX& xq, const ExpertGroups& groups, int64_t pairs, int64_t k,
                              bool x_per_slot) {
    const int64_t ld = xq.ld, G = xq.G;
    const size_t q_bytes = size_t(pairs * ld), s_bytes = size_t(round_up(pairs * G * 4, 64));
    char* buf = scratch(kSlotMoeRows).get<char>(q_bytes + 3 * s_bytes);
    int8_t* q = reinterpret_cast<int8_t*>(buf);
    float* sx = reinterpret_cast<float*>(buf + q_bytes);
    int32_t* sum = reinterpret_cast<int32_t*>(buf + q_bytes + s_bytes);  // [pairs, G, 2]
    for (int64_t i = 0; i < pairs; ++i) {
        const int64_t r = groups.order[i], row = x_per_slot ? r : r / k;
        std::memcpy(q + i * ld, xq.q + row * ld, size_t(ld));
        std::memcpy(sx + i * G, xq.sx + row * G, sizeof(float) * size_t(G));
        std::memcpy(sum + i * G * 2, xq.sum + row * G * 2, sizeof(int32_t) * size_t(2 * G));
    }
    return QuantizedX{q, sx, sum, ld, G};
}

// Expert e as the dense block linear sees a matrix: its blocks, its rows of xs (from the groups' start[e]), its
// outputs in ys.
struct ExpertBlocks {
    BlockLinearArgs args;
    QuantizedX xq;
};

template <class F, class T>
ExpertBlocks expert_blocks(const MoeBlockArgs& a, const ExpertGroups& groups, const QuantizedX& xs, T* ys,
                           int64_t e) {
    const int64_t first = groups.start[e], blocks = ceil_div(a.N, kQBlockRows);
    const BlockLinearArgs args{a.dtype, a.fmt, groups.rows(e), a.N, a.K, ys + first * a.N, nullptr,
                               a.weight + e * blocks * xs.G * F::kWeightBytes,
                               a.scales + e * blocks * xs.G * F::kScaleBytes, nullptr};
    return ExpertBlocks{args, QuantizedX{xs.q + first * xs.ld, xs.sx + first * xs.G, xs.sum + first * xs.G * 2,
                                         xs.ld, xs.G}};
}

#if !defined(LLAISYS_ISA_PORTABLE)
// Tasks (selected expert, chunk of its blocks) shared among the threads, so a decode step streams the k chosen
// experts' blocks once, each thread its own consecutive chunks; rows past a tile (block_tile_rows) take more
// passes.
template <class V, class F, bool kVnni, class T>
void moe_blocks_simd(const MoeBlockArgs& a, const ExpertGroups& groups, const QuantizedX& xs, T* ys) {
    // Chunks sized as the dense linear sizes them, for all the chosen experts' blocks together: sized per expert, a
    // decode step of 8 int8 experts of 48 blocks ran as 128 tasks of 3 blocks, in 1.05x the time of a dense
    // linear_i8 over the same bytes; as 16 tasks of 24 blocks, in 0.90x (medians of 3 alternating runs, 2 threads)
    const int64_t blocks = ceil_div(a.N, kQBlockRows), chunk = block_chunk(groups.count * blocks, team_size());
    const int64_t chunks = ceil_div(blocks, chunk), tile = block_tile_rows(xs), most = groups.most_rows();
    const bool parallel = team_size() > 1 && a.M * a.k * a.N * a.K >= (int64_t(1) << 16);
    for (int64_t t0 = 0; t0 < most; t0 += tile) {
        run_tasks(groups.count * chunks, [&](int64_t task) {
            const int64_t e = groups.selected[task / chunks], c = task % chunks, rows = groups.rows(e);
            if (rows <= t0) return;
            const ExpertBlocks ex = expert_blocks<F>(a, groups, xs, ys, e);
            for (int64_t blk = c * chunk; blk < std::min(blocks, (c + 1) * chunk); ++blk)
                block_rows_at<V, F, kVnni, T>(ex.args, ex.xq, blk, t0, std::min(rows, t0 + tile));
        }, parallel);
    }
}
#endif

// The grouped expert linear of format F in this build.
template <class F>
void moe_block_linear(const MoeBlockArgs& a) {
    with_float_type(a.dtype, [&](auto tag) {
        using T = decltype(tag);
        const int64_t pairs = a.M * a.k, N = a.N;
        T* out = static_cast<T*>(a.out);
        if (a.K == 0) return fill_rows_with_bias(out, static_cast<const T*>(nullptr), pairs, N);
        const ExpertGroups groups(a.experts, pairs, a.E);
        const QuantizedX xq = quantize_x(static_cast<const T*>(a.x), a.x_per_slot ? pairs : a.M, a.K);
        const QuantizedX xs = gather_rows(xq, groups, pairs, a.k, a.x_per_slot);
        T* ys = scratch(kSlotMoeOut).get<T>(size_t(pairs * N));
#if defined(LLAISYS_ISA_PORTABLE)
        for (int64_t i = 0; i < groups.count; ++i) {
            const ExpertBlocks ex = expert_blocks<F>(a, groups, xs, ys, groups.selected[i]);
            block_linear_scalar<F, T>(ex.args, ex.xq);
        }
#else
        with_block_path([&](auto v, auto vnni) {
            moe_blocks_simd<decltype(v), F, decltype(vnni)::value, T>(a, groups, xs, ys);
        });
#endif
        for (int64_t i = 0; i < pairs; ++i) std::memcpy(out + groups.order[i] * N, ys + i * N, sizeof(T) * size_t(N));
    });
}

}  // namespace llaisys::cpu::LLAISYS_ISA
