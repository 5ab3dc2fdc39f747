// paged_attention: causal GQA attention for a batch of sequences, each reading its keys and values
// through its block table (see llaisys/backend.h). The tile machinery is self_attention.h's lane form:
// a tile holds LANES = MB * W queries of one (sequence, kv head) in the lanes of SIMD vectors, streams over
// blocks of BK keys with an online softmax, and every step is a vertical (per-lane) operation.
//
// Batch invariance (a request's output must not depend on what else is in the batch, nor on how its prompt
// was cut into calls, so batched serving gives the tokens `model.generate` gives):
//   * every lane computes alone: its dot products run over c in order, its softmax over its own keys, and
//     keys past its causal end contribute exact zeros (exp(-inf) = 0, alpha = exp(0) = 1). So the result of
//     a query does not depend on which other queries share its tile, nor on the tile width MB (picked per
//     sequence from its row count) — only on its own row and its sequence's keys;
//   * key blocks start at multiples of BK from position 0, whatever the tile;
//   * a sliding window (window > 0: query at position p sees keys p - window < j <= p) masks a lane's keys
//     before its window's start as the causal mask masks those past its end: exact zeros, so key blocks and
//     chunks before the tile's first window start are skipped (never read), and the blocks a tile does read
//     for its other lanes change nothing for a lane they are wholly outside of (alpha = exp(-inf) = 0 on
//     the zero state);
//   * the keys are cut into fixed chunks of kChunkKeys positions (absolute, not per call). Each chunk
//     gives a partial (m, l, O); a query with keys in several chunks always gets the merge of its chunks'
//     partials, in chunk order, whether one thread runs them one after the other or several threads run
//     them side by side (flash-decoding, when a step has too few tiles to feed the threads). A query whose
//     keys fit in one chunk gets exactly the unmerged result (the merge multiplies by exp(0) = 1 and adds
//     exact zeros for the empty chunks), so the cut never depends on the other queries of its tile;
//   * one vector type per build (V), and no row form (its dot products would sum in another order).
// Threads share (tile, chunk range) items, so the result never depends on the thread count either.
//
// The value-lanes form: a tile of n < W queries (decode: one row of G < W heads per (sequence, kv head))
// leaves lanes idle in P V, so there it puts the value DIMENSIONS in the lanes: O [query][dv] += p_j * V[j]
// (pv_values_tile). Each lane does exactly what a lane of the query-lanes form does for that (query, column):
// alpha * O, then the same fmadd chain over the keys in the same order; scores, masks and the online softmax
// are the query-lanes form's, and O goes back to OT [dv][lane] at the end of each chunk, so both forms give
// the same bits. (Scores with the KEYS in the lanes were tried too, from the key block transposed: the
// transpose cost more than the idle lanes, and even without it they gained under 10% at G = 3 and nothing at
// G = 6 on an AVX-512 machine: the scores are not where a decode tile spends most of its time.)
//
// Compiled once per instruction set (see simd/simd.h): the templates land in namespace
// llaisys::cpu::<isa>; paged_attention.cpp picks each build's tile shapes.
#pragma once

#include <type_traits>

#include "kv_quant.h"
#include "self_attention.h"

namespace llaisys::cpu::attn {

struct PagedProblem {
    int64_t T, num_seqs, H, Hkv, d, dv, num_blocks, block_size, max_blocks;
    int64_t window;              // sliding window (0: none)
    float scale;
    void* out;                   // [T, H, dv]
    const void* q;               // [T, H, d]
    const void* k_cache;         // [num_blocks, block_size, Hkv, d]
    const void* v_cache;         // [num_blocks, block_size, Hkv, dv]
    const int32_t* block_tables; // [num_seqs, max_blocks]
    const int32_t* seq_lens;     // [num_seqs]
    const int32_t* query_start;  // [num_seqs + 1]
    // A quantized cache (paged_attention_q): 0, or the llaisys_kv_format of the byte caches (then k_cache
    // uint8 [.., Hkv, d], v_cache uint8 [.., Hkv, dv]) and their f16 scales [num_blocks * block_size, Hkv].
    int kv_format = 0;
    const void* k_scale = nullptr;
    const void* v_scale = nullptr;
    // The value-lanes form for tiles of few queries (Paged::values_form); false only to test or time it
    // against the query-lanes form (LLAISYS_CPU_PAGED_VALUE_LANES=0): both give the same bits.
    bool value_lanes = true;
    // A latent cache (paged_latent_attention, DeepSeek's MLA): Hkv = 1, k_cache = c [rows, dv] and v_cache =
    // r [rows, d - dv]; key j = (c[j], r[j]) and value j = c[j] (LatentKV).
    bool latent = false;
};

// One unit of work: tile `tile` of (sequence `seq`, kv head `g`), key chunks [c0, c1) of the tile's chunks
// [cfirst, cfirst + nchunks) (absolute chunk indices; those before cfirst lie wholly before every lane's
// window). `part` is where the chunk partials go (chunk c at c - cfirst) when the tile's chunks are shared
// among several items (-1: the item merges them itself).
struct PagedItem {
    int32_t seq, g, tile, mb;
    int32_t c0, c1, nchunks;
    int32_t cfirst;
    int64_t part;
};

}  // namespace llaisys::cpu::attn

// The paged attention of each build (dtype: LLAISYS_F32, _F16 or _BF16; p.kv_format: the cache's format).
LLAISYS_DECLARE_PER_ISA(void paged_attention(int dtype, const attn::PagedProblem& p))

namespace llaisys::cpu::LLAISYS_ISA {

using attn::PagedItem;
using attn::PagedProblem;

// Keys are merged in chunks of this many positions (a multiple of kBlockKeys), see above.
constexpr int64_t kChunkKeys = 512;
static_assert(kChunkKeys % kBlockKeys == 0, "a chunk holds whole key blocks");

// The cache readers of paged_kv_block: the f32 key (value) row of kv head g at cache row `row`.
// A plain cache of T rows: widened (f32 rows may also be read where they lie, kInPlace).
template <class T>
struct PlainKV {
    static constexpr bool kInPlace = std::is_same_v<T, float>;
    const T* kc;
    const T* vc;
    explicit PlainKV(const PagedProblem& p)
        : kc(static_cast<const T*>(p.k_cache)), vc(static_cast<const T*>(p.v_cache)) {}
    void key(int64_t row, int64_t Hkv, int64_t g, int64_t d, float* dst) const {
        convert(kc + (row * Hkv + g) * d, dst, d);
    }
    void value(int64_t row, int64_t Hkv, int64_t g, int64_t dv, float* dst) const {
        convert(vc + (row * Hkv + g) * dv, dst, dv);
    }
};

// A quantized cache (kv_quant.h) of format Fmt: decode(byte) * the row's f16 scale, always gathered.
template <int Fmt>
struct QuantKV {
    static constexpr bool kInPlace = false;
    const uint8_t* kc;
    const uint8_t* vc;
    const f16_t* ks;  // [rows, Hkv]
    const f16_t* vs;
    explicit QuantKV(const PagedProblem& p)
        : kc(static_cast<const uint8_t*>(p.k_cache)), vc(static_cast<const uint8_t*>(p.v_cache)),
          ks(static_cast<const f16_t*>(p.k_scale)), vs(static_cast<const f16_t*>(p.v_scale)) {}
    void key(int64_t row, int64_t Hkv, int64_t g, int64_t d, float* dst) const {
        kvq::dequantize_row<Fmt>(kc + (row * Hkv + g) * d, ks[row * Hkv + g], d, dst);
    }
    void value(int64_t row, int64_t Hkv, int64_t g, int64_t dv, float* dst) const {
        kvq::dequantize_row<Fmt>(vc + (row * Hkv + g) * dv, vs[row * Hkv + g], dv, dst);
    }
};

// A latent cache (MLA): one kv head whose key row is the concatenation (c[row], r[row]) of the two caches and
// whose value row is c[row], the key's first dv values: gathered once as keys, and the values read from them.
template <class T>
struct LatentKV {
    static constexpr bool kInPlace = false;
    static constexpr bool kValuesInKeys = true;
    const T* c;
    const T* r;
    int64_t dr;
    explicit LatentKV(const PagedProblem& p)
        : c(static_cast<const T*>(p.k_cache)), r(static_cast<const T*>(p.v_cache)), dr(p.d - p.dv) {}
    void key(int64_t row, int64_t, int64_t, int64_t d, float* dst) const {
        convert(c + row * (d - dr), dst, d - dr);
        convert(r + row * dr, dst + d - dr, dr);
    }
};

template <class KV, class = void>
struct ValuesInKeys : std::false_type {};
template <class KV>
struct ValuesInKeys<KV, std::void_t<decltype(KV::kValuesInKeys)>> : std::bool_constant<KV::kValuesInKeys> {};

// Keys [kb, kb + nb) of kv head g of one sequence (block table bt) as f32 rows: read in place when the reader
// allows it (f32) and inside one cache block, else gathered (widened or decoded) into Kc / Vc (a latent cache's
// values are its gathered keys' first dv columns).
template <class KV>
static inline void paged_kv_block(const KV& kv, const int32_t* bt, int64_t bs, int64_t kb, int64_t nb,
                                  int64_t Hkv, int64_t g, int64_t d, int64_t dv, float* Kc, float* Vc,
                                  const float*& Kp, int64_t& kstride, const float*& Vp, int64_t& vstride) {
    if constexpr (KV::kInPlace) {
        const int64_t off = kb % bs;
        if (off + nb <= bs) {
            const int64_t row = int64_t(bt[kb / bs]) * bs + off;
            Kp = kv.kc + (row * Hkv + g) * d, kstride = Hkv * d;
            Vp = kv.vc + (row * Hkv + g) * dv, vstride = Hkv * dv;
            return;
        }
    }
    for (int64_t j = 0; j < nb; ++j) {
        const int64_t pos = kb + j, row = int64_t(bt[pos / bs]) * bs + pos % bs;
        kv.key(row, Hkv, g, d, Kc + j * d);
        if constexpr (!ValuesInKeys<KV>::value) kv.value(row, Hkv, g, dv, Vc + j * dv);
    }
    Kp = Kc, kstride = d;
    if constexpr (ValuesInKeys<KV>::value) Vp = Kc, vstride = d;
    else Vp = Vc, vstride = dv;
}

// Merge chunk partials (m, l, OT at parts + s * stride, s < n) in chunk order into OT / l:
// M = max m_s, w_s = exp(m_s - M), l = sum w_s l_s, OT = sum w_s OT_s (each an FMA chain over s).
template <class V, int MB>
static inline void merge_chunks(const float* parts, int64_t n, int64_t stride, int64_t dv, float* OT, float* l) {
    constexpr int W = V::W, LANES = MB * W;
    for (int b = 0; b < MB; ++b) {
        V mmax = V::set1(-__builtin_inff());
        for (int64_t s = 0; s < n; ++s) mmax = vmax(mmax, V::load(parts + s * stride + b * W));
        V lsum = V::zero();
        for (int64_t c = 0; c < dv; ++c) V::zero().store(OT + c * LANES + b * W);
        for (int64_t s = 0; s < n; ++s) {
            const float* part = parts + s * stride;
            const V w = vexp(V::load(part + b * W) - mmax);
            lsum = fmadd(w, V::load(part + LANES + b * W), lsum);
            const float* ot = part + 2 * LANES;
            for (int64_t c = 0; c < dv; ++c) {
                float* o = OT + c * LANES + b * W;
                fmadd(w, V::load(ot + c * LANES + b * W), V::load(o)).store(o);
            }
        }
        lsum.store(l + b * W);
    }
}

// Value-lanes P V: O[q][c] = alpha[q] * O[q][c] + sum_j P[j][q] * V[j][c] for NQ queries from q0 and R vectors
// of columns from c0 (the last one `last` columns wide when kTail), each an fmadd chain over j in order
// (pv_tile's, with the product's operands in the other lanes). O rows are dv apart.
template <class V, int NQ, int R, bool kTail>
static inline void pv_values_tile(float* __restrict O, int64_t dv, const float* __restrict P, int64_t lanes,
                                  int64_t nb, const float* __restrict Vp, int64_t vstride, int64_t q0, int64_t c0,
                                  const float* alpha, int last) {
    constexpr int W = V::W;
    auto load = [&](const float* src, int r) {
        return kTail && r == R - 1 ? V::load_partial(src + r * W, last) : V::load(src + r * W);
    };
    V acc[NQ][R];
    LLAISYS_UNROLL for (int a = 0; a < NQ; ++a)
        LLAISYS_UNROLL for (int r = 0; r < R; ++r)
            acc[a][r] = load(O + (q0 + a) * dv + c0, r) * V::set1(alpha[q0 + a]);
    const float* vrow = Vp + c0;
    for (int64_t j = 0; j < nb; ++j, vrow += vstride) {
        V x[R];
        LLAISYS_UNROLL for (int r = 0; r < R; ++r) x[r] = load(vrow, r);
        LLAISYS_UNROLL for (int a = 0; a < NQ; ++a) {
            const V pv = V::broadcast(P + j * lanes + q0 + a);
            LLAISYS_UNROLL for (int r = 0; r < R; ++r) acc[a][r] = fmadd(x[r], pv, acc[a][r]);
        }
    }
    LLAISYS_UNROLL for (int a = 0; a < NQ; ++a) {
        float* o = O + (q0 + a) * dv + c0;
        LLAISYS_UNROLL for (int r = 0; r < R; ++r) {
            if (kTail && r == R - 1) acc[a][r].store_partial(o + r * W, last);
            else acc[a][r].store(o + r * W);
        }
    }
}

// Tile shapes of one build: register tiles (KR keys x MB vectors for the scores, R value columns x MB for
// P V) for MB = 1, 2, 4 vectors of queries; MB up to kMaxMB.
//   struct Shapes { static constexpr int kMaxMB; static constexpr int kr[3], r[3]; };  // index log2(MB)

// T: the element type of q and out; KV: the cache reader (PlainKV<T>, or QuantKV of a format).
template <class V, class Shapes, class T, class KV>
struct Paged {
    static constexpr int W = V::W, BK = kBlockKeys, kMaxLanes = Shapes::kMaxMB * W;

    // Per-thread scratch layout (floats), sized for the widest tile.
    struct Scratch {
        float *QT, *ST, *OT, *m, *l, *end, *start, *row, *Kc, *Vc, *O, *parts;
    };

    const PagedProblem& p;
    int64_t G, part_stride_max, local_chunks;

    static int64_t round16(int64_t n) { return (n + 15) & ~int64_t(15); }

    int64_t per_thread_floats() const {
        const int64_t dmax = (p.d > p.dv ? p.d : p.dv) + 64;
        return round16(p.d * kMaxLanes) + round16(int64_t(BK) * kMaxLanes) + round16(p.dv * kMaxLanes) +
               4 * round16(kMaxLanes) + round16(dmax) + round16(int64_t(BK) * p.d) + round16(int64_t(BK) * p.dv) +
               round16(int64_t(W) * p.dv) + round16(local_chunks * part_stride_max);
    }

    Scratch carve(float* sc) const {
        Scratch s;
        const int64_t dmax = (p.d > p.dv ? p.d : p.dv) + 64;
        s.QT = sc; sc += round16(p.d * kMaxLanes);
        s.ST = sc; sc += round16(int64_t(BK) * kMaxLanes);
        s.OT = sc; sc += round16(p.dv * kMaxLanes);
        s.m = sc; sc += round16(kMaxLanes);
        s.l = sc; sc += round16(kMaxLanes);
        s.end = sc; sc += round16(kMaxLanes);
        s.start = sc; sc += round16(kMaxLanes);
        s.row = sc; sc += round16(dmax);
        s.Kc = sc; sc += round16(int64_t(BK) * p.d);
        s.Vc = sc; sc += round16(int64_t(BK) * p.dv);
        s.O = sc; sc += round16(int64_t(W) * p.dv);
        s.parts = sc;
        return s;
    }

    static int64_t lanes_of(int mb) { return int64_t(mb) * W; }

    // The first key the query at position `pos` sees.
    int64_t window_start(int64_t pos) const { return LLAISYS_ISA::window_start(pos, p.window); }

    // The chunks a tile of rows [i_first, i_last] of a sequence with S keys and L rows reads: [first, end).
    void tile_chunks(int64_t i_first, int64_t i_last, int64_t S, int64_t L, int64_t& first, int64_t& end) const {
        first = window_start(i_first + S - L) / kChunkKeys;
        end = (i_last + S - L + 1 + kChunkKeys - 1) / kChunkKeys;
    }

    // Queries of the tile: flat index f = row * G + head within (seq, g); row i of the sequence sees keys
    // [window_start(S - L + i), S - L + i + 1).
    int64_t tile_queries(const PagedItem& it, int64_t& f0) const {
        const int64_t L = p.query_start[it.seq + 1] - p.query_start[it.seq], M = L * G, lanes = lanes_of(it.mb);
        f0 = int64_t(it.tile) * lanes;
        return M - f0 < lanes ? M - f0 : lanes;
    }

    // out row of each of the tile's queries = OT[.][lane] / l[lane]
    template <int MB>
    void finish(const PagedItem& it, const float* OT, const float* l, Scratch& s) const {
        constexpr int LANES = MB * W;
        int64_t f0;
        const int64_t n = tile_queries(it, f0), q0 = p.query_start[it.seq];
        T* out = static_cast<T*>(p.out);
        for (int64_t lane = 0; lane < n; ++lane) {
            const int64_t f = f0 + lane, i = q0 + f / G, h = it.g * G + f % G;
            const float inv = 1.0f / l[lane];
            for (int64_t c = 0; c < p.dv; ++c) s.row[c] = OT[c * LANES + lane] * inv;
            convert(s.row, out + (i * p.H + h) * p.dv, p.dv);
        }
    }

    // Scores past a lane's bound masked to -inf: keys kb + jj >= bound[lane] (the causal end), or with
    // kBefore, keys kb + jj < bound[lane] (the window's start).
    template <int MB, bool kBefore>
    static void mask_scores(float* ST, const float* bound, int64_t kb, int64_t nb) {
        constexpr int LANES = MB * W;
        const V neg_inf = V::set1(-__builtin_inff());
        for (int b = 0; b < MB; ++b) {
            const V e = V::load(bound + b * W);
            for (int64_t jj = 0; jj < nb; ++jj) {
                float* sp = ST + jj * LANES + b * W;
                const auto below = lt_mask(V::set1(float(kb + jj)), e);
                if constexpr (kBefore) select(below, neg_inf, V::load(sp)).store(sp);
                else select(below, V::load(sp), neg_inf).store(sp);
            }
        }
    }

    // The online softmax of one key block, per lane: m and l updated, ST's scores replaced by exp(s - m),
    // alpha[b] = the factor of the lanes' old O.
    template <int MB>
    static void online_softmax(Scratch& s, int64_t nb, V* alpha) {
        constexpr int LANES = MB * W;
        for (int b = 0; b < MB; ++b) {
            V bmax = V::set1(-__builtin_inff());
            for (int64_t jj = 0; jj < nb; ++jj) bmax = vmax(bmax, V::load(s.ST + jj * LANES + b * W));
            const V mold = V::load(s.m + b * W);
            const V mnew = vmax(mold, bmax);
            const V msafe = select(lt_mask(mnew, V::set1(-3.0e38f)), V::zero(), mnew);  // no inf - inf
            alpha[b] = vexp(mold - msafe);
            V sum = V::zero();
            for (int64_t jj = 0; jj < nb; ++jj) {
                float* sp = s.ST + jj * LANES + b * W;
                const V e = vexp(V::load(sp) - msafe);
                e.store(sp);
                sum = sum + e;
            }
            fmadd(V::load(s.l + b * W), alpha[b], sum).store(s.l + b * W);
            mnew.store(s.m + b * W);
        }
    }

    // The value-lanes form (see the top) for a tile of n queries: MB = 1 and fewer queries than lanes.
    bool values_form(int64_t n) const { return p.value_lanes && n < W; }

    // Value-lanes P V of a block of nb values (rows Vp, vstride apart) into O [query][dv] for n queries,
    // P = ST [key][query lane], each query's old O scaled by its lane of alpha.
    void values_pv(const float* Vp, int64_t vstride, int64_t nb, int64_t n, V alpha, Scratch& s) const {
        const int64_t dv = p.dv;
        alignas(64) float a[W];
        alpha.store(a);
        // NQ queries from q0 in register tiles of NQ x R column vectors (8 or 9 accumulators), then single
        // vectors and a partial one for the last dv % W columns
        auto group = [&](int64_t q0, auto nq, auto r) {
            constexpr int NQ = decltype(nq)::value, R = decltype(r)::value;
            int64_t c = 0;
            for (; c + R * W <= dv; c += R * W)
                pv_values_tile<V, NQ, R, false>(s.O, dv, s.ST, W, nb, Vp, vstride, q0, c, a, W);
            for (; c + W <= dv; c += W) pv_values_tile<V, NQ, 1, false>(s.O, dv, s.ST, W, nb, Vp, vstride, q0, c, a, W);
            if (c < dv) pv_values_tile<V, NQ, 1, true>(s.O, dv, s.ST, W, nb, Vp, vstride, q0, c, a, int(dv - c));
        };
        using I2 = std::integral_constant<int, 2>;
        using I4 = std::integral_constant<int, 4>;
        int64_t q0 = 0;
        for (; q0 + 4 <= n; q0 += 4) group(q0, I4{}, I2{});
        if (n - q0 == 3) group(q0, std::integral_constant<int, 3>{}, std::integral_constant<int, 3>{});
        else if (n - q0 == 2) group(q0, I2{}, I4{});
        else if (n - q0 == 1) group(q0, std::integral_constant<int, 1>{}, I4{});
    }

    // O [query][dv] of the chunk into OT [dv][lane] (the other lanes 0), where merge_chunks and finish read it.
    void values_to_lanes(int64_t n, Scratch& s) const {
        for (int64_t c = 0; c < p.dv; ++c)
            for (int64_t lane = 0; lane < W; ++lane) s.OT[c * W + lane] = lane < n ? s.O[lane * p.dv + c] : 0.0f;
    }

    // Chunks [it.c0, it.c1) of one tile; each chunk's partial goes to `parts` (chunk c at c * stride),
    // except for a tile of one chunk, which finishes straight away.
    template <int MB>
    void run_item(const PagedItem& it, Scratch& s, float* global_parts) const {
        constexpr int LANES = MB * W, KR = Shapes::kr[MB == 1 ? 0 : MB == 2 ? 1 : 2];
        constexpr int R = Shapes::r[MB == 1 ? 0 : MB == 2 ? 1 : 2];
        const int64_t d = p.d, dv = p.dv, Hkv = p.Hkv, H = p.H;
        const int64_t q0 = p.query_start[it.seq], L = p.query_start[it.seq + 1] - q0, S = p.seq_lens[it.seq];
        const int32_t* bt = p.block_tables + int64_t(it.seq) * p.max_blocks;
        const T* q = static_cast<const T*>(p.q);
        const KV kv(p);
        int64_t f0;
        const int64_t n = tile_queries(it, f0), off = S - L;
        const bool by_values = MB == 1 && values_form(n);

        for (int64_t lane = 0; lane < LANES; ++lane) {
            if (lane < n) {
                const int64_t f = f0 + lane, i = f / G, h = it.g * G + f % G;
                convert(q + ((q0 + i) * H + h) * d, s.row, d);
                for (int64_t c = 0; c < d; ++c) s.QT[c * LANES + lane] = s.row[c] * p.scale;
                s.end[lane] = float(i + off + 1);
                s.start[lane] = float(window_start(i + off));
            } else {
                for (int64_t c = 0; c < d; ++c) s.QT[c * LANES + lane] = 0.0f;
                s.end[lane] = float(S);
                s.start[lane] = 0.0f;
            }
        }
        const int64_t kend = (f0 + n - 1) / G + off + 1;  // keys visible to the tile's last query
        const int64_t min_end = f0 / G + off + 1;         // keys visible to its first
        const int64_t kfirst = window_start(f0 / G + off) / BK * BK;  // the block of its first query's first key
        const int64_t max_start = window_start((f0 + n - 1) / G + off);  // its last query's first key
        const int64_t stride = (2 + dv) * LANES;
        float* parts = it.part >= 0 ? global_parts + it.part : s.parts;

        for (int64_t chunk = it.c0; chunk < it.c1; ++chunk) {
            for (int64_t lane = 0; lane < LANES; ++lane) s.m[lane] = -__builtin_inff(), s.l[lane] = 0.0f;
            if (by_values) std::memset(s.O, 0, sizeof(float) * size_t(n * dv));
            else std::memset(s.OT, 0, sizeof(float) * size_t(dv * LANES));
            const int64_t c_start = chunk * kChunkKeys, ks = c_start > kfirst ? c_start : kfirst;
            const int64_t ke = c_start + kChunkKeys < kend ? c_start + kChunkKeys : kend;

            for (int64_t kb = ks; kb < ke; kb += BK) {
                const int64_t nb = ke - kb < BK ? ke - kb : BK;
                const float *Kp, *Vp;
                int64_t kstride, vstride;
                paged_kv_block(kv, bt, p.block_size, kb, nb, Hkv, it.g, d, dv, s.Kc, s.Vc, Kp, kstride, Vp,
                               vstride);
                int64_t j = 0;
                for (; j + KR <= nb; j += KR) qk_tile<V, MB, KR>(s.QT, Kp + j * kstride, kstride, d, s.ST + j * LANES);
                for (; j < nb; ++j) qk_tile<V, MB, 1>(s.QT, Kp + j * kstride, kstride, d, s.ST + j * LANES);
                if (kb + nb > min_end) mask_scores<MB, false>(s.ST, s.end, kb, nb);  // past some query's end
                if (kb < max_start) mask_scores<MB, true>(s.ST, s.start, kb, nb);    // before some query's start
                V alpha[MB];
                online_softmax<MB>(s, nb, alpha);
                if (by_values) {
                    values_pv(Vp, vstride, nb, n, alpha[0], s);
                } else {
                    int64_t c = 0;
                    for (; c + R <= dv; c += R) pv_tile<V, MB, R>(s.OT, s.ST, nb, Vp, vstride, c, alpha);
                    for (; c + 4 <= dv; c += 4) pv_tile<V, MB, 4>(s.OT, s.ST, nb, Vp, vstride, c, alpha);
                    for (; c < dv; ++c) pv_tile<V, MB, 1>(s.OT, s.ST, nb, Vp, vstride, c, alpha);
                }
            }
            if (by_values) values_to_lanes(n, s);

            if (it.nchunks == 1) {
                finish<MB>(it, s.OT, s.l, s);
            } else {
                float* part = parts + (chunk - it.cfirst) * stride;
                std::memcpy(part, s.m, sizeof(float) * LANES);
                std::memcpy(part + LANES, s.l, sizeof(float) * LANES);
                std::memcpy(part + 2 * LANES, s.OT, sizeof(float) * dv * LANES);
            }
        }
        if (it.nchunks > 1 && it.part < 0) {  // all of the tile's chunks ran here: merge them now
            merge_chunks<V, MB>(parts, it.nchunks, stride, dv, s.OT, s.l);
            finish<MB>(it, s.OT, s.l, s);
        }
    }

    template <int MB>
    void merge_item(const PagedItem& it, Scratch& s, const float* global_parts) const {
        merge_chunks<V, MB>(global_parts + it.part, it.nchunks, (2 + p.dv) * MB * W, p.dv, s.OT, s.l);
        finish<MB>(it, s.OT, s.l, s);
    }

    template <class F>
    static void with_mb(int mb, F&& f) {
        if constexpr (Shapes::kMaxMB >= 4) {
            if (mb == 4) return f(std::integral_constant<int, 4>{});
        }
        if constexpr (Shapes::kMaxMB >= 2) {
            if (mb == 2) return f(std::integral_constant<int, 2>{});
        }
        f(std::integral_constant<int, 1>{});
    }

    void run() {
        G = p.H / p.Hkv;
        part_stride_max = (2 + p.dv) * kMaxLanes;
        T* out = static_cast<T*>(p.out);
        const int64_t row_elems = p.H * p.dv;
        const int64_t first = p.query_start[0], last = p.query_start[p.num_seqs];
        std::memset(static_cast<void*>(out), 0, sizeof(T) * size_t(first * row_elems));  // rows of no sequence
        std::memset(static_cast<void*>(out + last * row_elems), 0, sizeof(T) * size_t((p.T - last) * row_elems));

        // Tiles: the widest MB each sequence can fill (queries of a (sequence, kv head) = its rows x G).
        int64_t tiles = 0, max_chunks = 1;
        double flops = 0.0;
        for (int64_t s = 0; s < p.num_seqs; ++s) {
            const int64_t L = p.query_start[s + 1] - p.query_start[s], S = p.seq_lens[s], M = L * G;
            if (L == 0) continue;
            const int mb = pick_mb(M);
            tiles += p.Hkv * ((M + lanes_of(mb) - 1) / lanes_of(mb));
            int64_t first, end;
            tile_chunks(0, L - 1, S, L, first, end);  // (the chunks of the widest tile, an upper bound)
            max_chunks = end - first > max_chunks ? end - first : max_chunks;
            double keys = double(S) - 0.5 * double(L - 1);  // per query, on average
            if (p.window > 0 && keys > double(p.window)) keys = double(p.window);
            flops += 2.0 * double(p.H) * double(L) * keys * double(p.d + p.dv);
        }
        if (tiles == 0) return;
        const int max_threads = team_size();
        const bool parallel = max_threads > 1 && flops > 4.0e5;
        const int threads = parallel ? max_threads : 1;
        // Few tiles (decode): share each tile's chunks among up to `spread` items.
        const int64_t spread = parallel && tiles < 4 * threads ? (4 * threads + tiles - 1) / tiles : 1;

        // Item list (seq order, the biggest tiles of a sequence first) and the shared partials' offsets.
        int64_t items = 0, global_floats = 0;
        for (int pass = 0; pass < 2; ++pass) {
            PagedItem* list = pass ? item_list : nullptr;
            int64_t k = 0, part = 0;
            for (int64_t s = 0; s < p.num_seqs; ++s) {
                const int64_t L = p.query_start[s + 1] - p.query_start[s], S = p.seq_lens[s], M = L * G;
                if (L == 0) continue;
                const int mb = pick_mb(M);
                const int64_t lanes = lanes_of(mb), ntiles = (M + lanes - 1) / lanes;
                for (int64_t t = ntiles - 1; t >= 0; --t) {
                    const int64_t f_last = (t * lanes + lanes < M ? t * lanes + lanes : M) - 1;
                    int64_t cfirst, cend;
                    tile_chunks(t * lanes / G, f_last / G, S, L, cfirst, cend);
                    const int64_t nchunks = cend - cfirst;
                    const int64_t groups = nchunks > 1 && spread > 1 ? (spread < nchunks ? spread : nchunks) : 1;
                    const int64_t per = (nchunks + groups - 1) / groups;
                    for (int64_t g = 0; g < p.Hkv; ++g) {
                        const int64_t tile_part = groups > 1 ? part : -1;
                        if (groups > 1) part += nchunks * (2 + p.dv) * lanes;
                        for (int64_t c0 = cfirst; c0 < cend; c0 += per, ++k) {
                            if (list)
                                list[k] = PagedItem{int32_t(s), int32_t(g), int32_t(t), mb, int32_t(c0),
                                                    int32_t(c0 + per < cend ? c0 + per : cend), int32_t(nchunks),
                                                    int32_t(cfirst), tile_part};
                        }
                    }
                }
            }
            if (!pass) {
                items = k, global_floats = part;
                // scratch slot 1: the item list, then the shared partials
                const int64_t item_floats = round16(items * int64_t(sizeof(PagedItem) / sizeof(float)));
                float* buf = scratch(1, item_floats + global_floats + 16);
                item_list = reinterpret_cast<PagedItem*>(buf);
                global_parts = buf + item_floats;
            }
        }
        local_chunks = spread > 1 ? 0 : max_chunks;  // without spread every tile merges its own chunks
        const int64_t per_thread = per_thread_floats();
        float* const base = scratch(0, per_thread * threads);
        PagedItem* const list = item_list;
        float* const gparts = global_parts;

        run_team(parallel, [&](Team& team) {
            Scratch s = carve(base + per_thread * team.member());
            for_each(team, items, [&](int64_t i) {
                with_mb(list[i].mb, [&](auto mb) { run_item<decltype(mb)::value>(list[i], s, gparts); });
            }, /*nowait=*/global_floats == 0);
            if (global_floats) {  // (after the barrier: every chunk of a shared tile is in)
                for_each(team, items, [&](int64_t i) {
                    if (list[i].part >= 0 && list[i].c0 == list[i].cfirst)  // one merge per shared tile
                        with_mb(list[i].mb, [&](auto mb) { merge_item<decltype(mb)::value>(list[i], s, gparts); });
                }, /*nowait=*/true);
            }
        });
    }

    // MB for a (sequence, kv head) with M queries: enough vectors for M, at most kMaxMB.
    static int pick_mb(int64_t M) {
        if (M <= W || Shapes::kMaxMB == 1) return 1;
        if (M <= 2 * W || Shapes::kMaxMB == 2) return 2;
        return 4;
    }

    PagedItem* item_list = nullptr;
    float* global_parts = nullptr;
};

template <class V, class Shapes, class T, class KV>
void paged_attention_typed(const PagedProblem& p) {
    Paged<V, Shapes, T, KV> paged{p, 0, 0, 0};
    paged.run();
}

// paged_attention of one build over the cache p.kv_format (or p.latent) names, q / out of element type T.
template <class V, class Shapes, class T>
void paged_attention_any_cache(const PagedProblem& p) {
    if (p.latent) return paged_attention_typed<V, Shapes, T, LatentKV<T>>(p);
    switch (p.kv_format) {
        case 0: paged_attention_typed<V, Shapes, T, PlainKV<T>>(p); break;
        case LLAISYS_KV_INT8: paged_attention_typed<V, Shapes, T, QuantKV<LLAISYS_KV_INT8>>(p); break;
        case LLAISYS_KV_FP8_E4M3: paged_attention_typed<V, Shapes, T, QuantKV<LLAISYS_KV_FP8_E4M3>>(p); break;
        default: break;  // (the entry point refuses other formats)
    }
}

}  // namespace llaisys::cpu::LLAISYS_ISA
