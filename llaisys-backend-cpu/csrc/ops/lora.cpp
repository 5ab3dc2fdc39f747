// lora_shrink / lora_expand: batched LoRA adapters, Punica's SGMV (backend.h):
//     shrink  h[m, r] = scales[s] * (x[m, :] . a[s, r, :])                  s = adapters[m]; h[m, :] = 0 where s = -1
//     expand  out[m, n] = round(out[m, n] + sum over r ascending of h[m, r] * b[s, r, n])   rows with s = -1 untouched
//
// The rows go in segments (runs of consecutive rows with one adapter), cut into chunks; a chunk's rows share the
// loads of their adapter's matrix (SGMV): shrink runs them as a small `linear` against a[s] [R, K] through
// linear_dot.h's dot_block (the weights stream once past up to 8 rows, larger chunks take register tiles of rows x
// rank rows), expand keeps a tile of b[s] (R x a few vectors of n) in L1 while every row of the chunk passes it.
// The thread team takes (chunk, block of r) tasks for shrink and (chunk, tile of n) tasks for expand.
//
// Batch invariance: each output has one arithmetic whatever M, the chunk or the thread it falls in. Shrink: the
// dot product of linear_dot.h (lane l of its vector chains k = l, l + W, ... in order, the lanes summed in a fixed
// order) in f32, then times the f32 scale. Expand: one f32 FMA chain per output over r = 0, 1, ..., R - 1 (from 0;
// vectors over n, h[m, r] broadcast), then one f32 add to out's value, rounded once to out's dtype. (The chain is
// fused in the avx2 / avx512 builds, a product and a sum in the portable one: one process uses one build.)
// The adapters are checked by the exported entry points before anything is written. Written once over the SIMD
// vocabulary: each build (portable, avx2, avx512) compiles it.
#include <string>

#include "../common/api.h"
#include "linear_tiles.h"

namespace llaisys::cpu {

struct LoraShrinkArgs {
    int dtype;                // LLAISYS_F32 / _F16 / _BF16: x and a
    int64_t M, K, R, S;       // M, R >= 1 (the entry point returns before)
    float* h;                 // [M, R]
    const void* x;            // [M, K]
    const void* a;            // [S, R, K]
    const int64_t* adapters;  // [M], each in [-1, S)
    const float* scales;      // [S]
};

struct LoraExpandArgs {
    int dtype;                // LLAISYS_F32 / _F16 / _BF16: out and b
    int64_t M, R, N, S;       // M, R, N >= 1
    void* out;                // [M, N], in place
    const float* h;           // [M, R]
    const void* b;            // [S, R, N]
    const int64_t* adapters;  // [M], each in [-1, S)
};

}  // namespace llaisys::cpu

LLAISYS_DECLARE_PER_ISA(void lora_shrink(const LoraShrinkArgs& args))
LLAISYS_DECLARE_PER_ISA(void lora_expand(const LoraExpandArgs& args))

namespace llaisys::cpu::LLAISYS_ISA {

// The rows with an adapter as chunks of at most `most` consecutive rows of one adapter: chunk i is rows [first[i],
// first[i] + rows[i]) of adapter slot[i]. A segment longer than `most` rows is cut; rows with adapter -1 are in no
// chunk. (The calling thread's scratch, no allocation after warm-up.)
struct LoraChunks {
    int64_t *first, *rows, *slot, count = 0;

    LoraChunks(const int64_t* adapters, int64_t M, int64_t most) {
        first = scratch(kSlotLora).get<int64_t>(size_t(3 * M));
        rows = first + M;
        slot = rows + M;
        for (int64_t m = 0; m < M;) {
            const int64_t s = adapters[m];
            int64_t end = m + 1;
            while (end < M && adapters[end] == s && end - m < most) ++end;
            if (s >= 0) {
                first[count] = m, rows[count] = end - m, slot[count] = s;
                ++count;
            }
            m = end;
        }
    }
};

constexpr int64_t kShrinkChunkRows = 64;   // rows of x per shrink task (a multiple of every kMR)
constexpr int64_t kExpandChunkRows = 32;   // rows of out per expand task
constexpr int64_t kExpandCols = 256;       // columns of out per expand task (a multiple of kExpandVecs * Vec::W)
constexpr int kExpandVecs = kNR;           // vectors of n per register tile: kMR x kNR accumulators, as linear's

template <class T>
void lora_shrink_typed(const LoraShrinkArgs& a) {
    using X = typename Chain::XElem;  // f32: x widened once per call (unless it is f32)
    const int64_t M = a.M, K = a.K, R = a.R;
    const T* x = static_cast<const T*>(a.x);
    const T* w = static_cast<const T*>(a.a);
    float* h = a.h;
    for (int64_t m = 0; m < M; ++m)  // rows without an adapter: 0
        if (a.adapters[m] < 0) std::memset(h + m * R, 0, sizeof(float) * size_t(R));
    if (K == 0) {  // empty dot products: scale * 0
        for (int64_t m = 0; m < M; ++m)
            if (a.adapters[m] >= 0)
                for (int64_t r = 0; r < R; ++r) h[m * R + r] = a.scales[a.adapters[m]] * 0.0f;
        return;
    }
    const LoraChunks chunks(a.adapters, M, kShrinkChunkRows);
    const int threads = team_size();
    const bool parallel = threads > 1 && chunks.count > 0 && M * R * K >= (int64_t(1) << 16);

    // x in f32 rows, where the chunks read it (row m of x at xs + m * K)
    const X* xs;
    if constexpr (std::is_same_v<X, T>) {
        xs = x;
    } else {
        X* buf = scratch(kSlotX).get<X>(size_t(M * K));
        run_tasks(chunks.count, [&](int64_t c) {
            convert(x + chunks.first[c] * K, buf + chunks.first[c] * K, chunks.rows[c] * K);
        }, parallel);
        xs = buf;
    }

    // tasks: (chunk, block of r), blocks of a multiple of 8 rows of a[s], about one per thread
    const int64_t rblock = std::clamp<int64_t>(round_up(ceil_div(R, int64_t(threads)), 8), 8, 256);
    const int64_t rblocks = ceil_div(R, rblock);
    run_tasks(chunks.count * rblocks, [&](int64_t t) {
        const int64_t c = t / rblocks, r0 = t % rblocks * rblock, r1 = std::min(R, r0 + rblock);
        const int64_t m0 = chunks.first[c], mc = chunks.rows[c], s = chunks.slot[c];
        const T* ws = w + s * R * K;
        float* hs = h + m0 * R;
        const T* no_bias = nullptr;
        using Block = DotBlock<Chain, kMR, T>;
        if (streams(mc, K, sizeof(X), kMR)) Block::template run<1>(mc, xs + m0 * K, ws, r0, r1, K, no_bias, hs, R);
        else Block::template run<kNR>(mc, xs + m0 * K, ws, r0, r1, K, no_bias, hs, R);
        const float scale = a.scales[s];  // after the sum
        for (int64_t i = 0; i < mc; ++i)
            for (int64_t r = r0; r < r1; ++r) hs[i * R + r] = scale * hs[i * R + r];
    }, parallel);
}

// out rows [0, MR) (stride N) += h rows [0, MR) (stride R) @ b (R rows, stride N), over the columns [0, width),
// width <= kExpandVecs * Vec::W (all of them when FULL): acc = sum over r of h[i, r] * b[r, :] as one FMA chain per
// output from 0, then out = round(out + acc).
template <int MR, bool FULL, class T>
LLAISYS_ALWAYS_INLINE void expand_tile(const float* __restrict h, int64_t R, const T* __restrict b, int64_t N,
                                       T* __restrict out, int width) {
    constexpr int NV = kExpandVecs, W = Vec::W;
    auto lanes = [width](int j) {  // of vector j
        const int n = width - j * W;
        return n < 0 ? 0 : (n > W ? W : n);
    };
    Vec acc[MR][NV];
#pragma GCC unroll 8
    for (int i = 0; i < MR; ++i)
#pragma GCC unroll 8
        for (int j = 0; j < NV; ++j) acc[i][j] = Vec::zero();
    for (int64_t r = 0; r < R; ++r) {
        const T* br = b + r * N;
        Vec bv[NV];
#pragma GCC unroll 8
        for (int j = 0; j < NV; ++j) bv[j] = FULL ? Vec::load(br + j * W) : Vec::load_partial(br + j * W, lanes(j));
#pragma GCC unroll 8
        for (int i = 0; i < MR; ++i) {
            const Vec hv = Vec::broadcast(h + i * R + r);
#pragma GCC unroll 8
            for (int j = 0; j < NV; ++j) acc[i][j] = fmadd(hv, bv[j], acc[i][j]);
        }
    }
#pragma GCC unroll 8
    for (int i = 0; i < MR; ++i) {
        T* o = out + i * N;
#pragma GCC unroll 8
        for (int j = 0; j < NV; ++j) {
            if (FULL) {
                (Vec::load(o + j * W) + acc[i][j]).store(o + j * W);
            } else if (lanes(j) > 0) {
                (Vec::load_partial(o + j * W, lanes(j)) + acc[i][j]).store_partial(o + j * W, lanes(j));
            }
        }
    }
}

// Rows [0, mc) of the chunk, columns [n0, n1): column tiles outer (the tile of b stays in L1), tiles of kMR rows
// (and the last few rows) inner.
template <bool FULL, class T>
LLAISYS_ALWAYS_INLINE void expand_columns(int64_t mc, const float* h, int64_t R, const T* b, int64_t N, T* out,
                                          int64_t n, int width) {
    int64_t i = 0;
    for (; i + kMR <= mc; i += kMR) expand_tile<kMR, FULL>(h + i * R, R, b + n, N, out + i * N + n, width);
    switch (mc - i) {
        case 1: expand_tile<1, FULL>(h + i * R, R, b + n, N, out + i * N + n, width); break;
        case 2: if constexpr (kMR > 2) expand_tile<2, FULL>(h + i * R, R, b + n, N, out + i * N + n, width); break;
        case 3: if constexpr (kMR > 3) expand_tile<3, FULL>(h + i * R, R, b + n, N, out + i * N + n, width); break;
        default: break;
    }
}

template <class T>
void lora_expand_typed(const LoraExpandArgs& a) {
    const int64_t M = a.M, R = a.R, N = a.N;
    const T* b = static_cast<const T*>(a.b);
    T* out = static_cast<T*>(a.out);
    const LoraChunks chunks(a.adapters, M, kExpandChunkRows);
    const int64_t tiles = ceil_div(N, kExpandCols);
    const bool parallel = team_size() > 1 && M * R * N >= (int64_t(1) << 16);
    run_tasks(chunks.count * tiles, [&](int64_t t) {
        const int64_t c = t / tiles, n0 = t % tiles * kExpandCols, n1 = std::min(N, n0 + kExpandCols);
        const int64_t m0 = chunks.first[c], mc = chunks.rows[c];
        const T* bs = b + chunks.slot[c] * R * N;
        const float* hs = a.h + m0 * R;
        T* os = out + m0 * N;
        constexpr int64_t step = kExpandVecs * Vec::W;
        int64_t n = n0;
        for (; n + step <= n1; n += step) expand_columns<true>(mc, hs, R, bs, N, os, n, int(step));
        if (n < n1) expand_columns<false>(mc, hs, R, bs, N, os, n, int(n1 - n));
    }, parallel);
}

void lora_shrink(const LoraShrinkArgs& a) {
    with_float_type(a.dtype, [&](auto tag) { lora_shrink_typed<decltype(tag)>(a); });
}

void lora_expand(const LoraExpandArgs& a) {
    with_float_type(a.dtype, [&](auto tag) { lora_expand_typed<decltype(tag)>(a); });
}

}  // namespace llaisys::cpu::LLAISYS_ISA

#if defined(LLAISYS_ISA_PORTABLE)  // the exported entry points, compiled once
namespace {

// Every adapter in [-1, S), else InvalidArgument naming the first one that is not (before anything is written).
void check_adapters(const int64_t* adapters, int64_t M, int64_t S) {
    for (int64_t m = 0; m < M; ++m)
        if (adapters[m] < -1 || adapters[m] >= S)
            throw llaisys::InvalidArgument("adapters[" + std::to_string(m) + "] = " + std::to_string(adapters[m]) +
                                           " is not an adapter slot in [-1, " + std::to_string(S) +
                                           ") (nothing was written)");
}

}  // namespace

int LLAISYS_FN(lora_shrink)(int device, void* stream, int dtype, int64_t M, int64_t K, int64_t R, int64_t S, void* h,
                            const void* x, const void* a, const void* adapters, const void* scales) {
    (void)device;
    return llaisys::launch("lora_shrink", stream, [=] {
        llaisys::require_float_dtype(dtype);
        const int64_t* ids = static_cast<const int64_t*>(adapters);
        check_adapters(ids, M, S);
        if (M == 0 || R == 0) return;  // nothing to compute
        LLAISYS_PER_ISA(lora_shrink)(llaisys::cpu::LoraShrinkArgs{dtype, M, K, R, S, static_cast<float*>(h), x, a, ids,
                                                                   static_cast<const float*>(scales)});
    });
}

int LLAISYS_FN(lora_expand)(int device, void* stream, int dtype, int64_t M, int64_t R, int64_t N, int64_t S, void* out,
                            const void* h, const void* b, const void* adapters) {
    (void)device;
    return llaisys::launch("lora_expand", stream, [=] {
        llaisys::require_float_dtype(dtype);
        const int64_t* ids = static_cast<const int64_t*>(adapters);
        check_adapters(ids, M, S);
        if (M == 0 || R == 0 || N == 0) return;  // nothing to add
        LLAISYS_PER_ISA(lora_expand)(llaisys::cpu::LoraExpandArgs{dtype, M, R, N, S, out,
                                                                   static_cast<const float*>(h), b, ids});
    });
}
#endif
