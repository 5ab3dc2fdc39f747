// self_attention: causal GQA attention with an online (streaming) softmax.
//
// The algorithm, shared by every SIMD path through the templates below:
//   * The queries of one kv head group (L rows x G = H/Hkv heads, flattened as f = row * G + head)
//     are cut into tiles of LANES = MB * W queries that live in the lanes of SIMD vectors
//     ("queries in lanes"). A tile packs its queries transposed and pre-scaled: QT[c][lane].
//   * The tile streams over its visible keys in blocks of BK keys. Per block:
//       ST[j][lane] = sum_c K[j][c] * QT[c][lane]      (broadcast K element x query vector, FMA)
//       causal mask (only on blocks that cross a row's last visible key): ST = -inf
//       online softmax per lane: running max m, running sum l, P = exp(ST - m_new),
//       OT[c][lane] = alpha * OT[c][lane] + sum_j V[j][c] * P[j][lane],  alpha = exp(m_old - m_new)
//     so every step is a vertical SIMD op: no horizontal reductions, no transposes of K or V,
//     and no L x S score matrix. Each K/V row is read once per tile (all query heads that share a
//     kv head are in the same tile); bf16/f16 K/V blocks are expanded to f32 once per tile and block.
//   * Work items are (kv head, tile, key split). When there are too few (decode), the keys are
//     split across threads (flash-decoding) and the partial (m, l, OT) are merged afterwards.
//   * With 1..4 queries per kv head (decode with MHA or small GQA ratios) most lanes would idle, so
//     attention_rows below puts the lanes along the head dim instead (dot products finished by a
//     transpose-add of W accumulators); same blocks, online softmax, splits and merge.
//   * kHf (LLAISYS_NUMERICS_HF, f16 / bf16): round where torch's CPU flash-attention kernel rounds, which
//     is what HF's default (sdpa) attention runs: the scale multiplies the f32 scores (it is not folded into
//     q), keys go in blocks of 512 counted from key 0 (kHfBlockKeys), and P = exp(s - m) is rounded to the
//     dtype before P V, with m the running max at the end of its 512-key block; the row sum l adds the
//     unrounded p. So that m is that running max, the keys are never split across threads in this mode.
//     Bit-exact against torch up to its exp (a ~20-bit approximation on whole vectors of 16 keys) and f32
//     summation order.
//
// The templates are over the vector type V (Vec8 or Vec16, see simd/simd.h) and the element type T; each
// build of self_attention.cpp picks the tile shapes for its registers.
#pragma once

#include <cstdint>
#include <cstring>

#include "../common/thread_pool.h"
#include "../simd/simd.h"

namespace llaisys::cpu::attn {

struct Problem {
    int64_t L, S, H, Hkv, d, dv;
    float scale;
    void* out;
    const void* q;
    const void* k;
    const void* v;
    // Sliding window (paged_attention's numerics=hf path; the self_attention op has none): the query at
    // position p = i + S - L sees only keys j > p - window. 0: no window. Key blocks wholly before a tile's
    // first query's window are skipped; the keys before a query's window are masked like those past its end.
    int64_t window = 0;
};


// Per calling thread, a cached buffer of at least `floats` floats (64-byte aligned); throws bad_alloc.
// Defined once (self_attention.cpp, portable build). Never call it inside a thread-team region.
float* scratch(int slot, int64_t floats);

}  // namespace llaisys::cpu::attn

// The attention of each build (dtype: LLAISYS_F32, _F16 or _BF16).
LLAISYS_DECLARE_PER_ISA(void self_attention(int dtype, bool hf, const attn::Problem& p))

namespace llaisys::cpu::LLAISYS_ISA {

using attn::Problem;
using attn::scratch;
constexpr int kBlockKeys = 64;
constexpr int kHfBlockKeys = 512;  // torch's CPU flash attention's key split size (kv_split_size)

// The first key the query at position `pos` sees under a window of `window` keys (0: none).
static inline int64_t window_start(int64_t pos, int64_t window) {
    return window > 0 && pos >= window ? pos - window + 1 : 0;
}

template <bool kHf>
constexpr int block_keys() { return kHf ? kHfBlockKeys : kBlockKeys; }

// Block scores as the mode wants them: with kHf the f32 dot products times the scale (q came unscaled).
template <class V, bool kHf>
static inline void scale_scores(float* ST, int64_t count, float scale) {
    if constexpr (kHf) {
        const V sv = V::set1(scale);
        for (int64_t x = 0; x < count; x += V::W) (V::load(ST + x) * sv).store(ST + x);
    }
}

// P as it enters P V: with kHf rounded to T (the row sum takes the unrounded p).
template <class T, bool kHf, class V>
static LLAISYS_ALWAYS_INLINE V weights_for_pv(V p) {
    if constexpr (kHf) return p.template round_to<T>();
    else return p;
}

#define LLAISYS_UNROLL _Pragma("GCC unroll 32")

// ST[r][lane] = sum_c K[r][c] * QT[c][lane] for KR keys.
template <class V, int MB, int KR>
static inline void qk_tile(const float* __restrict QT, const float* __restrict K, int64_t kstride, int64_t d,
                           float* __restrict ST) {
    constexpr int W = V::W, LANES = MB * W;
    V acc[KR][MB];
    LLAISYS_UNROLL for (int r = 0; r < KR; ++r)
        LLAISYS_UNROLL for (int b = 0; b < MB; ++b) acc[r][b] = V::zero();
    for (int64_t c = 0; c < d; ++c) {
        V qv[MB];
        LLAISYS_UNROLL for (int b = 0; b < MB; ++b) qv[b] = V::load(QT + c * LANES + b * W);
        LLAISYS_UNROLL for (int r = 0; r < KR; ++r) {
            V kv = V::broadcast(K + r * kstride + c);
            LLAISYS_UNROLL for (int b = 0; b < MB; ++b) acc[r][b] = fmadd(kv, qv[b], acc[r][b]);
        }
    }
    LLAISYS_UNROLL for (int r = 0; r < KR; ++r)
        LLAISYS_UNROLL for (int b = 0; b < MB; ++b) acc[r][b].store(ST + r * LANES + b * W);
}

// OT[c0 + r][lane] = alpha[lane] * OT[c0 + r][lane] + sum_j V[j][c0 + r] * P[j][lane] for R columns.
template <class V, int MB, int R>
static inline void pv_tile(float* __restrict OT, const float* __restrict P, int64_t nb,
                           const float* __restrict Vp, int64_t vstride, int64_t c0,
                           const V* alpha) {
    constexpr int W = V::W, LANES = MB * W;
    V acc[R][MB];
    LLAISYS_UNROLL for (int r = 0; r < R; ++r)
        LLAISYS_UNROLL for (int b = 0; b < MB; ++b)
            acc[r][b] = V::load(OT + (c0 + r) * LANES + b * W) * alpha[b];
    const float* vrow = Vp + c0;
    for (int64_t j = 0; j < nb; ++j, vrow += vstride) {
        V pv[MB];
        LLAISYS_UNROLL for (int b = 0; b < MB; ++b) pv[b] = V::load(P + j * LANES + b * W);
        LLAISYS_UNROLL for (int r = 0; r < R; ++r) {
            V x = V::broadcast(vrow + r);
            LLAISYS_UNROLL for (int b = 0; b < MB; ++b) acc[r][b] = fmadd(x, pv[b], acc[r][b]);
        }
    }
    LLAISYS_UNROLL for (int r = 0; r < R; ++r)
        LLAISYS_UNROLL for (int b = 0; b < MB; ++b) acc[r][b].store(OT + (c0 + r) * LANES + b * W);
}

// Keys [ks, ke) of split s of nsplit over the first kend keys, in whole blocks of BK keys.
template <int BK>
static inline void split_keys(int64_t kend, int64_t nsplit, int64_t s, int64_t& ks, int64_t& ke) {
    ks = 0, ke = kend;
    if (nsplit > 1) {
        const int64_t chunk = ((kend + nsplit - 1) / nsplit + BK - 1) / BK * BK;
        ks = s * chunk < kend ? s * chunk : kend;
        ke = ks + chunk < kend ? ks + chunk : kend;
    }
}

// K and V rows [kb, kb + nb) of kv head g as f32: read in place for f32, else widened into Kc / Vc.
template <class T>
static inline void kv_block(const T* k, const T* v, int64_t kb, int64_t nb, int64_t Hkv, int64_t g, int64_t d,
                            int64_t dv, float* Kc, float* Vc, const float*& Kp, int64_t& kstride,
                            const float*& Vp, int64_t& vstride) {
    if constexpr (sizeof(T) == 4) {
        Kp = reinterpret_cast<const float*>(k) + (kb * Hkv + g) * d, kstride = Hkv * d;
        Vp = reinterpret_cast<const float*>(v) + (kb * Hkv + g) * dv, vstride = Hkv * dv;
    } else {
        for (int64_t j = 0; j < nb; ++j) {
            convert(k + ((kb + j) * Hkv + g) * d, Kc + j * d, d);
            convert(v + ((kb + j) * Hkv + g) * dv, Vc + j * dv, dv);
        }
        Kp = Kc, kstride = d, Vp = Vc, vstride = dv;
    }
}

template <class V, int MB, int KR, int R, class T, bool kHf>
void attention(const Problem& p) {
    constexpr int W = V::W, LANES = MB * W, BK = block_keys<kHf>();
    constexpr bool kF32 = sizeof(T) == 4;
    const int64_t L = p.L, S = p.S, H = p.H, Hkv = p.Hkv, d = p.d, dv = p.dv;
    const int64_t G = H / Hkv, M = L * G, off = S - L;
    const int64_t ntiles = (M + LANES - 1) / LANES;
    const float scale = p.scale, qscale = kHf ? 1.0f : scale;
    const T* q = static_cast<const T*>(p.q);
    const T* k = static_cast<const T*>(p.k);
    const T* v = static_cast<const T*>(p.v);
    T* out = static_cast<T*>(p.out);

    // Threads only when the work pays for them; split the keys when (kv head, tile) pairs are few (never
    // with kHf: see the top).
    const double flops = 2.0 * double(H) * double(L) * (double(S) - 0.5 * double(L - 1)) * double(d + dv);
    const int max_threads = team_size();
    const bool parallel = max_threads > 1 && flops > 4.0e5;
    const int threads = parallel ? max_threads : 1;
    const int64_t base_items = Hkv * ntiles;
    int64_t nsplit = 1;
    if (!kHf && parallel && base_items < 4 * threads) {
        const int64_t by_keys = S / (4 * BK);  // at least 256 keys per split
        const int64_t wanted = (4 * threads + base_items - 1) / base_items;
        nsplit = wanted < by_keys ? wanted : by_keys;
        if (nsplit > BK) nsplit = BK;  // the merge keeps one weight row per split in ST
        if (nsplit < 1) nsplit = 1;
    }
    const int64_t items = base_items * nsplit;

    // Scratch per thread: QT, ST, OT, m, l, end, start, row, and (for f16/bf16) the f32 K and V blocks.
    const int64_t dmax = (d > dv ? d : dv) + 64;
    const int64_t sz_qt = d * LANES, sz_st = int64_t(BK) * LANES, sz_ot = dv * LANES;
    const int64_t sz_kc = kF32 ? 0 : int64_t(BK) * d, sz_vc = kF32 ? 0 : int64_t(BK) * dv;
    auto round16 = [](int64_t n) { return (n + 15) & ~int64_t(15); };
    const int64_t per_thread = round16(sz_qt) + round16(sz_st) + round16(sz_ot) + 4 * round16(LANES) +
                               round16(dmax) + round16(sz_kc) + round16(sz_vc);
    const int64_t part_stride = (2 + dv) * LANES;  // m, l, OT of one (kv head, tile, split)
    const int64_t part_floats = nsplit > 1 ? items * part_stride : 0;
    float* const base = scratch(0, per_thread * threads + part_floats);
    float* const partial = base + per_thread * threads;
    const V neg_inf = V::set1(-__builtin_inff());

    run_team(parallel, [&](Team& team) {
        float* sc = base + per_thread * team.member();
        float* QT = sc; sc += round16(sz_qt);
        float* ST = sc; sc += round16(sz_st);
        float* OT = sc; sc += round16(sz_ot);
        float* mrun = sc; sc += round16(LANES);
        float* lrun = sc; sc += round16(LANES);
        float* endv = sc; sc += round16(LANES);
        float* startv = sc; sc += round16(LANES);
        float* row = sc; sc += round16(dmax);
        float* Kc = sc; sc += round16(sz_kc);
        float* Vc = sc;

        // out row of query f (flat index within group g) = OT[.][lane] / l[lane]
        auto finish = [&](int64_t g, int64_t f0, int64_t n, const float* ot, const float* l) {
            for (int64_t lane = 0; lane < n; ++lane) {
                const int64_t f = f0 + lane, i = f / G, h = g * G + f % G;
                const float inv = 1.0f / l[lane];
                for (int64_t c = 0; c < dv; ++c) row[c] = ot[c * LANES + lane] * inv;
                convert(row, out + (i * H + h) * dv, dv);
            }
        };

        for_each(team, items, [&](int64_t item) {
            // biggest (last) tiles first: they have the most keys under the causal mask
            const int64_t t = ntiles - 1 - item / (Hkv * nsplit);
            const int64_t g = (item / nsplit) % Hkv, s = item % nsplit;
            const int64_t f0 = t * LANES, n = (M - f0) < LANES ? (M - f0) : LANES;

            for (int64_t lane = 0; lane < LANES; ++lane) {
                if (lane < n) {
                    const int64_t f = f0 + lane, i = f / G, h = g * G + f % G;
                    convert(q + (i * H + h) * d, row, d);
                    for (int64_t c = 0; c < d; ++c) QT[c * LANES + lane] = row[c] * qscale;
                    endv[lane] = float(i + off + 1);
                    startv[lane] = float(window_start(i + off, p.window));
                } else {
                    for (int64_t c = 0; c < d; ++c) QT[c * LANES + lane] = 0.0f;
                    endv[lane] = float(S);
                    startv[lane] = 0.0f;
                }
                mrun[lane] = -__builtin_inff();
                lrun[lane] = 0.0f;
            }
            for (int64_t x = 0; x < sz_ot; ++x) OT[x] = 0.0f;

            const int64_t kend = (f0 + n - 1) / G + off + 1;  // keys visible to the tile's last row
            const int64_t min_end = f0 / G + off + 1;         // keys visible to its first row
            const int64_t kfirst = window_start(f0 / G + off, p.window) / BK * BK;  // its first row's first block
            const int64_t max_start = window_start((f0 + n - 1) / G + off, p.window);  // its last row's first key
            int64_t ks, ke;
            split_keys<BK>(kend, nsplit, s, ks, ke);
            if (ks < kfirst) ks = kfirst < ke ? kfirst : ke;

            for (int64_t kb = ks; kb < ke; kb += BK) {
                const int64_t nb = ke - kb < BK ? ke - kb : BK;
                const float *Kp, *Vp;
                int64_t kstride, vstride;
                kv_block(k, v, kb, nb, Hkv, g, d, dv, Kc, Vc, Kp, kstride, Vp, vstride);

                // scores
                int64_t j = 0;
                for (; j + KR <= nb; j += KR) qk_tile<V, MB, KR>(QT, Kp + j * kstride, kstride, d, ST + j * LANES);
                for (; j < nb; ++j) qk_tile<V, MB, 1>(QT, Kp + j * kstride, kstride, d, ST + j * LANES);
                scale_scores<V, kHf>(ST, nb * LANES, scale);

                // causal mask where the block crosses some row's end
                if (kb + nb > min_end) {
                    for (int b = 0; b < MB; ++b) {
                        const V e = V::load(endv + b * W);
                        for (int64_t jj = 0; jj < nb; ++jj) {
                            float* sp = ST + jj * LANES + b * W;
                            select(lt_mask(V::set1(float(kb + jj)), e), V::load(sp), neg_inf).store(sp);
                        }
                    }
                }
                // window mask where the block crosses some row's start
                if (kb < max_start) {
                    for (int b = 0; b < MB; ++b) {
                        const V st = V::load(startv + b * W);
                        for (int64_t jj = 0; jj < nb; ++jj) {
                            float* sp = ST + jj * LANES + b * W;
                            select(lt_mask(V::set1(float(kb + jj)), st), neg_inf, V::load(sp)).store(sp);
                        }
                    }
                }

                // online softmax
                V alpha[MB];
                for (int b = 0; b < MB; ++b) {
                    V bmax = neg_inf;
                    for (int64_t jj = 0; jj < nb; ++jj) bmax = vmax(bmax, V::load(ST + jj * LANES + b * W));
                    const V mold = V::load(mrun + b * W);
                    const V mnew = vmax(mold, bmax);
                    // a lane that has seen no key yet keeps m = -inf; subtract 0 instead (no inf - inf)
                    const V msafe = select(lt_mask(mnew, V::set1(-3.0e38f)), V::zero(), mnew);
                    alpha[b] = vexp(mold - msafe);
                    V sum = V::zero();
                    for (int64_t jj = 0; jj < nb; ++jj) {
                        float* sp = ST + jj * LANES + b * W;
                        const V e = vexp(V::load(sp) - msafe);
                        weights_for_pv<T, kHf>(e).store(sp);
                        sum = sum + e;
                    }
                    fmadd(V::load(lrun + b * W), alpha[b], sum).store(lrun + b * W);
                    mnew.store(mrun + b * W);
                }

                // OT = alpha * OT + P^T V
                int64_t c = 0;
                for (; c + R <= dv; c += R) pv_tile<V, MB, R>(OT, ST, nb, Vp, vstride, c, alpha);
                for (; c + 4 <= dv; c += 4) pv_tile<V, MB, 4>(OT, ST, nb, Vp, vstride, c, alpha);
                for (; c < dv; ++c) pv_tile<V, MB, 1>(OT, ST, nb, Vp, vstride, c, alpha);
            }

            if (nsplit == 1) {
                finish(g, f0, n, OT, lrun);
            } else {
                float* part = partial + ((g * ntiles + t) * nsplit + s) * part_stride;
                std::memcpy(part, mrun, sizeof(float) * LANES);
                std::memcpy(part + LANES, lrun, sizeof(float) * LANES);
                std::memcpy(part + 2 * LANES, OT, sizeof(float) * sz_ot);
            }
        }, /*nowait=*/nsplit == 1);

        if (nsplit > 1) {
            // merge the key splits: M = max m_s, w_s = exp(m_s - M), out = sum w_s OT_s / sum w_s l_s
            for_each(team, Hkv * ntiles, [&](int64_t gt) {
                const int64_t g = gt / ntiles, t = gt % ntiles;
                const int64_t f0 = t * LANES, n = (M - f0) < LANES ? (M - f0) : LANES;
                const float* parts = partial + gt * nsplit * part_stride;
                for (int b = 0; b < MB; ++b) {
                    V mmax = neg_inf;
                    for (int64_t s = 0; s < nsplit; ++s) mmax = vmax(mmax, V::load(parts + s * part_stride + b * W));
                    V l = V::zero();
                    for (int64_t s = 0; s < nsplit; ++s) {
                        const float* part = parts + s * part_stride;
                        const V w = vexp(V::load(part + b * W) - mmax);
                        w.store(ST + s * LANES + b * W);  // weight of split s
                        l = fmadd(w, V::load(part + LANES + b * W), l);
                    }
                    l.store(lrun + b * W);
                }
                for (int64_t c = 0; c < dv; ++c) {
                    for (int b = 0; b < MB; ++b) {
                        V acc = V::zero();
                        for (int64_t s = 0; s < nsplit; ++s)
                            acc = fmadd(V::load(ST + s * LANES + b * W),
                                        V::load(parts + s * part_stride + 2 * LANES + c * LANES + b * W), acc);
                        acc.store(OT + c * LANES + b * W);
                    }
                }
                finish(g, f0, n, OT, lrun);
            }, /*nowait=*/true);
        }
    });
}


// ---------------------------------------------------------------------------------------------------
// Row form, for few queries per kv head (decode): lanes run along the head dim instead of across
// queries, so no lane idles when a kv head has 1..8 queries. Needs d % W == 0 and dv % W == 0.
//   scores of W keys for one query: W accumulators over d, then reduce_add_each (transpose-add) -> one vector
//   softmax over the keys of a block (vectors of W keys), O[a] = alpha * O[a] + sum_j p[a][j] V[j]
// Work items are (kv head, key split); each K/V row is read (and converted) once per item.

// ST[j] = q . K[j] for W keys (rows beyond `count` point at a zero row).
template <class V>
static inline void qk_row(const float* __restrict qrow, const float* const* krows, int64_t d, float* __restrict ST) {
    constexpr int W = V::W;
    V acc[W];
    LLAISYS_UNROLL for (int r = 0; r < W; ++r) acc[r] = V::zero();
    for (int64_t c = 0; c < d; c += W) {
        const V qv = V::load(qrow + c);
        LLAISYS_UNROLL for (int r = 0; r < W; ++r) acc[r] = fmadd(qv, V::load(krows[r] + c), acc[r]);
    }
    (reduce_add_each(acc)).store(ST);
}

// O[c0 .. c0 + CR*W) = alpha * O + sum_j p[j] V[j][c0 ..]
template <class V, int CR>
static inline void pv_row(float* __restrict O, const float* __restrict P, int64_t nb, const float* __restrict Vp,
                          int64_t vstride, int64_t c0, float alpha) {
    constexpr int W = V::W;
    V acc[CR];
    const V a = V::set1(alpha);
    LLAISYS_UNROLL for (int r = 0; r < CR; ++r) acc[r] = V::load(O + c0 + r * W) * a;
    const float* vrow = Vp + c0;
    for (int64_t j = 0; j < nb; ++j, vrow += vstride) {
        const V pj = V::broadcast(P + j);
        LLAISYS_UNROLL for (int r = 0; r < CR; ++r) acc[r] = fmadd(pj, V::load(vrow + r * W), acc[r]);
    }
    LLAISYS_UNROLL for (int r = 0; r < CR; ++r) acc[r].store(O + c0 + r * W);
}

template <class V>
static inline float vexp1(float x) { return lane0(vexp(V::set1(x))); }

// Few queries per kv head: M = L * H / Hkv <= MQ.
template <class V, int MQ, class T, bool kHf>
void attention_rows(const Problem& p) {
    constexpr int W = V::W, BK = block_keys<kHf>();
    static_assert(BK % W == 0, "a block holds whole vectors of keys");
    constexpr bool kF32 = sizeof(T) == 4;
    const int64_t L = p.L, S = p.S, H = p.H, Hkv = p.Hkv, d = p.d, dv = p.dv;
    const int64_t G = H / Hkv, M = L * G, off = S - L;
    const float scale = p.scale, qscale = kHf ? 1.0f : scale;
    const T* q = static_cast<const T*>(p.q);
    const T* k = static_cast<const T*>(p.k);
    const T* v = static_cast<const T*>(p.v);
    T* out = static_cast<T*>(p.out);

    const double flops = 2.0 * double(H) * double(L) * (double(S) - 0.5 * double(L - 1)) * double(d + dv);
    const int max_threads = team_size();
    const bool parallel = max_threads > 1 && flops > 4.0e5;
    const int threads = parallel ? max_threads : 1;
    int64_t nsplit = 1;
    if (!kHf && parallel && Hkv < 4 * threads) {
        const int64_t by_keys = S / (4 * BK);  // at least 256 keys per split
        const int64_t wanted = (4 * threads + Hkv - 1) / Hkv;
        nsplit = wanted < by_keys ? wanted : by_keys;
        if (nsplit < 1) nsplit = 1;
    }
    const int64_t items = Hkv * nsplit;

    auto round16 = [](int64_t n) { return (n + 15) & ~int64_t(15); };
    const int64_t dmax = (d > dv ? d : dv) + 64;
    const int64_t sz_kc = kF32 ? 0 : int64_t(BK) * d, sz_vc = kF32 ? 0 : int64_t(BK) * dv;
    const int64_t per_thread = round16(MQ * d) + round16(MQ * BK) + round16(MQ * dv) + 2 * round16(MQ) +
                               2 * round16(2 * MQ) +
                               round16(dmax) + round16(d) + round16(sz_kc) + round16(sz_vc);
    const int64_t part_stride = (2 + dv) * MQ;
    const int64_t part_floats = nsplit > 1 ? items * part_stride : 0;
    float* const base = scratch(0, per_thread * threads + part_floats);
    float* const partial = base + per_thread * threads;

    run_team(parallel, [&](Team& team) {
        float* sc = base + per_thread * team.member();
        float* Q = sc; sc += round16(MQ * d);
        float* ST = sc; sc += round16(MQ * BK);
        float* O = sc; sc += round16(MQ * dv);
        float* mrun = sc; sc += round16(MQ);
        float* lrun = sc; sc += round16(MQ);
        int64_t* endq = reinterpret_cast<int64_t*>(sc); sc += round16(2 * MQ);  // MQ int64
        int64_t* startq = reinterpret_cast<int64_t*>(sc); sc += round16(2 * MQ);  // MQ int64
        float* row = sc; sc += round16(dmax);
        float* zero_row = sc; sc += round16(d);
        float* Kc = sc; sc += round16(sz_kc);
        float* Vc = sc;
        for (int64_t c = 0; c < d; ++c) zero_row[c] = 0.0f;

        auto finish = [&](int64_t g, const float* o, const float* l) {
            for (int64_t a = 0; a < M; ++a) {
                const int64_t i = a / G, h = g * G + a % G;
                const float inv = 1.0f / l[a];
                for (int64_t c = 0; c < dv; ++c) row[c] = o[a * dv + c] * inv;
                convert(row, out + (i * H + h) * dv, dv);
            }
        };

        for_each(team, items, [&](int64_t item) {
            const int64_t g = item / nsplit, s = item % nsplit;
            for (int64_t a = 0; a < M; ++a) {
                const int64_t i = a / G, h = g * G + a % G;
                convert(q + (i * H + h) * d, row, d);
                for (int64_t c = 0; c < d; ++c) Q[a * d + c] = row[c] * qscale;
                endq[a] = i + off + 1;
                startq[a] = window_start(i + off, p.window);
                mrun[a] = -__builtin_inff();
                lrun[a] = 0.0f;
            }
            for (int64_t x = 0; x < M * dv; ++x) O[x] = 0.0f;
            const int64_t kend = endq[M - 1], kfirst = startq[0] / BK * BK;
            int64_t ks, ke;
            split_keys<BK>(kend, nsplit, s, ks, ke);
            if (ks < kfirst) ks = kfirst < ke ? kfirst : ke;

            for (int64_t kb = ks; kb < ke; kb += BK) {
                const int64_t nb = ke - kb < BK ? ke - kb : BK;
                const float *Kp, *Vp;
                int64_t kstride, vstride;
                kv_block(k, v, kb, nb, Hkv, g, d, dv, Kc, Vc, Kp, kstride, Vp, vstride);
                const int64_t nbp = (nb + W - 1) / W * W;
                const float* krows[BK];
                for (int64_t j = 0; j < nbp; ++j) krows[j] = j < nb ? Kp + j * kstride : zero_row;

                for (int64_t a = 0; a < M; ++a) {
                    float* st = ST + a * BK;
                    for (int64_t j = 0; j < nbp; j += W) qk_row<V>(Q + a * d, krows + j, d, st + j);
                    scale_scores<V, kHf>(st, nbp, scale);
                    int64_t valid = endq[a] - kb, before = startq[a] - kb;
                    valid = valid < 0 ? 0 : (valid > nb ? nb : valid);
                    before = before < 0 ? 0 : (before > valid ? valid : before);
                    for (int64_t j = valid; j < nbp; ++j) st[j] = -__builtin_inff();
                    for (int64_t j = 0; j < before; ++j) st[j] = -__builtin_inff();  // before the window

                    V bmax = V::set1(-__builtin_inff());
                    for (int64_t j = 0; j < nbp; j += W) bmax = vmax(bmax, V::load(st + j));
                    float tmp[W];
                    bmax.store(tmp);
                    float mb = tmp[0];
                    for (int x = 1; x < W; ++x) mb = tmp[x] > mb ? tmp[x] : mb;
                    const float mold = mrun[a], mnew = mold > mb ? mold : mb;
                    const float msafe = mnew == -__builtin_inff() ? 0.0f : mnew;
                    const float alpha = vexp1<V>(mold - msafe);
                    const V mv = V::set1(msafe);
                    V sum = V::zero();
                    for (int64_t j = 0; j < nbp; j += W) {
                        const V e = vexp(V::load(st + j) - mv);
                        weights_for_pv<T, kHf>(e).store(st + j);
                        sum = sum + e;
                    }
                    sum.store(tmp);
                    float total = 0.0f;
                    for (int x = 0; x < W; ++x) total += tmp[x];
                    lrun[a] = lrun[a] * alpha + total;
                    mrun[a] = mnew;

                    float* o = O + a * dv;
                    int64_t c = 0;
                    for (; c + 8 * W <= dv; c += 8 * W) pv_row<V, 8>(o, st, valid, Vp, vstride, c, alpha);
                    for (; c + 4 * W <= dv; c += 4 * W) pv_row<V, 4>(o, st, valid, Vp, vstride, c, alpha);
                    for (; c < dv; c += W) pv_row<V, 1>(o, st, valid, Vp, vstride, c, alpha);
                }
            }

            if (nsplit == 1) {
                finish(g, O, lrun);
            } else {
                float* part = partial + item * part_stride;
                std::memcpy(part, mrun, sizeof(float) * M);
                std::memcpy(part + MQ, lrun, sizeof(float) * M);
                std::memcpy(part + 2 * MQ, O, sizeof(float) * M * dv);
            }
        }, /*nowait=*/nsplit == 1);

        if (nsplit > 1) {
            for_each(team, Hkv, [&](int64_t g) {
                const float* parts = partial + g * nsplit * part_stride;
                for (int64_t a = 0; a < M; ++a) {
                    float mmax = -__builtin_inff();
                    for (int64_t s = 0; s < nsplit; ++s) {
                        const float m = parts[s * part_stride + a];
                        mmax = m > mmax ? m : mmax;
                    }
                    float l = 0.0f;
                    float* o = O + a * dv;
                    for (int64_t c = 0; c < dv; ++c) o[c] = 0.0f;
                    for (int64_t s = 0; s < nsplit; ++s) {
                        const float* part = parts + s * part_stride;
                        const float w = vexp1<V>(part[a] - mmax);
                        l += w * part[MQ + a];
                        const float* po = part + 2 * MQ + a * dv;
                        const V wv = V::set1(w);
                        for (int64_t c = 0; c < dv; c += W) fmadd(wv, V::load(po + c), V::load(o + c)).store(o + c);
                    }
                    lrun[a] = l;
                }
                finish(g, O, lrun);
            }, /*nowait=*/true);
        }
    });
}

}  // namespace llaisys::cpu::LLAISYS_ISA
