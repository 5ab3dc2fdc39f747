// linear as dot products of rows: out[m, n] = x[m, :] . weight[n, :] (+ bias[n]), for every M.
//
// Both x [M, K] and weight [N, K] are contiguous along k, so each output is a dot product of two contiguous
// rows: no packing and no transposes, every weight value is loaded straight from where the checkpoint put it.
// A register tile of MR rows of x by NR rows of weight keeps MR x NR vector accumulators; one step loads MR
// x vectors and NR weight vectors (KW values of k each) and does MR x NR multiply-adds. A decode or verify
// step (M = 1..8) streams the weights at the speed of memory with a few instructions per 64 bytes (dot_stream).
//
// The arithmetic of one output never depends on M, the tile it falls in or the thread that runs it (batch
// invariance: a sequence's logits are the same alone or batched, however its prompt was cut): lane l of its
// accumulator chains k = l, l + KW, l + 2 KW, ... in order over all of K (one FMA, or one vdpbf16ps per bf16
// pair), the tail zero-filled; then reduce_add sums the lanes in its fixed order, the bias is added and the
// sum is rounded once to the output dtype.
//
// A chain type says how a step multiplies: FmaChain (f32 lanes; x as f32 rows, weights widened from
// f32 / f16 / bf16 on load) or, on CPUs that multiply bf16 pairs, Bf16PairChain (bf16 x and weights as they
// are, two values of k per lane and step: vdpbf16ps in the avx512 build with AVX512-BF16, 32 values a step;
// bfdot in the dotprod build with AArch64's FEAT_BF16, 16 values a step).
#pragma once

#include <type_traits>
#include <utility>

#include "../common/thread_pool.h"
#include "linear.h"

namespace llaisys::cpu::LLAISYS_ISA {

template <class V>
struct FmaChain {
    using Acc = V;
    using XElem = float;                  // x converted to f32 rows once per call (unless it is f32)
    static constexpr int KW = V::W;       // values of k per step
    template <class T>
    LLAISYS_ALWAYS_INLINE static V load(const T* p) { return V::load(p); }
    template <class T>
    LLAISYS_ALWAYS_INLINE static V load_partial(const T* p, int n) { return V::load_partial(p, n); }
    LLAISYS_ALWAYS_INLINE static V step(V acc, V x, V w) { return fmadd(x, w, acc); }
};

#if defined(LLAISYS_ISA_AVX512) || defined(LLAISYS_ISA_DOTPROD)
#define LLAISYS_BF16_PAIR_CHAIN 1  // (this build has Bf16PairChain: linear and moe_linear pick it at run time)
struct Bf16PairChain {
    using Acc = Vec;
    using Int = Vec::Int;
    using XElem = bf16_t;                 // x used as it is
    static constexpr int KW = 2 * Vec::W;  // each lane a (k, k + 1) pair
    LLAISYS_ALWAYS_INLINE static Int load(const bf16_t* p) { return Int::load(p); }
    LLAISYS_ALWAYS_INLINE static Int load_partial(const bf16_t* p, int n) { return Int::load_halves_partial(p, n); }
    // (not always_inline: it can only be inlined into code built for the pair instructions; linear.cpp's
    // caller of this chain has that target and inlines everything beneath it)
    LLAISYS_TARGET_BF16_PAIRS static inline Vec step(Vec acc, Int x, Int w) { return dot_bf16_pairs(acc, x, w); }
};
#endif

// Requests the weight rows a block reads next while the passes over its current L2 slice compute: every
// tile of every pass requests an equal share of the next slice's lines, in address order (one stream that
// the hardware prefetchers join; past the matrix's end a prefetch is a no-op).
struct SlicePrefetch {
    const char* next = nullptr;  // the first line not yet requested
    int64_t lines = 0;           // lines left to request
    int64_t per_tile = 0;        // each tile's share

    // The next tile's share: (first line, count).
    LLAISYS_ALWAYS_INLINE std::pair<const char*, int64_t> take() {
        const int64_t n = std::min(per_tile, lines);
        const char* first = next;
        next += n * 64;
        lines -= n;
        return {first, n};
    }
};

// The part [k0, k1) of a tile's k (all of it: 0, K). A part that ends before K leaves the accumulators in
// carry (MR x NR of them) for the next part, which starts from them: each lane's chain over k is the same
// whatever the parts, so the result is too.
template <class Acc>
struct KPart {
    int64_t k0, k1;
    Acc* carry;  // null when the part is all of K
};

// out rows [0, MR) (stride N) x columns [0, NR) = x rows (stride ldx) . weight rows (stride K) + bias, over
// the part kp of k (the output is written when the part ends at K, rounded once to O: the weights' dtype, or
// f32 for lora_shrink); meanwhile requests pf_lines cache lines from pf on.
template <class C, int MR, int NR, class T, class O>
LLAISYS_ALWAYS_INLINE void dot_tile(const typename C::XElem* __restrict x, int64_t ldx, const T* __restrict w,
                                    int64_t K, const T* __restrict bias, O* __restrict out, int64_t N,
                                    const char* pf, int64_t pf_lines, KPart<typename C::Acc> kp) {
    using Acc = typename C::Acc;
    constexpr int KW = C::KW;
    Acc acc[MR][NR];
#pragma GCC unroll 8
    for (int i = 0; i < MR; ++i)
#pragma GCC unroll 8
        for (int j = 0; j < NR; ++j) acc[i][j] = kp.k0 > 0 ? kp.carry[i * NR + j] : Acc::zero();
    // its share of the next slice, spread over the steps; locality 1 (prefetcht2): into L2, where the next
    // slice's passes read it (with prefetcht0 the requests also filled L1, evicting this tile's operands:
    // a 16-row prefill's linears ran at 245 instead of 285 GFLOP/s on Zen 4)
    const int64_t per_step = ceil_div(pf_lines, ceil_div(kp.k1 - kp.k0, KW));
    const int64_t k_end = kp.k1;  // a multiple of KW, or K
    int64_t k = kp.k0;
    for (; k + KW <= k_end; k += KW) {
        for (int64_t p = 0; p < per_step && pf_lines > 0; ++p, --pf_lines, pf += 64) __builtin_prefetch(pf, 0, 1);
        decltype(C::load(w)) wv[NR];
#pragma GCC unroll 8
        for (int j = 0; j < NR; ++j) wv[j] = C::load(w + j * K + k);
        if constexpr (NR == 1 && MR > 1) hold_in_register(wv[0]);  // one load of the streamed line, not MR
#pragma GCC unroll 8
        for (int i = 0; i < MR; ++i) {
            const auto xv = C::load(x + i * ldx + k);
#pragma GCC unroll 8
            for (int j = 0; j < NR; ++j) acc[i][j] = C::step(acc[i][j], xv, wv[j]);
        }
    }
    if (k < k_end) {  // the tail (of the last part): both operands zero-filled past K (0 * 0 adds an exact 0)
        const int n = int(K - k);
        decltype(C::load(w)) wv[NR];
#pragma GCC unroll 8
        for (int j = 0; j < NR; ++j) wv[j] = C::load_partial(w + j * K + k, n);
#pragma GCC unroll 8
        for (int i = 0; i < MR; ++i) {
            const auto xv = C::load_partial(x + i * ldx + k, n);
#pragma GCC unroll 8
            for (int j = 0; j < NR; ++j) acc[i][j] = C::step(acc[i][j], xv, wv[j]);
        }
    }
    if (k_end < K) {  // more parts follow
#pragma GCC unroll 8
        for (int i = 0; i < MR; ++i)
#pragma GCC unroll 8
            for (int j = 0; j < NR; ++j) kp.carry[i * NR + j] = acc[i][j];
        return;
    }
    float sums[MR][NR];
#if defined(LLAISYS_ISA_AVX512)
    if constexpr (MR * NR == 16 && std::is_same_v<Acc, Vec16>) {  // a full tile: the 16 reductions at once
        reduce_add_x16(reinterpret_cast<const Vec16(&)[16]>(acc)).store(&sums[0][0]);
    } else
#endif
    {
#pragma GCC unroll 8
        for (int i = 0; i < MR; ++i)
#pragma GCC unroll 8
            for (int j = 0; j < NR; ++j) sums[i][j] = reduce_add(acc[i][j]);
    }
#pragma GCC unroll 8
    for (int i = 0; i < MR; ++i)
#pragma GCC unroll 8
        for (int j = 0; j < NR; ++j) out[i * N + j] = from_f32<O>(bias ? sums[i][j] + to_f32(bias[j]) : sums[i][j]);
}

// Rows [0, R) of x against weight rows [n0, n1): tiles of NR weight rows, then the last few one at a time,
// over the part kp of k; tile t keeps its accumulators at kp.carry + t * kCarrySlot.
constexpr int kCarrySlot = 16;  // accumulators per tile (MR x NR <= 16)

template <class C, int R, int NR, class T, class O>
LLAISYS_ALWAYS_INLINE void dot_rows(const typename C::XElem* x, const T* w, int64_t n0, int64_t n1, int64_t K,
                                    const T* bias, O* out, int64_t N, SlicePrefetch& pf, KPart<typename C::Acc> kp) {
    static_assert(R * NR <= kCarrySlot, "a tile's accumulators fit its carry slot");
    auto next_tile = [&kp]() {  // this tile's part, then the carry moves to the next tile's slot
        const auto part = kp;
        if (kp.carry) kp.carry += kCarrySlot;
        return part;
    };
    int64_t n = n0;
    for (; n + NR <= n1; n += NR) {
        const auto [first, lines] = pf.take();
        dot_tile<C, R, NR>(x, K, w + n * K, K, bias ? bias + n : nullptr, out + n, N, first, lines, next_tile());
    }
    for (; n < n1; ++n) {
        const auto [first, lines] = pf.take();
        dot_tile<C, R, 1>(x, K, w + n * K, K, bias ? bias + n : nullptr, out + n, N, first, lines, next_tile());
    }
}

// Steps of at most kStreamRows rows of x (decode; a verify step of speculative decoding, K + 1 rows; a batch
// of a few sequences) stream the weights (dot_stream): up to 4 rows always, up to 8 while their x rows fit in
// kStreamXBytes (L1), beyond which the tiles of NR weight rows reuse each x load 4 times and win.
constexpr int64_t kStreamRows = 8;
constexpr int64_t kStreamXBytes = int64_t(32) << 10;
// How far ahead of the weight row it computes a streaming tile of several x rows requests the weights
// (prefetcht2, spread over its steps). One x row needs no help: the hardware prefetchers keep up with its
// stream. With more, each weight line waits for R multiply-adds: the demand loads alone then left memory
// idle while the tile computed (f32, K = 576, weights from memory, one thread: 8 rows at 2.0x the time of
// one row without, 1.4-1.6x with; 5 rows 1.25x and 1.15x).
constexpr int64_t kStreamPrefetchBytes = int64_t(32) << 10;

// Weight rows [n0, n1) against all R <= kStreamRows rows of x, one weight row at a time: a tile of R x 1, so
// that each thread reads its block of weights once, as one sequential stream, and every row of x takes the
// weight line from a register (tiles of NR weight rows read NR streams a row apart, which the hardware
// prefetchers served at ~27 GB/s where one stream ran at the full ~37 at K = 1536 on Zen 4, with AVX-512). R
// chains per tile keep the FMA units busy without more weight rows; one row of x with 8 lanes needs more
// (below). (Groups of at most 4 rows, as this path had before, read each weight row again per group: a verify
// of 4 drafts, 4 + 1 rows, cost 1.35-1.6x a decode step's linear, f32 K = 576.)
//
// One row of x against one weight row is one chain per lane, each multiply-add waiting for the one before it
// (4 cycles). With 16 lanes that outruns memory; with 8 (avx2, NEON's register pairs, portable) it did not: a
// bf16 decode step of the 1.5B shape ran at 68% of the memory bound (avx2 forced on a 2-core AVX-512 Xeon, 2
// threads). There a single row of x takes kStreamWeightRows weight rows at a time (four chains, four streams a
// row apart: 91%; two left the MLP's linears at 23-29 GB/s where four read 29-41); each output's chain, and so
// its bits, stay the same.
constexpr int kStreamWeightRows = Vec::W < 16 ? 4 : 1;

template <class C, int R, class T, class O>
LLAISYS_ALWAYS_INLINE void dot_stream(const typename C::XElem* x, const T* w, int64_t n0, int64_t n1, int64_t K,
                                      const T* bias, O* out, int64_t N) {
    constexpr int NR = R == 1 ? kStreamWeightRows : 1;
    const KPart<typename C::Acc> all{0, K, nullptr};
    const int64_t row_bytes = K * int64_t(sizeof(T));
    const int64_t ahead = R > 1 ? ceil_div(kStreamPrefetchBytes, row_bytes) : 0;  // rows
    const int64_t lines = R > 1 ? ceil_div(row_bytes, 64) : 0;
    int64_t n = n0;
    for (; n + NR <= n1; n += NR) {
        const bool request = n + ahead < N;  // (the block after this one is, most of the time, this thread's next)
        dot_tile<C, R, NR>(x, K, w + n * K, K, bias ? bias + n : nullptr, out + n, N,
                           request ? reinterpret_cast<const char*>(w + (n + ahead) * K) : nullptr,
                           request ? lines : 0, all);
    }
    for (; n < n1; ++n)  // (the last rows of a block, where rows go in fours)
        dot_tile<C, R, 1>(x, K, w + n * K, K, bias ? bias + n : nullptr, out + n, N, nullptr, 0, all);
}

// Weight rows [n0, n1) (a thread's unit of work) against rows [0, mc) of x. With NR == 1 (mc <= kStreamRows)
// the weights stream (dot_stream). Otherwise the weight rows go in slices of
// ~256 KiB that stay in L2 while every group of MR rows of x passes them (the group, or its part of long
// rows, stays in L1 across the slice's tiles); the passes over one slice request the next one
// (SlicePrefetch; after the last slice, the first of the next block), so that memory streams while they
// compute. The row count of the last group is a template argument too, so that every tile keeps its
// accumulators in registers.
template <class C, int MR, int NR, class T, class O>
LLAISYS_ALWAYS_INLINE void dot_block(int64_t mc, const typename C::XElem* x, const T* w, int64_t n0, int64_t n1,
                                     int64_t K, const T* bias, O* out, int64_t N) {
    static_assert(MR >= 1 && MR <= 4, "tiles of 1 to 4 rows of x");
    using Acc = typename C::Acc;
    if constexpr (NR == 1) {
        static_assert(kStreamRows == 8, "a case per row count");
        switch (mc) {
            case 1: return dot_stream<C, 1>(x, w, n0, n1, K, bias, out, N);
            case 2: return dot_stream<C, 2>(x, w, n0, n1, K, bias, out, N);
            case 3: return dot_stream<C, 3>(x, w, n0, n1, K, bias, out, N);
            case 4: return dot_stream<C, 4>(x, w, n0, n1, K, bias, out, N);
            case 5: return dot_stream<C, 5>(x, w, n0, n1, K, bias, out, N);
            case 6: return dot_stream<C, 6>(x, w, n0, n1, K, bias, out, N);
            case 7: return dot_stream<C, 7>(x, w, n0, n1, K, bias, out, N);
            case 8: return dot_stream<C, 8>(x, w, n0, n1, K, bias, out, N);
            default: return;  // (the callers stream at most kStreamRows rows)
        }
    }
    const int64_t slice = std::max<int64_t>(NR, (int64_t(256) << 10) / (K * int64_t(sizeof(T))) / NR * NR);
    // Long rows (down_proj, K = 8960) go in parts of kc k (KPart), so that a group's part of x (8 KiB) stays
    // in L1 while the slice's tiles pass it; else each step would load both x and the weights from L2
    // (M = 16, Zen 4: 1536 x 8960 at 320 instead of 278 GFLOP/s). A tile's accumulators wait in carry
    // (per thread) between parts.
    const int64_t kc = std::max<int64_t>(C::KW, (int64_t(8) << 10) / (MR * int64_t(sizeof(typename C::XElem))) /
                                                    C::KW * C::KW);
    const int64_t parts = K > 2 * kc ? ceil_div(K, kc) : 1;
    const int64_t groups = ceil_div(mc, MR), max_tiles = slice / NR + NR;
    Acc* carry = parts > 1 ? scratch(kSlotCarry).get<Acc>(size_t(groups * max_tiles * kCarrySlot)) : nullptr;
    for (int64_t s0 = n0; s0 < n1; s0 += slice) {
        const int64_t s1 = std::min(n1, s0 + slice);
        const int64_t tiles = (s1 - s0) / NR + (s1 - s0) % NR;
        // the next slice, past the block's end too: the block after it is, most of the time, this thread's
        // next one (see run_tasks), whose first slice is then not read cold (M = 16, Zen 4: 8960 x 1536 at 346
        // instead of 293 GFLOP/s, 1536 x 1536 at 299 instead of 233)
        const int64_t next_lines = ceil_div((std::min(N, s1 + slice) - s1) * K * int64_t(sizeof(T)), 64);
        SlicePrefetch pf{reinterpret_cast<const char*>(w + s1 * K), next_lines,
                         ceil_div(next_lines, groups * tiles * parts)};
        for (int64_t p = 0; p < parts; ++p) {
            const int64_t k0 = p * kc, k1 = p + 1 < parts ? k0 + kc : K;
            auto part = [&](int64_t group) {  // group g's tiles keep their accumulators from carry + g * ...
                return KPart<Acc>{k0, k1, carry ? carry + group * max_tiles * kCarrySlot : nullptr};
            };
            int64_t i = 0;
            for (; i + MR <= mc; i += MR)  // (the weights come from L2, requested during the previous slice)
                dot_rows<C, MR, NR>(x + i * K, w, s0, s1, K, bias, out + i * N, N, pf, part(i / MR));
            const auto* xi = x + i * K;
            O* oi = out + i * N;
            switch (mc - i) {  // the last rows of x, fewer than MR
                case 1: dot_rows<C, 1, NR>(xi, w, s0, s1, K, bias, oi, N, pf, part(i / MR)); break;
                case 2: if constexpr (MR > 2) dot_rows<C, 2, NR>(xi, w, s0, s1, K, bias, oi, N, pf, part(i / MR)); break;
                case 3: if constexpr (MR > 3) dot_rows<C, 3, NR>(xi, w, s0, s1, K, bias, oi, N, pf, part(i / MR)); break;
                default: break;
            }
        }
    }
}

// Whether mc rows of x of K values (of x_bytes each) stream the weights (dot_stream; MR: the tiles' rows).
inline bool streams(int64_t mc, int64_t K, size_t x_bytes, int MR) {
    return mc <= MR || (mc <= kStreamRows && mc * K * int64_t(x_bytes) <= kStreamXBytes);
}

// Runs dot_block for a chain whose instructions need no target attribute (Bf16PairChain's runner, in
// linear.cpp, is the same call in a function built for AVX512-BF16).
template <class C, int MR, class T>
struct DotBlock {
    template <int NR, class O>
    static void run(int64_t mc, const typename C::XElem* x, const T* w, int64_t n0, int64_t n1, int64_t K,
                    const T* bias, O* out, int64_t N) {
        dot_block<C, MR, NR>(mc, x, w, n0, n1, K, bias, out, N);
    }
};

// The whole op in chain C (blocks run by Block::run). Rows of x go in chunks that stay in cache while every
// weight row streams past them once; the team (common/thread_pool.h) splits each chunk's weight rows into
// blocks, taken one at a time, each thread its own consecutive blocks first (the idle take over the blocks
// of a thread another process slows).
template <class C, int MR, int NR, class T, class Block>
void linear_dot(const LinearArgs& a) {
    using X = typename C::XElem;
    const int64_t M = a.M, N = a.N, K = a.K;
    const T* w = static_cast<const T*>(a.weight);
    const T* bias = static_cast<const T*>(a.bias);
    T* out = static_cast<T*>(a.out);
    constexpr bool convert_x = !std::is_same_v<X, T>;

    // Rows of x per chunk: ~2 MiB of them (a multiple of MR; they stay in L3 while the weights stream past
    // once), all of M when that is small.
    const int64_t chunk_rows = std::max<int64_t>(MR, (int64_t(2) << 20) / (K * int64_t(sizeof(X))) / MR * MR);
    const int threads = team_size();
    const bool parallel = threads > 1 && M * N * K >= (int64_t(1) << 16);
    // A block of weight rows: ~16 per thread per chunk, at most 256 rows.
    const int64_t block = std::clamp<int64_t>(round_up(ceil_div(N, int64_t(threads) * 16), 8), 8, 256);
    const int64_t blocks = ceil_div(N, block);

    X* xbuf = convert_x ? scratch(kSlotX).get<X>(size_t(std::min(M, chunk_rows) * K)) : nullptr;
    for (int64_t m0 = 0; m0 < M; m0 += chunk_rows) {
        const int64_t mc = std::min(chunk_rows, M - m0);
        const X* xs;
        if constexpr (convert_x) {
            convert(static_cast<const T*>(a.x) + m0 * K, xbuf, mc * K);
            xs = xbuf;
        } else {
            xs = static_cast<const X*>(a.x) + m0 * K;
        }
        // A decode or verify step (at most kStreamRows rows of x): tiles of one weight row (dot_stream).
        T* outs = out + m0 * N;
        auto run_blocks = [&](auto nr) {  // tiles of nr weight rows
            run_tasks(blocks, [&](int64_t b) {
                Block::template run<decltype(nr)::value>(mc, xs, w, b * block, std::min(N, (b + 1) * block), K,
                                                         bias, outs, N);
            }, parallel);
        };
        if (streams(mc, K, sizeof(X), MR)) run_blocks(std::integral_constant<int, 1>{});
        else run_blocks(std::integral_constant<int, NR>{});
    }
}

}  // namespace llaisys::cpu::LLAISYS_ISA
