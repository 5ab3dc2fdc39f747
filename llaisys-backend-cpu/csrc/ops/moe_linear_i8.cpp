// moe_linear_i8: out[m, j] = x_mj @ w_e^T for e = experts[m, j], each expert's weight w_e in linear_i8's int8
// blocks (backend.h; format I8 of block_formats.h):
//     weight [E, NB, G, 8, 16, 4] int8, scales [E, NB, G, 16] bf16: expert e's blocks at [e]
//
// Each input row is quantized once (quantize_x, as linear_i8 quantizes it), the (row, slot) pairs are grouped by
// expert (moe_groups.h) and their quantized rows gathered into one block of rows per expert; each selected
// expert's blocks then stream once past its rows through linear_i8's own block kernel (block_rows_at<FormatI8>
// of linear_blocks.h, or the portable build's block_linear_scalar). Every output is thus, bit for bit, what
// linear_i8 gives for that input row and expert alone, whatever else is in the batch. The results are scattered
// back to out; experts no row chose are never read.
#include <cstring>

#include "../common/api.h"
#include "linear_blocks.h"
#include "moe_groups.h"

namespace llaisys::cpu {

struct MoeLinearI8Args {
    int dtype;                 // LLAISYS_F32 / _F16 / _BF16: out and x
    int64_t M, k, E, N, K;     // M, k, N >= 1 (the entry point returns before), K >= 0
    bool x_per_slot;           // x [M, k, K] (one input per slot) rather than x [M, K] (one per row)
    void* out;                 // [M, k, N]
    const void* x;             // [M, K] or [M, k, K]
    const uint8_t* weight;     // [E, NB, G, 8, 16, 4] int8
    const uint8_t* scales;     // [E, NB, G, 16] bf16
    const int64_t* experts;    // [M, k], each in [0, E)
};

}  // namespace llaisys::cpu

LLAISYS_DECLARE_PER_ISA(void moe_linear_i8(const MoeLinearI8Args& args))

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

// Expert e as linear_i8 sees a matrix: its blocks, its rows of xs (from the groups' start[e]), its outputs in ys.
struct ExpertI8 {
    BlockLinearArgs args;
    QuantizedX xq;
};

template <class T>
ExpertI8 expert_i8(const MoeLinearI8Args& a, const ExpertGroups& groups, const QuantizedX& xs, T* ys, int64_t e) {
    const int64_t first = groups.start[e], blocks = ceil_div(a.N, kQBlockRows);
    const BlockLinearArgs args{a.dtype, 0, groups.rows(e), a.N, a.K, ys + first * a.N, nullptr,
                               a.weight + e * blocks * xs.G * FormatI8::kWeightBytes,
                               a.scales + e * blocks * xs.G * FormatI8::kScaleBytes, nullptr};
    return ExpertI8{args, QuantizedX{xs.q + first * xs.ld, xs.sx + first * xs.G, xs.sum + first * xs.G * 2, xs.ld,
                                     xs.G}};
}

#if !defined(LLAISYS_ISA_PORTABLE)
// Tasks (selected expert, chunk of its blocks) shared among the threads, so a decode step streams the k chosen
// experts' blocks once, each thread its own consecutive chunks; rows past a tile (block_tile_rows) take more
// passes.
template <class V, bool kVnni, class T>
void moe_i8_simd(const MoeLinearI8Args& a, const ExpertGroups& groups, const QuantizedX& xs, T* ys) {
    // Chunks sized as linear_i8 sizes them, for all the chosen experts' blocks together: sized per expert, a decode
    // step of 8 experts of 48 blocks ran as 128 tasks of 3 blocks, in 1.05x the time of a dense linear_i8 over the
    // same bytes; as 16 tasks of 24 blocks, in 0.90x (medians of 3 alternating runs, 2 threads)
    const int64_t blocks = ceil_div(a.N, kQBlockRows), chunk = block_chunk(groups.count * blocks, team_size());
    const int64_t chunks = ceil_div(blocks, chunk), tile = block_tile_rows(xs), most = groups.most_rows();
    const bool parallel = team_size() > 1 && a.M * a.k * a.N * a.K >= (int64_t(1) << 16);
    for (int64_t t0 = 0; t0 < most; t0 += tile) {
        run_tasks(groups.count * chunks, [&](int64_t task) {
            const int64_t e = groups.selected[task / chunks], c = task % chunks, rows = groups.rows(e);
            if (rows <= t0) return;
            const ExpertI8 ex = expert_i8(a, groups, xs, ys, e);
            for (int64_t blk = c * chunk; blk < std::min(blocks, (c + 1) * chunk); ++blk)
                block_rows_at<V, FormatI8, kVnni, T>(ex.args, ex.xq, blk, t0, std::min(rows, t0 + tile));
        }, parallel);
    }
}
#endif

void moe_linear_i8(const MoeLinearI8Args& a) {
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
            const ExpertI8 ex = expert_i8(a, groups, xs, ys, groups.selected[i]);
            block_linear_scalar<FormatI8, T>(ex.args, ex.xq);
        }
#else
        with_block_path([&](auto v, auto vnni) {
            moe_i8_simd<decltype(v), decltype(vnni)::value, T>(a, groups, xs, ys);
        });
#endif
        for (int64_t i = 0; i < pairs; ++i) std::memcpy(out + groups.order[i] * N, ys + i * N, sizeof(T) * size_t(N));
    });
}

}  // namespace llaisys::cpu::LLAISYS_ISA

#if defined(LLAISYS_ISA_PORTABLE)  // the exported entry point, compiled once
int LLAISYS_FN(moe_linear_i8)(int device, void* stream, int dtype, int64_t M, int64_t k, int64_t E, int64_t N,
                              int64_t K, int x_per_slot, void* out, const void* x, const void* weight,
                              const void* scales, const void* experts) {
    (void)device;
    return llaisys::launch("moe_linear_i8", stream, [=] {
        llaisys::require_float_dtype(dtype);
        const int64_t* ids = static_cast<const int64_t*>(experts);
        llaisys::check_expert_ids(ids, M, k, E);
        if (M == 0 || k == 0 || N == 0) return;  // nothing to compute
        LLAISYS_PER_ISA(moe_linear_i8)(llaisys::cpu::MoeLinearI8Args{
            dtype, M, k, E, N, K, x_per_slot != 0, out, x, static_cast<const uint8_t*>(weight),
            static_cast<const uint8_t*>(scales), ids});
    });
}
#endif
