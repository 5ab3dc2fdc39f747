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
//
// ODR note: this header is compiled into TUs with different -m flags. Every function here is a
// template over the per-TU traits types, which live in anonymous namespaces, so each TU gets its
// own internal-linkage instantiations. Do not call non-template inline functions (dtype.h, std::
// containers) from here: a COMDAT copy built with AVX-512 could be picked by the linker for the
// baseline path.
#pragma once

#include <cstdint>
#include <cstring>
#include <omp.h>

namespace llaisys::cpu::attn {

struct Problem {
    int64_t L, S, H, Hkv, d, dv;
    float scale;
    void* out;
    const void* q;
    const void* k;
    const void* v;
};

// Per calling thread, a cached buffer of at least `floats` floats (64-byte aligned); throws bad_alloc.
// Defined in self_attention.cpp (baseline code). Never call it inside an OpenMP region.
float* scratch(int slot, int64_t floats);

// ISA entry points (dtype: 0 f32, 1 f16, 2 bf16).
void run_portable(int dtype, const Problem& p);
void run_avx2(int dtype, const Problem& p);
void run_avx512(int dtype, const Problem& p);

constexpr int kBlockKeys = 64;

#define LLAISYS_UNROLL _Pragma("GCC unroll 32")

// exp(x) for a vector, Cephes-style (about 1 ulp): exact 0 below -87 (so exp(-inf) == 0).
template <class V>
static inline typename V::vec vexp(typename V::vec x) {
    using vec = typename V::vec;
    const vec hi = V::set1(88.3762626647949f), lo = V::set1(-87.0f);
    vec xc = V::max(lo, V::min(hi, x));  // operand order lets NaN through (x86 min/max return the 2nd)
    vec n = V::round(V::mul(xc, V::set1(1.44269504088896341f)));
    vec r = V::fma(n, V::set1(-0.693359375f), xc);
    r = V::fma(n, V::set1(2.12194440e-4f), r);
    vec p = V::set1(1.9875691500e-4f);
    p = V::fma(p, r, V::set1(1.3981999507e-3f));
    p = V::fma(p, r, V::set1(8.3334519073e-3f));
    p = V::fma(p, r, V::set1(4.1665795894e-2f));
    p = V::fma(p, r, V::set1(1.6666665459e-1f));
    p = V::fma(p, r, V::set1(5.0000001201e-1f));
    vec y = V::fma(V::mul(p, r), r, V::add(r, V::set1(1.0f)));
    y = V::mul(y, V::pow2(n));
    return V::select_lt(x, lo, V::zero(), y);
}

// ST[r][lane] = sum_c K[r][c] * QT[c][lane] for KR keys.
template <class V, int MB, int KR>
static inline void qk_tile(const float* __restrict QT, const float* __restrict K, int64_t kstride, int64_t d,
                           float* __restrict ST) {
    using vec = typename V::vec;
    constexpr int W = V::W, LANES = MB * W;
    vec acc[KR][MB];
    LLAISYS_UNROLL for (int r = 0; r < KR; ++r)
        LLAISYS_UNROLL for (int b = 0; b < MB; ++b) acc[r][b] = V::zero();
    for (int64_t c = 0; c < d; ++c) {
        vec qv[MB];
        LLAISYS_UNROLL for (int b = 0; b < MB; ++b) qv[b] = V::load(QT + c * LANES + b * W);
        LLAISYS_UNROLL for (int r = 0; r < KR; ++r) {
            vec kv = V::bcast(K + r * kstride + c);
            LLAISYS_UNROLL for (int b = 0; b < MB; ++b) acc[r][b] = V::fma(kv, qv[b], acc[r][b]);
        }
    }
    LLAISYS_UNROLL for (int r = 0; r < KR; ++r)
        LLAISYS_UNROLL for (int b = 0; b < MB; ++b) V::store(ST + r * LANES + b * W, acc[r][b]);
}

// OT[c0 + r][lane] = alpha[lane] * OT[c0 + r][lane] + sum_j V[j][c0 + r] * P[j][lane] for R columns.
template <class V, int MB, int R>
static inline void pv_tile(float* __restrict OT, const float* __restrict P, int64_t nb,
                           const float* __restrict Vp, int64_t vstride, int64_t c0,
                           const typename V::vec* alpha) {
    using vec = typename V::vec;
    constexpr int W = V::W, LANES = MB * W;
    vec acc[R][MB];
    LLAISYS_UNROLL for (int r = 0; r < R; ++r)
        LLAISYS_UNROLL for (int b = 0; b < MB; ++b)
            acc[r][b] = V::mul(V::load(OT + (c0 + r) * LANES + b * W), alpha[b]);
    const float* vrow = Vp + c0;
    for (int64_t j = 0; j < nb; ++j, vrow += vstride) {
        vec pv[MB];
        LLAISYS_UNROLL for (int b = 0; b < MB; ++b) pv[b] = V::load(P + j * LANES + b * W);
        LLAISYS_UNROLL for (int r = 0; r < R; ++r) {
            vec x = V::bcast(vrow + r);
            LLAISYS_UNROLL for (int b = 0; b < MB; ++b) acc[r][b] = V::fma(x, pv[b], acc[r][b]);
        }
    }
    LLAISYS_UNROLL for (int r = 0; r < R; ++r)
        LLAISYS_UNROLL for (int b = 0; b < MB; ++b) V::store(OT + (c0 + r) * LANES + b * W, acc[r][b]);
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
template <class Cvt, class T>
static inline void kv_block(const T* k, const T* v, int64_t kb, int64_t nb, int64_t Hkv, int64_t g, int64_t d,
                            int64_t dv, float* Kc, float* Vc, const float*& Kp, int64_t& kstride,
                            const float*& Vp, int64_t& vstride) {
    if constexpr (sizeof(T) == 4) {
        Kp = reinterpret_cast<const float*>(k) + (kb * Hkv + g) * d, kstride = Hkv * d;
        Vp = reinterpret_cast<const float*>(v) + (kb * Hkv + g) * dv, vstride = Hkv * dv;
    } else {
        for (int64_t j = 0; j < nb; ++j) {
            Cvt::load_row(k + ((kb + j) * Hkv + g) * d, Kc + j * d, d);
            Cvt::load_row(v + ((kb + j) * Hkv + g) * dv, Vc + j * dv, dv);
        }
        Kp = Kc, kstride = d, Vp = Vc, vstride = dv;
    }
}

// Cvt: load_row(const T*, float*, n) and store_row(const float*, T*, n) for the element type T.
template <class V, int MB, int KR, int R, class Cvt, class T>
void attention(const Problem& p) {
    using vec = typename V::vec;
    constexpr int W = V::W, LANES = MB * W, BK = kBlockKeys;
    constexpr bool kF32 = sizeof(T) == 4;
    const int64_t L = p.L, S = p.S, H = p.H, Hkv = p.Hkv, d = p.d, dv = p.dv;
    const int64_t G = H / Hkv, M = L * G, off = S - L;
    const int64_t ntiles = (M + LANES - 1) / LANES;
    const float scale = p.scale;
    const T* q = static_cast<const T*>(p.q);
    const T* k = static_cast<const T*>(p.k);
    const T* v = static_cast<const T*>(p.v);
    T* out = static_cast<T*>(p.out);

    // Threads only when the work pays for them; split the keys when (kv head, tile) pairs are few.
    const double flops = 2.0 * double(H) * double(L) * (double(S) - 0.5 * double(L - 1)) * double(d + dv);
    const int max_threads = omp_get_max_threads();
    const bool parallel = max_threads > 1 && flops > 4.0e5;
    const int threads = parallel ? max_threads : 1;
    const int64_t base_items = Hkv * ntiles;
    int64_t nsplit = 1;
    if (parallel && base_items < 4 * threads) {
        const int64_t by_keys = S / (4 * BK);  // at least 256 keys per split
        const int64_t wanted = (4 * threads + base_items - 1) / base_items;
        nsplit = wanted < by_keys ? wanted : by_keys;
        if (nsplit > BK) nsplit = BK;  // the merge keeps one weight row per split in ST
        if (nsplit < 1) nsplit = 1;
    }
    const int64_t items = base_items * nsplit;

    // Scratch per thread: QT, ST, OT, m, l, end, row, and (for f16/bf16) the f32 K and V blocks.
    const int64_t dmax = (d > dv ? d : dv) + 64;
    const int64_t sz_qt = d * LANES, sz_st = int64_t(BK) * LANES, sz_ot = dv * LANES;
    const int64_t sz_kc = kF32 ? 0 : int64_t(BK) * d, sz_vc = kF32 ? 0 : int64_t(BK) * dv;
    auto round16 = [](int64_t n) { return (n + 15) & ~int64_t(15); };
    const int64_t per_thread = round16(sz_qt) + round16(sz_st) + round16(sz_ot) + 3 * round16(LANES) +
                               round16(dmax) + round16(sz_kc) + round16(sz_vc);
    const int64_t part_stride = (2 + dv) * LANES;  // m, l, OT of one (kv head, tile, split)
    const int64_t part_floats = nsplit > 1 ? items * part_stride : 0;
    float* const base = scratch(0, per_thread * threads + part_floats);
    float* const partial = base + per_thread * threads;
    const vec neg_inf = V::set1(-__builtin_inff());

#pragma omp parallel num_threads(threads) if (parallel)
    {
        float* sc = base + per_thread * omp_get_thread_num();
        float* QT = sc; sc += round16(sz_qt);
        float* ST = sc; sc += round16(sz_st);
        float* OT = sc; sc += round16(sz_ot);
        float* mrun = sc; sc += round16(LANES);
        float* lrun = sc; sc += round16(LANES);
        float* endv = sc; sc += round16(LANES);
        float* row = sc; sc += round16(dmax);
        float* Kc = sc; sc += round16(sz_kc);
        float* Vc = sc;

        // out row of query f (flat index within group g) = OT[.][lane] / l[lane]
        auto finish = [&](int64_t g, int64_t f0, int64_t n, const float* ot, const float* l) {
            for (int64_t lane = 0; lane < n; ++lane) {
                const int64_t f = f0 + lane, i = f / G, h = g * G + f % G;
                const float inv = 1.0f / l[lane];
                for (int64_t c = 0; c < dv; ++c) row[c] = ot[c * LANES + lane] * inv;
                Cvt::store_row(row, out + (i * H + h) * dv, dv);
            }
        };

#pragma omp for schedule(dynamic, 1)
        for (int64_t item = 0; item < items; ++item) {
            // biggest (last) tiles first: they have the most keys under the causal mask
            const int64_t t = ntiles - 1 - item / (Hkv * nsplit);
            const int64_t g = (item / nsplit) % Hkv, s = item % nsplit;
            const int64_t f0 = t * LANES, n = (M - f0) < LANES ? (M - f0) : LANES;

            for (int64_t lane = 0; lane < LANES; ++lane) {
                if (lane < n) {
                    const int64_t f = f0 + lane, i = f / G, h = g * G + f % G;
                    Cvt::load_row(q + (i * H + h) * d, row, d);
                    for (int64_t c = 0; c < d; ++c) QT[c * LANES + lane] = row[c] * scale;
                    endv[lane] = float(i + off + 1);
                } else {
                    for (int64_t c = 0; c < d; ++c) QT[c * LANES + lane] = 0.0f;
                    endv[lane] = float(S);
                }
                mrun[lane] = -__builtin_inff();
                lrun[lane] = 0.0f;
            }
            for (int64_t x = 0; x < sz_ot; ++x) OT[x] = 0.0f;

            const int64_t kend = (f0 + n - 1) / G + off + 1;  // keys visible to the tile's last row
            const int64_t min_end = f0 / G + off + 1;         // keys visible to its first row
            int64_t ks, ke;
            split_keys<BK>(kend, nsplit, s, ks, ke);

            for (int64_t kb = ks; kb < ke; kb += BK) {
                const int64_t nb = ke - kb < BK ? ke - kb : BK;
                const float *Kp, *Vp;
                int64_t kstride, vstride;
                kv_block<Cvt>(k, v, kb, nb, Hkv, g, d, dv, Kc, Vc, Kp, kstride, Vp, vstride);

                // scores
                int64_t j = 0;
                for (; j + KR <= nb; j += KR) qk_tile<V, MB, KR>(QT, Kp + j * kstride, kstride, d, ST + j * LANES);
                for (; j < nb; ++j) qk_tile<V, MB, 1>(QT, Kp + j * kstride, kstride, d, ST + j * LANES);

                // causal mask where the block crosses some row's end
                if (kb + nb > min_end) {
                    for (int b = 0; b < MB; ++b) {
                        const vec e = V::load(endv + b * W);
                        for (int64_t jj = 0; jj < nb; ++jj) {
                            float* sp = ST + jj * LANES + b * W;
                            V::store(sp, V::select_lt(V::set1(float(kb + jj)), e, V::load(sp), neg_inf));
                        }
                    }
                }

                // online softmax
                vec alpha[MB];
                for (int b = 0; b < MB; ++b) {
                    vec bmax = neg_inf;
                    for (int64_t jj = 0; jj < nb; ++jj) bmax = V::max(bmax, V::load(ST + jj * LANES + b * W));
                    const vec mold = V::load(mrun + b * W);
                    const vec mnew = V::max(mold, bmax);
                    // a lane that has seen no key yet keeps m = -inf; subtract 0 instead (no inf - inf)
                    const vec msafe = V::select_lt(mnew, V::set1(-3.0e38f), V::zero(), mnew);
                    alpha[b] = vexp<V>(V::sub(mold, msafe));
                    vec sum = V::zero();
                    for (int64_t jj = 0; jj < nb; ++jj) {
                        float* sp = ST + jj * LANES + b * W;
                        const vec e = vexp<V>(V::sub(V::load(sp), msafe));
                        V::store(sp, e);
                        sum = V::add(sum, e);
                    }
                    V::store(lrun + b * W, V::fma(V::load(lrun + b * W), alpha[b], sum));
                    V::store(mrun + b * W, mnew);
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
        }

        if (nsplit > 1) {
            // merge the key splits: M = max m_s, w_s = exp(m_s - M), out = sum w_s OT_s / sum w_s l_s
#pragma omp for schedule(static)
            for (int64_t gt = 0; gt < Hkv * ntiles; ++gt) {
                const int64_t g = gt / ntiles, t = gt % ntiles;
                const int64_t f0 = t * LANES, n = (M - f0) < LANES ? (M - f0) : LANES;
                const float* parts = partial + gt * nsplit * part_stride;
                for (int b = 0; b < MB; ++b) {
                    vec mmax = neg_inf;
                    for (int64_t s = 0; s < nsplit; ++s) mmax = V::max(mmax, V::load(parts + s * part_stride + b * W));
                    vec l = V::zero();
                    for (int64_t s = 0; s < nsplit; ++s) {
                        const float* part = parts + s * part_stride;
                        const vec w = vexp<V>(V::sub(V::load(part + b * W), mmax));
                        V::store(ST + s * LANES + b * W, w);  // weight of split s
                        l = V::fma(w, V::load(part + LANES + b * W), l);
                    }
                    V::store(lrun + b * W, l);
                }
                for (int64_t c = 0; c < dv; ++c) {
                    for (int b = 0; b < MB; ++b) {
                        vec acc = V::zero();
                        for (int64_t s = 0; s < nsplit; ++s)
                            acc = V::fma(V::load(ST + s * LANES + b * W),
                                         V::load(parts + s * part_stride + 2 * LANES + c * LANES + b * W), acc);
                        V::store(OT + c * LANES + b * W, acc);
                    }
                }
                finish(g, f0, n, OT, lrun);
            }
        }
    }
}


// ---------------------------------------------------------------------------------------------------
// Row form, for few queries per kv head (decode): lanes run along the head dim instead of across
// queries, so no lane idles when a kv head has 1..8 queries. Needs d % W == 0 and dv % W == 0.
//   scores of W keys for one query: W accumulators over d, then V::hsum (transpose-add) -> one vector
//   softmax over the keys of a block (vectors of W keys), O[a] = alpha * O[a] + sum_j p[a][j] V[j]
// Work items are (kv head, key split); each K/V row is read (and converted) once per item.

// ST[j] = q . K[j] for W keys (rows beyond `count` point at a zero row).
template <class V>
static inline void qk_row(const float* __restrict qrow, const float* const* krows, int64_t d, float* __restrict ST) {
    using vec = typename V::vec;
    constexpr int W = V::W;
    vec acc[W];
    LLAISYS_UNROLL for (int r = 0; r < W; ++r) acc[r] = V::zero();
    for (int64_t c = 0; c < d; c += W) {
        const vec qv = V::load(qrow + c);
        LLAISYS_UNROLL for (int r = 0; r < W; ++r) acc[r] = V::fma(qv, V::load(krows[r] + c), acc[r]);
    }
    V::store(ST, V::hsum(acc));
}

// O[c0 .. c0 + CR*W) = alpha * O + sum_j p[j] V[j][c0 ..]
template <class V, int CR>
static inline void pv_row(float* __restrict O, const float* __restrict P, int64_t nb, const float* __restrict Vp,
                          int64_t vstride, int64_t c0, float alpha) {
    using vec = typename V::vec;
    constexpr int W = V::W;
    vec acc[CR];
    const vec a = V::set1(alpha);
    LLAISYS_UNROLL for (int r = 0; r < CR; ++r) acc[r] = V::mul(V::load(O + c0 + r * W), a);
    const float* vrow = Vp + c0;
    for (int64_t j = 0; j < nb; ++j, vrow += vstride) {
        const vec pj = V::bcast(P + j);
        LLAISYS_UNROLL for (int r = 0; r < CR; ++r) acc[r] = V::fma(pj, V::load(vrow + r * W), acc[r]);
    }
    LLAISYS_UNROLL for (int r = 0; r < CR; ++r) V::store(O + c0 + r * W, acc[r]);
}

template <class V>
static inline float vexp1(float x) {
    float tmp[V::W];
    V::store(tmp, vexp<V>(V::set1(x)));
    return tmp[0];
}

// Few queries per kv head: M = L * H / Hkv <= MQ.
template <class V, int MQ, class Cvt, class T>
void attention_rows(const Problem& p) {
    using vec = typename V::vec;
    constexpr int W = V::W, BK = kBlockKeys;
    static_assert(BK % W == 0, "a block holds whole vectors of keys");
    constexpr bool kF32 = sizeof(T) == 4;
    const int64_t L = p.L, S = p.S, H = p.H, Hkv = p.Hkv, d = p.d, dv = p.dv;
    const int64_t G = H / Hkv, M = L * G, off = S - L;
    const float scale = p.scale;
    const T* q = static_cast<const T*>(p.q);
    const T* k = static_cast<const T*>(p.k);
    const T* v = static_cast<const T*>(p.v);
    T* out = static_cast<T*>(p.out);

    const double flops = 2.0 * double(H) * double(L) * (double(S) - 0.5 * double(L - 1)) * double(d + dv);
    const int max_threads = omp_get_max_threads();
    const bool parallel = max_threads > 1 && flops > 4.0e5;
    const int threads = parallel ? max_threads : 1;
    int64_t nsplit = 1;
    if (parallel && Hkv < 4 * threads) {
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
                               round16(2 * MQ) +
                               round16(dmax) + round16(d) + round16(sz_kc) + round16(sz_vc);
    const int64_t part_stride = (2 + dv) * MQ;
    const int64_t part_floats = nsplit > 1 ? items * part_stride : 0;
    float* const base = scratch(0, per_thread * threads + part_floats);
    float* const partial = base + per_thread * threads;

#pragma omp parallel num_threads(threads) if (parallel)
    {
        float* sc = base + per_thread * omp_get_thread_num();
        float* Q = sc; sc += round16(MQ * d);
        float* ST = sc; sc += round16(MQ * BK);
        float* O = sc; sc += round16(MQ * dv);
        float* mrun = sc; sc += round16(MQ);
        float* lrun = sc; sc += round16(MQ);
        int64_t* endq = reinterpret_cast<int64_t*>(sc); sc += round16(2 * MQ);  // MQ int64
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
                Cvt::store_row(row, out + (i * H + h) * dv, dv);
            }
        };

#pragma omp for schedule(dynamic, 1)
        for (int64_t item = 0; item < items; ++item) {
            const int64_t g = item / nsplit, s = item % nsplit;
            for (int64_t a = 0; a < M; ++a) {
                const int64_t i = a / G, h = g * G + a % G;
                Cvt::load_row(q + (i * H + h) * d, row, d);
                for (int64_t c = 0; c < d; ++c) Q[a * d + c] = row[c] * scale;
                endq[a] = i + off + 1;
                mrun[a] = -__builtin_inff();
                lrun[a] = 0.0f;
            }
            for (int64_t x = 0; x < M * dv; ++x) O[x] = 0.0f;
            const int64_t kend = endq[M - 1];
            int64_t ks, ke;
            split_keys<BK>(kend, nsplit, s, ks, ke);

            for (int64_t kb = ks; kb < ke; kb += BK) {
                const int64_t nb = ke - kb < BK ? ke - kb : BK;
                const float *Kp, *Vp;
                int64_t kstride, vstride;
                kv_block<Cvt>(k, v, kb, nb, Hkv, g, d, dv, Kc, Vc, Kp, kstride, Vp, vstride);
                const int64_t nbp = (nb + W - 1) / W * W;
                const float* krows[BK];
                for (int64_t j = 0; j < nbp; ++j) krows[j] = j < nb ? Kp + j * kstride : zero_row;

                for (int64_t a = 0; a < M; ++a) {
                    float* st = ST + a * BK;
                    for (int64_t j = 0; j < nbp; j += W) qk_row<V>(Q + a * d, krows + j, d, st + j);
                    int64_t valid = endq[a] - kb;
                    valid = valid < 0 ? 0 : (valid > nb ? nb : valid);
                    for (int64_t j = valid; j < nbp; ++j) st[j] = -__builtin_inff();

                    vec bmax = V::set1(-__builtin_inff());
                    for (int64_t j = 0; j < nbp; j += W) bmax = V::max(bmax, V::load(st + j));
                    float tmp[W];
                    V::store(tmp, bmax);
                    float mb = tmp[0];
                    for (int x = 1; x < W; ++x) mb = tmp[x] > mb ? tmp[x] : mb;
                    const float mold = mrun[a], mnew = mold > mb ? mold : mb;
                    const float msafe = mnew == -__builtin_inff() ? 0.0f : mnew;
                    const float alpha = vexp1<V>(mold - msafe);
                    const vec mv = V::set1(msafe);
                    vec sum = V::zero();
                    for (int64_t j = 0; j < nbp; j += W) {
                        const vec e = vexp<V>(V::sub(V::load(st + j), mv));
                        V::store(st + j, e);
                        sum = V::add(sum, e);
                    }
                    V::store(tmp, sum);
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
        }

        if (nsplit > 1) {
#pragma omp for schedule(static)
            for (int64_t g = 0; g < Hkv; ++g) {
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
                        const vec wv = V::set1(w);
                        for (int64_t c = 0; c < dv; c += W) V::store(o + c, V::fma(wv, V::load(po + c), V::load(o + c)));
                    }
                    lrun[a] = l;
                }
                finish(g, O, lrun);
            }
        }
    }
}

}  // namespace llaisys::cpu::attn
