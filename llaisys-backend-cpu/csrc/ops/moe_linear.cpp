// moe_linear: out[m, j] = x_mj @ weight[experts[m, j]]^T (backend.h). The M * k (row, slot) pairs are sorted
// by expert (a counting sort: within an expert the pairs keep their order), their inputs gathered into one
// block of rows per expert, and each selected expert's [N, K] matrix streams once past its rows through
// linear_dot.h's dot_block: the same dot products, summed in the same order, as `linear` computes, so an
// output depends only on its own input row and expert (never on the batch). The results are then scattered
// back to out. Experts no row chose are never read.
#include <cstring>

#include "../common/api.h"
#include "linear_tiles.h"
#include "moe_groups.h"

namespace llaisys::cpu {

struct MoeLinearArgs {
    int dtype;                 // LLAISYS_F32 / _F16 / _BF16
    int64_t M, k, E, N, K;
    bool x_per_slot;           // x [M, k, K] (one input per slot) rather than x [M, K] (one per row)
    void* out;                 // [M, k, N]
    const void* x;             // [M, K] or [M, k, K]
    const void* weight;        // [E, N, K]
    const int64_t* experts;    // [M, k], each in [0, E)
};

}  // namespace llaisys::cpu

LLAISYS_DECLARE_PER_ISA(void moe_linear(const MoeLinearArgs& args))

namespace llaisys::cpu::LLAISYS_ISA {

template <class C, class T, class Block>
void moe_linear_dot(const MoeLinearArgs& a) {
    using X = typename C::XElem;
    const int64_t pairs = a.M * a.k, N = a.N, K = a.K;
    const T* x = static_cast<const T*>(a.x);
    const T* weight = static_cast<const T*>(a.weight);
    T* out = static_cast<T*>(a.out);
    const ExpertGroups groups(a.experts, pairs, a.E);

    // the inputs in expert order, as the chain reads them ([pairs, K]); the outputs in the same order
    X* xs = scratch(kSlotMoeRows).get<X>(size_t(pairs * K));
    T* ys = scratch(kSlotMoeOut).get<T>(size_t(pairs * N));
    for (int64_t i = 0; i < pairs; ++i) {
        const int64_t r = groups.order[i];
        convert(x + (a.x_per_slot ? r : r / a.k) * K, xs + i * K, K);
    }

    // tasks: (selected expert, block of its weight rows), blocks sized as linear_dot sizes them
    const int threads = team_size();
    const int64_t block = std::clamp<int64_t>(round_up(ceil_div(N, int64_t(threads) * 16), 8), 8, 256);
    const int64_t blocks = ceil_div(N, block);
    const bool parallel = threads > 1 && pairs * N * K >= (int64_t(1) << 16);
    run_tasks(groups.count * blocks, [&](int64_t t) {
        const int64_t e = groups.selected[t / blocks], b = t % blocks, first = groups.start[e];
        const int64_t rows = groups.rows(e), n0 = b * block, n1 = std::min(N, n0 + block);
        const T* w = weight + e * N * K;
        // (tiles of one weight row, one sequential stream per thread, where linear_dot's would stream)
        if (streams(rows, K, sizeof(X), kMR)) Block::template run<1>(rows, xs + first * K, w, n0, n1, K, nullptr, ys + first * N, N);
        else Block::template run<kNR>(rows, xs + first * K, w, n0, n1, K, nullptr, ys + first * N, N);
    }, parallel);

    for (int64_t i = 0; i < pairs; ++i)
        std::memcpy(out + groups.order[i] * N, ys + i * N, sizeof(T) * size_t(N));
}

void moe_linear(const MoeLinearArgs& a) {
    with_float_type(a.dtype, [&](auto tag) {
        using T = decltype(tag);
        if (a.K == 0) return fill_rows_with_bias(static_cast<T*>(a.out), static_cast<const T*>(nullptr),
                                                 a.M * a.k, a.N);
#if defined(LLAISYS_BF16_PAIR_CHAIN)
        if constexpr (std::is_same_v<T, bf16_t>) {
            if (has_feature(Feature::kBf16Pairs) && linear_bf16dot_allowed())
                return moe_linear_dot<Bf16PairChain, T, Bf16PairBlock>(a);
        }
#endif
        moe_linear_dot<Chain, T, DotBlock<Chain, kMR, T>>(a);
    });
}

}  // namespace llaisys::cpu::LLAISYS_ISA

#if defined(LLAISYS_ISA_PORTABLE)  // the exported entry point, compiled once
int LLAISYS_FN(moe_linear)(int device, void* stream, int dtype, int64_t M, int64_t k, int64_t E, int64_t N,
                           int64_t K, int x_per_slot, void* out, const void* x, const void* weight,
                           const void* experts) {
    (void)device;
    return llaisys::launch("moe_linear", stream, [=] {
        llaisys::require_float_dtype(dtype);
        const int64_t* ids = static_cast<const int64_t*>(experts);
        llaisys::check_expert_ids(ids, M, k, E);
        if (M == 0 || k == 0 || N == 0) return;  // nothing to compute
        LLAISYS_PER_ISA(moe_linear)(llaisys::cpu::MoeLinearArgs{dtype, M, k, E, N, K, x_per_slot != 0, out, x,
                                                                 weight, ids});
    });
}
#endif
