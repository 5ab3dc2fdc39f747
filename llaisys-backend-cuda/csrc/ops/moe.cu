// Mixture of experts (backend.h): moe_router, moe_router_grouped, moe_linear, moe_combine. Each row is computed on
// its own, so a row's result never depends on the other rows of the batch.
//
// moe_router: a thread per row. The top k in the order (logit descending, expert id ascending; NaN last):
// pick j is the best logit strictly after pick j - 1 in that order (next_pick: k passes over the row, no arrays).
// moe_router_grouped (6.4, DeepSeek-V2 / V3): a thread per row, the same picks over the choice scores c = s + bias
// (s = softmax or sigmoid, recomputed where read). A group's score is its group_top first picks' c summed in
// order; the topk_group-th group in the order (score descending, group ascending) is found by topk_group picks
// over the groups, and a group is kept iff it is not after that one (its score recomputed once per pass over
// the experts). Then k picks over the experts (those of groups not kept are -inf), their s summed in pick order.
// moe_linear: a warp per (expert, tile of weight rows); it walks the (row, slot) pairs in order, takes those
// that chose its expert a tile at a time, and computes their tile with linear's own arithmetic, so that each
// output is the bits linear gives for that row and expert alone, whatever the batch: in f16 / bf16 where
// linear runs on tensor cores (tc::enabled), tc::warp_slices over all of linear's slices in order (linear_tc.cuh;
// 16 rows x 16 weight rows), else linear's SIMT tile warp_dot_tile (linear.cuh; kMR x kNR). An expert no row
// chose costs one scan of the ids and no weight read; a chosen one is read once per tile of rows that chose it
// (from L2 after the first).
// moe_combine: a thread per output, fmaf over the k slots in order.
#include <cmath>
#include <type_traits>

#include "../common/context.h"
#include "../common/dtype.cuh"
#include "../common/launch.h"
#include "../common/reduce.cuh"
#include "linear.cuh"
#include "linear_tc.cuh"
#include "moe_ids.cuh"

namespace llaisys::cuda {
namespace {

// The router's order: a before b when its logit is larger, or equal with a smaller id (NaN as -inf).
__device__ __forceinline__ float router_key(float logit) { return isnan(logit) ? -INFINITY : logit; }
__device__ __forceinline__ bool router_before(float la, int64_t a, float lb, int64_t b) {
    return la > lb || (la == lb && a < b);
}

// A pick of a top k: its key (NaN already -inf) and id. The first pick is next_pick(n, key, no_pick()).
struct RouterPick {
    float key;
    int64_t id;
};
__device__ __forceinline__ RouterPick no_pick() { return {INFINITY, -1}; }  // before every item

// The first item of [0, n) strictly after `prev` in the router's order of keys key(i): pick j of a top k is
// next_pick(pick j - 1), so a top k is k passes over the items, with no array. key(i) is called once per item,
// in ascending i.
template <class Key>
__device__ RouterPick next_pick(int64_t n, Key&& key, RouterPick prev) {
    RouterPick best{0.0f, -1};
    for (int64_t i = 0; i < n; ++i) {
        const float ki = router_key(key(i));
        if (router_before(prev.key, prev.id, ki, i) && (best.id < 0 || router_before(ki, i, best.key, best.id)))
            best = {ki, i};
    }
    return best;
}

template <class T>
__global__ void moe_router_kernel(int64_t M, int64_t E, int64_t k, bool normalize, T* weights, int64_t* experts,
                                  const T* logits) {
    const int64_t stride = int64_t(gridDim.x) * blockDim.x;
    for (int64_t m = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; m < M; m += stride) {
        const T* row = logits + m * E;
        float max = -INFINITY, sum = 0.0f;
        for (int64_t e = 0; e < E; ++e) max = fmaxf(max, to_float(row[e]));
        for (int64_t e = 0; e < E; ++e) sum += expf(to_float(row[e]) - max);
        auto logit = [&](int64_t e) { return to_float(row[e]); };
        // pass 0 sums the k picks' probabilities (for normalize), pass 1 writes them
        float top = 0.0f;
        for (int pass = 0; pass < 2; ++pass) {
            RouterPick pick = no_pick();
            for (int64_t j = 0; j < k; ++j) {
                pick = next_pick(E, logit, pick);
                const float p = expf(to_float(row[pick.id]) - max) / sum;
                if (pass == 0) {
                    top += p;
                } else {
                    experts[m * k + j] = pick.id;
                    weights[m * k + j] = from_float<T>(normalize ? p / top : p);
                }
            }
        }
    }
}

// moe_router_grouped's sizes and options (checked by the export).
struct GroupedRoute {
    int64_t E, k, n_group, topk_group, group_top;
    bool sigmoid, normalize;
    float route_scale;
    const float* bias;  // f32 [E] or null
};

template <class T>
__global__ void moe_router_grouped_kernel(int64_t M, GroupedRoute r, T* weights, int64_t* experts,
                                          const float* logits) {
    const int64_t stride = int64_t(gridDim.x) * blockDim.x, per = r.E / r.n_group;
    for (int64_t m = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; m < M; m += stride) {
        const float* row = logits + m * r.E;  // (f32 whatever T: DeepSeek's router computes in f32)
        float max = -INFINITY, sum = 0.0f;
        if (!r.sigmoid) {
            for (int64_t e = 0; e < r.E; ++e) max = fmaxf(max, row[e]);
            for (int64_t e = 0; e < r.E; ++e) sum += expf(row[e] - max);
        }
        auto score = [&](int64_t e) {  // s
            const float x = row[e];
            return r.sigmoid ? 1.0f / (1.0f + expf(-x)) : expf(x - max) / sum;
        };
        auto choice = [&](int64_t e) { return r.bias ? score(e) + r.bias[e] : score(e); };  // c
        auto group_score = [&](int64_t g) {  // its group_top largest c, summed largest first
            auto member = [&](int64_t i) { return choice(g * per + i); };
            RouterPick pick = no_pick();
            float total = 0.0f;
            for (int64_t j = 0; j < r.group_top; ++j) {
                pick = next_pick(per, member, pick);
                total += pick.key;
            }
            return total;
        };
        const bool limited = r.topk_group < r.n_group;
        RouterPick last_group = no_pick();  // the topk_group-th group: the groups not after it are kept
        if (limited)
            for (int64_t j = 0; j < r.topk_group; ++j) last_group = next_pick(r.n_group, group_score, last_group);
        int64_t group = -1;  // the group of the expert key() saw last, and whether it is kept
        bool kept = true;
        auto key = [&](int64_t e) {  // c, or -inf outside the kept groups (called in ascending e)
            if (limited && e / per != group) {
                group = e / per;
                kept = !router_before(last_group.key, last_group.id, router_key(group_score(group)), group);
            }
            return kept ? choice(e) : -INFINITY;
        };
        int64_t* ids = experts + m * r.k;
        float top = 0.0f;
        RouterPick pick = no_pick();
        for (int64_t j = 0; j < r.k; ++j) {
            pick = next_pick(r.E, key, pick);
            ids[j] = pick.id;
            top += score(pick.id);
        }
        for (int64_t j = 0; j < r.k; ++j) {  // (this thread's own writes)
            const float s = score(ids[j]);
            weights[m * r.k + j] = from_float<T>((r.normalize ? s / (top + 1e-20f) : s) * r.route_scale);
        }
    }
}

constexpr int kMoeThreads = 128;  // 4 warps (2 on CoreX) per block
constexpr int kMR = 4, kNR = 2;   // a warp's tile: up to 4 (row, slot) pairs x 2 weight rows

template <class T>
__global__ void __launch_bounds__(kMoeThreads) moe_linear_kernel(int64_t pairs, int64_t k, int64_t E, int64_t N,
                                                                 int64_t K, bool x_per_slot, T* out, const T* x,
                                                                 const T* weight, const int64_t* experts) {
    const int lane = lane_id();
    const int64_t warps_per_block = blockDim.x / WARP_SIZE;
    const int64_t col_tiles = (N + kNR - 1) / kNR, tiles = E * col_tiles;
    for (int64_t tile = int64_t(blockIdx.x) * warps_per_block + warp_id(); tile < tiles;
         tile += int64_t(gridDim.x) * warps_per_block) {
        const int64_t e = tile / col_tiles, n0 = tile % col_tiles * kNR;
        const T* wr[kNR];
        bool w_aligned[kNR];
#pragma unroll
        for (int j = 0; j < kNR; ++j) {  // columns past N repeat the last one (summed, never stored)
            wr[j] = weight + (e * N + (n0 + j < N ? n0 + j : N - 1)) * K;
            w_aligned[j] = chunk_aligned(wr[j], K);
        }
        for (int64_t r = 0; r < pairs;) {
            int64_t rows[kMR];  // the next pairs that chose e (every lane reads the same ids)
            int count = 0;
            for (; r < pairs && count < kMR; ++r)
                if (experts[r] == e) rows[count++] = r;
            if (count == 0) break;
            const T* xr[kMR];
            bool x_aligned[kMR];
#pragma unroll
            for (int i = 0; i < kMR; ++i) {  // rows past count repeat the last one
                const int64_t pair = rows[i < count ? i : count - 1];
                xr[i] = x + (x_per_slot ? pair : pair / k) * K;
                x_aligned[i] = chunk_aligned(xr[i], K);
            }
            float sums[kMR][kNR];
            warp_dot_tile<T, kMR, kNR>(xr, x_aligned, wr, w_aligned, K, sums);
#pragma unroll
            for (int i = 0; i < kMR; ++i)
#pragma unroll
                for (int j = 0; j < kNR; ++j)
                    if (lane == (i * kNR + j) % WARP_SIZE && i < count && n0 + j < N)
                        out[rows[i] * N + n0 + j] = from_float<T>(sums[i][j]);
        }
    }
}

#if LLAISYS_HAS_WMMA
// moe_linear_kernel on tensor cores: the tile is 16 (row, slot) pairs x 16 weight rows, each output summed as
// linear sums it (all slices in order in this warp, each slice a chain of mma_sync), then rounded once.
template <class T>
__global__ void __launch_bounds__(kMoeThreads) moe_linear_tc_kernel(int64_t pairs, int64_t k, int64_t E, int64_t N,
                                                                    int64_t K, bool x_per_slot, T* out, const T* x,
                                                                    const T* weight, const int64_t* experts) {
    __shared__ tc::WarpStage stages[kMoeThreads / WARP_SIZE];
    tc::WarpStage& stage = stages[warp_id()];
    const int64_t warps_per_block = blockDim.x / WARP_SIZE;
    const int64_t col_tiles = (N + tc::kTile - 1) / tc::kTile, tiles = E * col_tiles;
    const tc::Slices sl = tc::slices_of(K);
    for (int64_t tile = int64_t(blockIdx.x) * warps_per_block + warp_id(); tile < tiles;
         tile += int64_t(gridDim.x) * warps_per_block) {
        const int64_t e = tile / col_tiles, n0 = tile % col_tiles * tc::kTile;
        const T* wr[tc::kTile];
#pragma unroll
        for (int j = 0; j < tc::kTile; ++j) wr[j] = n0 + j < N ? weight + (e * N + n0 + j) * K : nullptr;
        for (int64_t r = 0; r < pairs;) {
            int64_t rows[tc::kTile];  // the next pairs that chose e (every lane reads the same ids)
            int count = 0;
            for (; r < pairs && count < tc::kTile; ++r)
                if (experts[r] == e) rows[count++] = r;
            if (count == 0) break;
            const T* xr[tc::kTile];
#pragma unroll
            for (int i = 0; i < tc::kTile; ++i)
                xr[i] = i < count ? x + (x_per_slot ? rows[i] : rows[i] / k) * K : nullptr;
            tc::Accumulator total;
            nvcuda::wmma::fill_fragment(total, 0.0f);
            tc::warp_slices(xr, wr, K, stage, 0, sl.count, [&](int64_t, const tc::Accumulator& acc) {
                for (int i = 0; i < acc.num_elements; ++i) total.x[i] += acc.x[i];
            });
            float* sums = reinterpret_cast<float*>(&stage);  // [16][16], the stage is free after the slices
            nvcuda::wmma::store_matrix_sync(sums, total, tc::kTile, nvcuda::wmma::mem_row_major);
            __syncwarp();
            for (int idx = lane_id(); idx < tc::kTile * tc::kTile; idx += WARP_SIZE) {
                const int i = idx / tc::kTile, j = idx % tc::kTile;
                if (i < count && n0 + j < N) out[rows[i] * N + n0 + j] = from_float<T>(sums[idx]);
            }
            __syncwarp();  // read before the next tile stages over it
        }
    }
}
#endif

template <class T>
__global__ void moe_combine_kernel(int64_t M, int64_t k, int64_t N, T* out, const T* y, const T* weights) {
    const int64_t stride = int64_t(gridDim.x) * blockDim.x;
    for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < M * N; i += stride) {
        const int64_t m = i / N, n = i % N;
        float acc = 0.0f;
        for (int64_t j = 0; j < k; ++j) acc = fmaf(to_float(weights[m * k + j]), to_float(y[(m * k + j) * N + n]), acc);
        out[i] = from_float<T>(acc);
    }
}

}  // namespace
}  // namespace llaisys::cuda

int LLAISYS_FN(moe_router)(int device, void* stream, int dtype, int64_t M, int64_t E, int64_t k, int normalize,
                           void* weights, void* experts, const void* logits) {
    using namespace llaisys::cuda;
    return guard("moe_router", [&] {
        StreamContext& s = stream_context(device, stream);
        if (k < 1 || k > E)
            throw InvalidArgument("k = " + std::to_string(k) + " must be in [1, E = " + std::to_string(E) + "]");
        if (M <= 0) return;
        dispatch_float(dtype, [&](auto tag) {
            using T = decltype(tag);
            auto kernel = &moe_router_kernel<T>;
            const unsigned blocks = blocks_for(M, 64, int64_t(device_context(s.device).sm_count) * 4);
            LLAISYS_LAUNCH(kernel, blocks, 64, 0, s.stream, M, E, k, normalize != 0, static_cast<T*>(weights),
                           static_cast<int64_t*>(experts), static_cast<const T*>(logits));
        });
    });
}

int LLAISYS_FN(moe_router_grouped)(int device, void* stream, int dtype, int64_t M, int64_t E, int64_t k, int scoring,
                                   int64_t n_group, int64_t topk_group, int64_t group_top, int normalize,
                                   double route_scale, void* weights, void* experts, const void* logits,
                                   const void* bias) {
    using namespace llaisys::cuda;
    return guard("moe_router_grouped", [&] {
        StreamContext& s = stream_context(device, stream);
        const auto str = [](int64_t v) { return std::to_string(v); };
        if (scoring != 0 && scoring != 1)
            throw InvalidArgument("scoring = " + str(scoring) + " is not 0 (softmax) or 1 (sigmoid)");
        if (n_group < 1 || E < 1 || E % n_group)
            throw InvalidArgument("n_group = " + str(n_group) + " does not divide E = " + str(E));
        if (topk_group < 1 || topk_group > n_group)
            throw InvalidArgument("topk_group = " + str(topk_group) + " must be in [1, n_group = " + str(n_group) +
                                  "]");
        if (group_top < 1 || group_top > E / n_group)
            throw InvalidArgument("group_top = " + str(group_top) + " must be in [1, E / n_group = " +
                                  str(E / n_group) + "]");
        if (k < 1 || k > topk_group * (E / n_group))
            throw InvalidArgument("k = " + str(k) + " must be in [1, topk_group * E / n_group = " +
                                  str(topk_group * (E / n_group)) + "]");
        if (M <= 0) return;
        const GroupedRoute route{E, k, n_group, topk_group, group_top, scoring == 1, normalize != 0,
                                 float(route_scale), static_cast<const float*>(bias)};
        dispatch_float(dtype, [&](auto tag) {
            using T = decltype(tag);
            auto kernel = &moe_router_grouped_kernel<T>;
            const unsigned blocks = blocks_for(M, 64, int64_t(device_context(s.device).sm_count) * 4);
            LLAISYS_LAUNCH(kernel, blocks, 64, 0, s.stream, M, route, static_cast<T*>(weights),
                           static_cast<int64_t*>(experts), static_cast<const float*>(logits));
        });
    });
}

int LLAISYS_FN(moe_linear)(int device, void* stream, int dtype, int64_t M, int64_t k, int64_t E, int64_t N,
                           int64_t K, int x_per_slot, void* out, const void* x, const void* weight,
                           const void* experts) {
    using namespace llaisys::cuda;
    return guard("moe_linear", [&] {
        StreamContext& s = stream_context(device, stream);
        const int64_t pairs = M * k;
        if (pairs <= 0) return;
        const auto* ids = static_cast<const int64_t*>(experts);
        auto check = &moe_check_ids_kernel;
        const int64_t sms = device_context(s.device).sm_count;
        LLAISYS_LAUNCH(check, blocks_for(pairs, 256, sms * 4), 256, 0, s.stream, pairs, k, E, ids,
                       device_context(s.device).error_device);
        if (N <= 0) return;
        dispatch_float(dtype, [&](auto tag) {
            using T = decltype(tag);
#if LLAISYS_HAS_WMMA
            if constexpr (!std::is_same_v<T, float>) {
                if (tc::enabled(device)) {  // linear's tensor-core arithmetic (linear.cu makes the same choice)
                    auto kernel = &moe_linear_tc_kernel<T>;
                    const int64_t tiles = E * ((N + tc::kTile - 1) / tc::kTile);
                    const unsigned blocks = blocks_for(tiles, kMoeThreads / WARP_SIZE, sms * 64);
                    LLAISYS_LAUNCH(kernel, blocks, kMoeThreads, 0, s.stream, pairs, k, E, N, K, x_per_slot != 0,
                                   static_cast<T*>(out), static_cast<const T*>(x), static_cast<const T*>(weight), ids);
                    return;
                }
            }
#endif
            auto kernel = &moe_linear_kernel<T>;
            const int64_t tiles = E * ((N + kNR - 1) / kNR);
            const unsigned blocks = blocks_for(tiles, kMoeThreads / WARP_SIZE, sms * 64);
            LLAISYS_LAUNCH(kernel, blocks, kMoeThreads, 0, s.stream, pairs, k, E, N, K, x_per_slot != 0,
                           static_cast<T*>(out), static_cast<const T*>(x), static_cast<const T*>(weight), ids);
        });
    });
}

int LLAISYS_FN(moe_combine)(int device, void* stream, int dtype, int64_t M, int64_t k, int64_t N, void* out,
                            const void* y, const void* weights) {
    using namespace llaisys::cuda;
    return guard("moe_combine", [&] {
        StreamContext& s = stream_context(device, stream);
        if (M <= 0 || N <= 0) return;
        dispatch_float(dtype, [&](auto tag) {
            using T = decltype(tag);
            auto kernel = &moe_combine_kernel<T>;
            const unsigned blocks = blocks_for(M * N, 256, int64_t(device_context(s.device).sm_count) * 8);
            LLAISYS_LAUNCH(kernel, blocks, 256, 0, s.stream, M, k, N, static_cast<T*>(out), static_cast<const T*>(y),
                           static_cast<const T*>(weights));
        });
    });
}
