// linear_gq: linear with group-quantized weights (GPTQ, AWQ), the activations as they are (backend.h):
//     out[m, n] = sum_k x[m, perm[k]] * (q[n, k] - z[n, g]) * s[n, g] + bias[n],  g = k / gs
// with q 4- or 8-bit codes in blocks of 16 rows (llaisys.ops.gq): 64 bytes = one 32-bit word of each of 16 rows,
// P = 32 / bits consecutive k per word.
//
// One arithmetic for every output, whatever M and the path (batch invariance), in f32:
//     total = 0; per group g in order: d = 0; per k of g in order: d = fma(x'[k], q[n, k], d);
//                                      total = fma(s(n, g), d - z(n, g) * X[g], total)
//     out = round(total + bias)
// where X[g] = the f32 sum of the group's x' (in order of k), so that d - z X = sum x' (q - z) up to the f32
// roundings (the cancellation costs a bit or two of d: z sits mid-range). Without FMA (the portable build) each
// fma is a product and a sum. Rows of the weight are vector lanes (a block's 16 rows: one Vec16, or two Vec8):
// a word of 16 rows is one 64-byte load, and code i of every lane is the word masked with (2^bits - 1) << bits i,
// converted to f32: q 2^(bits i), exact; x'[k] is stored times 2^-(bits i) for it (exact: a power of two), so
// the product is x' q exactly as ever. The last code of a word (its sign bit) is shifted down instead, and its x'
// is not scaled. So a step is a mask, a conversion and an FMA per vector. (An x' below 2^-102 in magnitude would
// round as a subnormal once scaled: an error below 2^-122 per product, in every path alike.)
//
// x' (x gathered through perm, widened to f32 and scaled: [M, K]) and X ([M, G]) are made once per call in the
// caller's scratch. Then:
// - decode (M <= kFlyRows): the weight streams once, unpacked on the fly: a tile of several blocks (several
//   independent chains per step) against all M rows; the blocks shared among the threads in chunks;
// - prefill (larger M): per block of 16 rows and chunk of k (at most kChunk, never across a group boundary unless
//   a group is longer), the codes are unpacked once into a small f32 buffer (L1), and tiles of kTileRows rows of x
//   run the chains over it; each thread keeps the chains' d and totals of all M rows between chunks in its
//   scratch. The blocks are the threads' tasks.
// The kernel is written once over the SIMD vocabulary (V, V::Int): each build (portable, avx2, avx512) compiles it.
#include <cmath>
#include <string>

#include "../common/api.h"
#include "linear.h"

namespace llaisys::cpu {

struct GqArgs {
    int dtype;                  // LLAISYS_F32 / _F16 / _BF16: out, x and bias
    int bits;                   // 4 or 8
    int perm_dtype;             // LLAISYS_I32 / _I64 (when perm)
    int64_t gs, M, N, K;        // M, N, K >= 1 (the entry point returns before), gs | K
    void* out;                  // [M, N]
    const void* x;              // [M, K]
    const uint8_t* weight;      // [NB, K / P, 64]
    const f16_t* scales;        // [NB, G, 16]
    const uint8_t* zeros;       // [NB, G, 16]
    const void* bias;           // [N] or nullptr
    const void* perm;           // [K] or nullptr (checked by the entry point: every value in [0, K))
};

}  // namespace llaisys::cpu

LLAISYS_DECLARE_PER_ISA(void linear_gq(const GqArgs& args))

namespace llaisys::cpu::LLAISYS_ISA {

namespace {

constexpr int kRows = 16;          // weight rows per block
constexpr int64_t kFlyRows = 4;    // up to this many rows of x: the decode path
constexpr int64_t kWindow = 256;   // prefill: k per window of x' and of the unpacked codes (a multiple of 32)
constexpr int64_t kSlab = 256;     // prefill: rows of x per pass (their window of x' stays in L2: 256 KiB)
constexpr int kTaskBlocks = 4;     // prefill: blocks per task, sharing each window of x' while it is in L2
#if defined(LLAISYS_ISA_AVX512)
constexpr int kFlyBlocks = 4;      // decode tile: blocks (one zmm each) per tile, one chain per block and row
constexpr int kTileBlocks = 2;     // prefill tile: kTileRows rows of x x 2 blocks: 16 zmm chains
constexpr int kTileRows = 8;
#elif defined(LLAISYS_ISA_AVX2)
constexpr int kFlyBlocks = 2;      // 2 ymm per block
constexpr int kTileBlocks = 1;     // 6 rows x 2 ymm: 12 chains
constexpr int kTileRows = 6;
#else
constexpr int kFlyBlocks = 1;
constexpr int kTileBlocks = 1;
constexpr int kTileRows = 4;
#endif
static_assert(kTaskBlocks % kTileBlocks == 0, "a task is whole tiles of blocks");

// x' and X (see above), in the caller's scratch.
struct GatheredX {
    // x[m, perm[k]] * 2^-(bits (k % P)) (the last code of a word unscaled): rows [M, K] (decode), or windows of
    // kWindow k, each [M, kWindow] (prefill: a slab's rows of one window are one run of memory)
    const float* x;
    const float* sum;  // [M, G]: the f32 sum of x[m, perm[k]] over group g, in order of k
    bool windows;
};

template <class T>
GatheredX gather_x(const GqArgs& a, bool windows) {
    const int64_t M = a.M, K = a.K, G = K / a.gs, P = 32 / a.bits;
    const int64_t padded = windows ? ceil_div(K, kWindow) * kWindow : K;
    float* xg = scratch(kSlotX).get<float>(size_t(M * padded + M * G + kWindow));
    float* sums = xg + M * padded;
    float* scale = sums + M * G;  // per k % 32 (P divides 32)
    for (int i = 0; i < 32; ++i) scale[i] = i % P == P - 1 ? 1.0f : std::ldexp(1.0f, -a.bits * (i % int(P)));
    const T* x = static_cast<const T*>(a.x);
    run_ranges(M, [&](int64_t m0, int64_t m1) {
        float* row = scratch(kSlotCarry).get<float>(size_t(K));
        for (int64_t m = m0; m < m1; ++m) {
            const T* src = x + m * K;
            if (!a.perm) {
                convert(src, row, K);
            } else if (a.perm_dtype == LLAISYS_I32) {
                const int32_t* p = static_cast<const int32_t*>(a.perm);
                for (int64_t k = 0; k < K; ++k) row[k] = to_f32(src[p[k]]);
            } else {
                const int64_t* p = static_cast<const int64_t*>(a.perm);
                for (int64_t k = 0; k < K; ++k) row[k] = to_f32(src[p[k]]);
            }
            for (int64_t g = 0; g < G; ++g) {
                float total = 0.0f;
                for (int64_t k = g * a.gs; k < (g + 1) * a.gs; ++k) total += row[k];
                sums[m * G + g] = total;
            }
            for (int64_t k = 0; k < K; k += 32) {  // (K and kWindow are multiples of 32)
                float* dst = windows ? xg + ((k / kWindow) * M + m) * kWindow + k % kWindow : xg + m * K + k;
                for (int i = 0; i < 32; i += Vec::W) (Vec::load(row + k + i) * Vec::load(scale + i)).store(dst + i);
            }
        }
    }, M * K >= kParallelGrain);
    return GatheredX{xg, sums, windows};
}

// The geometry of the blocks, and where a vector of rows finds its words, scales and zero points.
template <class V, int BITS>
struct Blocks {
    static constexpr int W = V::W, PV = kRows / W, P = 32 / BITS;  // vectors per block, codes per word
    static constexpr uint32_t kMask = (1u << BITS) - 1;
    const uint8_t* weight;
    const f16_t* scales;
    const uint8_t* zeros;
    int64_t words, G;  // words per block row (K / P), groups

    // vector v (< PV) of block b: its word j, the scale and zero point of group g
    LLAISYS_ALWAYS_INLINE typename V::Int word(int64_t b, int v, int64_t j) const {
        return V::Int::load(weight + (b * words + j) * 64 + v * W * 4);
    }
    LLAISYS_ALWAYS_INLINE V scale(int64_t b, int v, int64_t g) const { return V::load(scales + (b * G + g) * kRows + v * W); }
    LLAISYS_ALWAYS_INLINE V zero(int64_t b, int v, int64_t g) const { return V::load(zeros + (b * G + g) * kRows + v * W); }
    // code i of the word's lanes times 2^(bits i) (the last one unscaled: see above), exact
    LLAISYS_ALWAYS_INLINE static V codes(typename V::Int w, int i) {
        using I = typename V::Int;
        return int_to_f32(i == P - 1 ? w >> (BITS * i) : w & I(kMask << (BITS * i)));
    }
    // the group's fold: total + s (d - z X)
    LLAISYS_ALWAYS_INLINE static V fold(V total, V s, V d, V z, V sum_x) { return fmadd(s, fnmadd(z, sum_x, d), total); }
};

// total + bias rounded once, to out rows [m0, m0 + MM) x columns of vector v of block b (partial past N).
template <class V, class T>
LLAISYS_ALWAYS_INLINE void store_out(const GqArgs& a, int64_t m, int64_t b, int v, V total) {
    const int64_t n0 = b * kRows + v * V::W;
    const int rows = int(std::clamp<int64_t>(a.N - n0, 0, V::W));
    if (rows == 0) return;  // the last block's padding rows
    const T* bias = static_cast<const T*>(a.bias);
    if (bias) total = total + (rows == V::W ? V::load(bias + n0) : V::load_partial(bias + n0, rows));
    T* o = static_cast<T*>(a.out) + m * a.N + n0;
    if (rows == V::W) total.store(o);
    else total.store_partial(o, rows);
}

// ---- decode: the codes unpacked on the fly --------------------------------------------------------------------

// Blocks [b0, b0 + NBT) against rows [0, MM) of x'.
template <class V, int BITS, int MM, int NBT, class T>
LLAISYS_ALWAYS_INLINE void fly_tile(const GqArgs& a, const Blocks<V, BITS>& blk, const GatheredX& xg, int64_t b0) {
    using B = Blocks<V, BITS>;
    constexpr int PV = B::PV, P = B::P, NV = NBT * PV;
    const int64_t K = a.K, G = blk.G, wpg = a.gs / P;
    V total[MM][NV];
#pragma GCC unroll 8
    for (int m = 0; m < MM; ++m)
#pragma GCC unroll 8
        for (int v = 0; v < NV; ++v) total[m][v] = V::zero();
    for (int64_t g = 0; g < G; ++g) {
        V d[MM][NV];
#pragma GCC unroll 8
        for (int m = 0; m < MM; ++m)
#pragma GCC unroll 8
            for (int v = 0; v < NV; ++v) d[m][v] = V::zero();
        for (int64_t j = g * wpg; j < (g + 1) * wpg; ++j) {
            typename V::Int w[NV];
#pragma GCC unroll 8
            for (int v = 0; v < NV; ++v) w[v] = blk.word(b0 + v / PV, v % PV, j);
            const float* xk = xg.x + j * P;
#pragma GCC unroll 8
            for (int i = 0; i < P; ++i) {
                V c[NV];
#pragma GCC unroll 8
                for (int v = 0; v < NV; ++v) c[v] = B::codes(w[v], i);
#pragma GCC unroll 8
                for (int m = 0; m < MM; ++m) {
                    const V xb = V::set1(xk[m * K + i]);
#pragma GCC unroll 8
                    for (int v = 0; v < NV; ++v) d[m][v] = fmadd(xb, c[v], d[m][v]);
                }
            }
        }
#pragma GCC unroll 8
        for (int v = 0; v < NV; ++v) {
            const V s = blk.scale(b0 + v / PV, v % PV, g), z = blk.zero(b0 + v / PV, v % PV, g);
#pragma GCC unroll 8
            for (int m = 0; m < MM; ++m) total[m][v] = B::fold(total[m][v], s, d[m][v], z, V::set1(xg.sum[m * G + g]));
        }
    }
#pragma GCC unroll 8
    for (int m = 0; m < MM; ++m)
#pragma GCC unroll 8
        for (int v = 0; v < NV; ++v) store_out<V, T>(a, m, b0 + v / PV, v % PV, total[m][v]);
}

template <class V, int BITS, int MM, class T>
void fly(const GqArgs& a, const Blocks<V, BITS>& blk, const GatheredX& xg) {
    const int64_t blocks = ceil_div(a.N, kRows);
    const int64_t tiles = ceil_div(blocks, kFlyBlocks);
    // tiles per task: several chunks per thread, each thread its own consecutive chunks first
    const int64_t chunk = std::clamp<int64_t>(tiles / (int64_t(team_size()) * 8), 1, 16);
    const bool parallel = team_size() > 1 && a.N * a.K * a.M >= (int64_t(1) << 16) && tiles > 1;
    run_tasks(ceil_div(tiles, chunk), [&](int64_t c) {
        for (int64_t t = c * chunk; t < std::min(tiles, (c + 1) * chunk); ++t) {
            const int64_t b0 = t * kFlyBlocks;
            if (b0 + kFlyBlocks <= blocks) {
                fly_tile<V, BITS, MM, kFlyBlocks, T>(a, blk, xg, b0);
            } else {
                for (int64_t b = b0; b < blocks; ++b) fly_tile<V, BITS, MM, 1, T>(a, blk, xg, b);
            }
        }
    }, parallel);
}

// ---- prefill: the codes unpacked once per window, tiles of rows of x over them --------------------------------

// Rows [m0, m0 + MR) (of the slab's [r0, r1)) against the NBT blocks [b0, b0 + NBT) unpacked in wbuf (kRows * NBT
// f32 per k) over the window [c0, c1): the chains d (from dcarry unless c0 starts a group), folded into the totals
// at each group's end (tot, dcarry: [kTaskBlocks][slab rows][kRows] f32, t0 the tile's first block in them).
template <class V, int BITS, int NBT, int MR>
LLAISYS_ALWAYS_INLINE void window_tile(const GqArgs& a, const Blocks<V, BITS>& blk, const GatheredX& xg,
                                       const float* wbuf, int64_t b0, int t0, int64_t c0, int64_t c1, int64_t r0,
                                       int64_t rows, int64_t m0, float* dcarry, float* tot) {
    using B = Blocks<V, BITS>;
    constexpr int W = V::W, PV = B::PV, NV = NBT * PV, ROW = kRows * NBT;
    const int64_t M = a.M, gs = a.gs, G = blk.G;
    auto carry = [&](float* base, int m, int v) { return base + ((t0 + v / PV) * kSlab + (m0 + m)) * kRows + (v % PV) * W; };
    V d[MR][NV];
#pragma GCC unroll 8
    for (int m = 0; m < MR; ++m)
#pragma GCC unroll 4
        for (int v = 0; v < NV; ++v) d[m][v] = c0 % gs == 0 ? V::zero() : V::load(carry(dcarry, m, v));
    // x' of the window: rows [r0, r0 + rows) of window c0 / kWindow, kWindow apart
    const float* x = xg.x + ((c0 / kWindow) * M + r0 + m0) * kWindow - c0;
    for (int64_t k = c0; k < c1;) {
        const int64_t end = std::min(c1, (k / gs + 1) * gs);  // up to the group's end
        for (; k < end; ++k) {
            V w[NV];
#pragma GCC unroll 4
            for (int v = 0; v < NV; ++v) w[v] = V::load(wbuf + (k - c0) * ROW + v * W);
#pragma GCC unroll 8
            for (int m = 0; m < MR; ++m) {
                const V xb = V::set1(x[m * kWindow + k]);
#pragma GCC unroll 4
                for (int v = 0; v < NV; ++v) d[m][v] = fmadd(xb, w[v], d[m][v]);
            }
        }
        if (k % gs == 0) {  // the group's end: fold
            const int64_t g = k / gs - 1;
            V s[NV], z[NV];
#pragma GCC unroll 4
            for (int v = 0; v < NV; ++v) s[v] = blk.scale(b0 + v / PV, v % PV, g), z[v] = blk.zero(b0 + v / PV, v % PV, g);
#pragma GCC unroll 8
            for (int m = 0; m < MR; ++m) {
                const V sum_x = V::set1(xg.sum[(r0 + m0 + m) * G + g]);
#pragma GCC unroll 4
                for (int v = 0; v < NV; ++v) {
                    float* t = carry(tot, m, v);
                    B::fold(V::load(t), s[v], d[m][v], z[v], sum_x).store(t);
                    d[m][v] = V::zero();
                }
            }
        }
    }
    if (c1 % gs != 0)  // the group goes on in the next window
#pragma GCC unroll 8
        for (int m = 0; m < MR; ++m)
#pragma GCC unroll 4
            for (int v = 0; v < NV; ++v) d[m][v].store(carry(dcarry, m, v));
    (void)rows;
}

// The slab's rows against the NBT blocks at b0 over one window: tiles of kTileRows rows, then the rest.
template <class V, int BITS, int NBT>
void window_rows(const GqArgs& a, const Blocks<V, BITS>& blk, const GatheredX& xg, const float* wbuf, int64_t b0,
                 int t0, int64_t c0, int64_t c1, int64_t r0, int64_t rows, float* dcarry, float* tot) {
    int64_t m = 0;
    for (; m + kTileRows <= rows; m += kTileRows)
        window_tile<V, BITS, NBT, kTileRows>(a, blk, xg, wbuf, b0, t0, c0, c1, r0, rows, m, dcarry, tot);
    auto rest = [&](auto mr) {
        constexpr int MR = decltype(mr)::value;
        if constexpr (MR < kTileRows) window_tile<V, BITS, NBT, MR>(a, blk, xg, wbuf, b0, t0, c0, c1, r0, rows, m, dcarry, tot);
    };
    switch (rows - m) {  // the last rows, fewer than kTileRows
        case 1: rest(std::integral_constant<int, 1>{}); break;
        case 2: rest(std::integral_constant<int, 2>{}); break;
        case 3: rest(std::integral_constant<int, 3>{}); break;
        case 4: rest(std::integral_constant<int, 4>{}); break;
        case 5: rest(std::integral_constant<int, 5>{}); break;
        case 6: rest(std::integral_constant<int, 6>{}); break;
        case 7: rest(std::integral_constant<int, 7>{}); break;
        default: break;
    }
}

// Unpacks the NBT blocks at b0 over the window [c0, c1) into wbuf: per k, kRows * NBT f32 (the codes, scaled).
template <class V, int BITS, int NBT>
LLAISYS_ALWAYS_INLINE void unpack_window(const Blocks<V, BITS>& blk, int64_t b0, int64_t c0, int64_t c1, float* wbuf) {
    using B = Blocks<V, BITS>;
    constexpr int W = V::W, PV = B::PV, P = B::P, ROW = kRows * NBT;
    for (int64_t j = c0 / P; j < c1 / P; ++j)
#pragma GCC unroll 4
        for (int v = 0; v < NBT * PV; ++v) {
            const auto word = blk.word(b0 + v / PV, v % PV, j);
#pragma GCC unroll 8
            for (int i = 0; i < P; ++i) B::codes(word, i).store(wbuf + (j * P + i - c0) * ROW + v * W);
        }
}

template <class V, int BITS, class T>
void tiled(const GqArgs& a, const Blocks<V, BITS>& blk, const GatheredX& xg) {
    constexpr int W = V::W, PV = Blocks<V, BITS>::PV;
    const int64_t K = a.K, blocks = ceil_div(a.N, kRows), tasks = ceil_div(blocks, kTaskBlocks);
    for (int64_t r0 = 0; r0 < a.M; r0 += kSlab) {
        const int64_t rows = std::min(kSlab, a.M - r0);
        run_tasks(tasks, [&](int64_t task) {
            const int64_t first = task * kTaskBlocks, count = std::min<int64_t>(kTaskBlocks, blocks - first);
            float* buf = scratch(kSlotCarry).get<float>(size_t(kWindow * kRows * kTileBlocks + 2 * kTaskBlocks * kSlab * kRows));
            float* wbuf = buf;
            float* dcarry = buf + kWindow * kRows * kTileBlocks;
            float* tot = dcarry + kTaskBlocks * kSlab * kRows;
            std::fill(tot, tot + kTaskBlocks * kSlab * kRows, 0.0f);
            for (int64_t c0 = 0; c0 < K; c0 += kWindow) {
                const int64_t c1 = std::min(K, c0 + kWindow);
                int t = 0;
                for (; t + kTileBlocks <= count; t += kTileBlocks) {
                    unpack_window<V, BITS, kTileBlocks>(blk, first + t, c0, c1, wbuf);
                    window_rows<V, BITS, kTileBlocks>(a, blk, xg, wbuf, first + t, t, c0, c1, r0, rows, dcarry, tot);
                }
                for (; t < count; ++t) {  // (a last block short of a tile)
                    unpack_window<V, BITS, 1>(blk, first + t, c0, c1, wbuf);
                    window_rows<V, BITS, 1>(a, blk, xg, wbuf, first + t, t, c0, c1, r0, rows, dcarry, tot);
                }
            }
            for (int t = 0; t < count; ++t)
                for (int64_t m = 0; m < rows; ++m)
#pragma GCC unroll 4
                    for (int v = 0; v < PV; ++v)
                        store_out<V, T>(a, r0 + m, first + t, v, V::load(tot + (t * kSlab + m) * kRows + v * W));
        }, team_size() > 1 && tasks > 1);
    }
}

template <class V, int BITS, class T>
void run(const GqArgs& a, const GatheredX& xg) {
    const Blocks<V, BITS> blk{a.weight, a.scales, a.zeros, a.K / Blocks<V, BITS>::P, a.K / a.gs};
    static_assert(kFlyRows == 4, "a case per decode row count");
    switch (a.M) {
        case 1: return fly<V, BITS, 1, T>(a, blk, xg);
        case 2: return fly<V, BITS, 2, T>(a, blk, xg);
        case 3: return fly<V, BITS, 3, T>(a, blk, xg);
        case 4: return fly<V, BITS, 4, T>(a, blk, xg);
        default: return tiled<V, BITS, T>(a, blk, xg);
    }
}

}  // namespace

void linear_gq(const GqArgs& a) {
    with_float_type(a.dtype, [&](auto tag) {
        using T = decltype(tag);
        const GatheredX xg = gather_x<T>(a, a.M > kFlyRows);
        if (a.bits == 4) run<Vec, 4, T>(a, xg);
        else run<Vec, 8, T>(a, xg);
    });
}

}  // namespace llaisys::cpu::LLAISYS_ISA

#if defined(LLAISYS_ISA_PORTABLE)  // the exported entry point, compiled once
namespace {

// perm is data only the kernel reads: every value must lie in [0, K) before x is read through it.
template <class I>
void check_perm(const void* perm, int64_t K) {
    const I* p = static_cast<const I*>(perm);
    for (int64_t k = 0; k < K; ++k)
        if (p[k] < 0 || int64_t(p[k]) >= K)
            throw llaisys::InvalidArgument("perm[" + std::to_string(k) + "] = " + std::to_string(int64_t(p[k])) +
                                           " is outside [0, " + std::to_string(K) + ") (position " +
                                           std::to_string(k) + ")");
}

}  // namespace

int LLAISYS_FN(linear_gq)(int device, void* stream, int dtype, int bits, int64_t group_size, int perm_dtype,
                          int64_t M, int64_t N, int64_t K, void* out, const void* x, const void* weight,
                          const void* scales, const void* zeros, const void* bias, const void* perm) {
    (void)device;
    return llaisys::launch("linear_gq", stream, [=] {
        llaisys::require_float_dtype(dtype);
        if (bits != 4 && bits != 8) throw llaisys::NotSupported("bits = " + std::to_string(bits) + " (4 or 8)");
        if (perm && perm_dtype != LLAISYS_I32 && perm_dtype != LLAISYS_I64)
            throw llaisys::NotSupported("perm dtype code " + std::to_string(perm_dtype) + " (int32 or int64)");
        if (M == 0 || N == 0) return;  // nothing to compute
        if (K == 0) {
            llaisys::cpu::portable::with_float_type(dtype, [&](auto tag) {
                using T = decltype(tag);
                llaisys::cpu::portable::fill_rows_with_bias(static_cast<T*>(out), static_cast<const T*>(bias), M, N);
            });
            return;
        }
        if (group_size <= 0 || K % group_size || group_size % 32)
            throw llaisys::InvalidArgument("group_size " + std::to_string(group_size) + " for K = " + std::to_string(K));
        if (perm) {
            if (perm_dtype == LLAISYS_I32) check_perm<int32_t>(perm, K);
            else check_perm<int64_t>(perm, K);
        }
        LLAISYS_PER_ISA(linear_gq)(llaisys::cpu::GqArgs{
            dtype, bits, perm_dtype, group_size, M, N, K, out, x, static_cast<const uint8_t*>(weight),
            static_cast<const llaisys::f16_t*>(scales), static_cast<const uint8_t*>(zeros), bias, perm});
    });
}
#endif
