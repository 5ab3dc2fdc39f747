// linear for M > kGemvMaxRows: compute bound, Goto/BLIS blocking.
//
// x is packed once per block of rows into micro-panels of MR rows ([k][MR]); threads take (N-block,
// M-block) tiles, pack their weight block per KC slice into micro-panels of NR columns ([k][NR]) with
// in-register transposes (converting f16 / bf16 to f32 once per slice, not once per use), prefetch the next
// slice's weights while the MR x NR register-tiled micro-kernel runs on this one, accumulate in an f32 tile
// buffer, and finally add the bias and round once to the output dtype. A kernel type (F32Kernel here,
// Bf16DotKernel in linear_bf16dot.h) provides the packing and the micro-kernel.
#pragma once

#include <atomic>

#include "linear.h"
#include "linear_gemv.h"

namespace llaisys::cpu::LLAISYS_ISA {

// dst[s][L] (s < steps) = value s of row j (j < rows; zero for j >= rows), through W x W in-register
// transposes of V. row(j, s0, n) returns values [s0, s0 + n) of row j as a V (n <= W, zero beyond n).
// Values are 32-bit: f32, or (for the bf16 dot kernel) pairs of bf16 carried in f32 lanes.
template <class V, int L, class Row>
LLAISYS_ALWAYS_INLINE void pack_transposed(int rows, int64_t steps, void* dst_, Row&& row) {
    constexpr int W = V::W;
    float* dst = static_cast<float*>(dst_);
    for (int64_t s0 = 0; s0 < steps; s0 += W) {
        const int64_t n = std::min<int64_t>(W, steps - s0);
        for (int j0 = 0; j0 < L; j0 += W) {
            const int cols = std::min(W, L - j0);
            // (the loops unrolled: v then lives in registers, not on the stack)
            V v[W];
#pragma GCC unroll 16
            for (int j = 0; j < W; ++j) v[j] = j0 + j < rows ? row(j0 + j, s0, int(n)) : V::zero();
            transpose(v);
            float* d = dst + s0 * L + j0;
            if (cols == W) {
#pragma GCC unroll 16
                for (int i = 0; i < W; ++i)
                    if (i < n) v[i].store(d + i * L);
            } else {
#pragma GCC unroll 16
                for (int i = 0; i < W; ++i)
                    if (i < n) v[i].store_partial(d + i * L, cols);
            }
        }
    }
}

// The f32 micro-kernel family: packed A [ks][MR] f32, packed B [ks][NR] f32, NR = NV vectors of V.
// c (ldc) receives the MR x NR tile: c = A*B (accumulate=false) or c += A*B.
template <class V, int MR_, int NV_, int KC_, int NC_>
struct F32Kernel {
    using P = float;
    static constexpr int MR = MR_, NR = NV_ * V::W, KU = 1, KC = KC_, NC = NC_;

    // The GEMV in this kernel's arithmetic (linear_gemv.h): x as f32 rows, weights widened in registers.
    using Lanes = V;
    using GemvX = float;
    static int64_t gemv_x_stride(int64_t K) { return K; }
    template <class T>
    static const float* gemv_x(const T* x, int64_t M, int64_t K, float* buf) {
        if constexpr (std::is_same_v<T, float>) {
            return x;
        } else {
            convert(x, buf, M * K);
            return buf;
        }
    }
    template <int MM, class T>
    static void gemv_block(const T* w, int64_t K, int rows, const float* x, int64_t ldx, V (&total)[MM]) {
        gemv_block_f32<V, KC, MM>(w, K, rows, x, ldx, total);
    }

    static void micro(int64_t ks, const P* __restrict a, const P* __restrict b, float* __restrict c, int64_t ldc,
                      bool accumulate) {
        constexpr int W = V::W;
        V acc[MR][NV_];
#pragma GCC unroll 16
        for (int i = 0; i < MR; ++i)
#pragma GCC unroll 4
            for (int v = 0; v < NV_; ++v) acc[i][v] = V::zero();
        for (int64_t k = 0; k < ks; ++k) {
            V bv[NV_];
#pragma GCC unroll 4
            for (int v = 0; v < NV_; ++v) bv[v] = V::load(b + v * W);
#pragma GCC unroll 16
            for (int i = 0; i < MR; ++i) {
                const V ai = V::set1(a[i]);
#pragma GCC unroll 4
                for (int v = 0; v < NV_; ++v) acc[i][v] = fmadd(ai, bv[v], acc[i][v]);
            }
            a += MR;
            b += NR;
        }
#pragma GCC unroll 16
        for (int i = 0; i < MR; ++i)
#pragma GCC unroll 4
            for (int v = 0; v < NV_; ++v) {
                float* p = c + i * ldc + v * W;
                (accumulate ? acc[i][v] + V::load(p) : acc[i][v]).store(p);
            }
    }

    // dst [kc][MR]: rows [0, rows) of src (stride ld), k in [0, kc), as f32; missing rows are zero.
    template <class T>
    static void pack_a(const T* src, int64_t ld, int rows, int64_t kc, P* dst) {
        pack_transposed<V, MR>(rows, kc, dst, [&](int j, int64_t k0, int n) {
            return n == V::W ? V::load(src + j * ld + k0) : V::load_partial(src + j * ld + k0, n);
        });
    }
    // dst [kc][NR] from weight rows [0, rows) (stride ld), k in [0, kc); missing rows are zero.
    template <class T>
    static void pack_b(const T* src, int64_t ld, int rows, int64_t kc, P* dst) {
        pack_transposed<V, NR>(rows, kc, dst, [&](int j, int64_t k0, int n) {
            const T* p = src + j * ld + k0;
            __builtin_prefetch(p + 8 * V::W);  // weights stream from memory: one row = one stream
            return n == V::W ? V::load(p) : V::load_partial(p, n);
        });
    }
};

// Prefetches `rows` rows of `row_bytes` bytes (stride ld_bytes) into L2, a share per step() over `steps` calls.
struct RowPrefetcher {
    const char* base = nullptr;
    int64_t ld = 0, rows = 0, row_bytes = 0, per_step = 0, r = 0, off = 0;
    RowPrefetcher() = default;
    RowPrefetcher(const void* p, int64_t ld_bytes, int64_t nrows, int64_t nbytes, int64_t steps)
        : base(static_cast<const char*>(p)), ld(ld_bytes), rows(nrows), row_bytes(nbytes) {
        per_step = ceil_div(rows * ceil_div(row_bytes, 64), std::max<int64_t>(steps, 1)) + 1;
    }
    LLAISYS_ALWAYS_INLINE void step() {
        for (int64_t i = 0; i < per_step && r < rows; ++i) {
            __builtin_prefetch(base + r * ld + off, 0, 2);
            off += 64;
            if (off >= row_bytes) {
                off = 0;
                ++r;
            }
        }
    }
};

// Kern: the packing and micro-kernel (F32Kernel<V, ...> or Bf16DotKernel); V rounds the output rows.
template <class V, class Kern, class T>
void gemm(const LinearArgs& a) {
    using P = typename Kern::P;
    constexpr int MR = Kern::MR, NR = Kern::NR, KU = Kern::KU;
    const int64_t M = a.M, N = a.N, K = a.K;
    const T* x = static_cast<const T*>(a.x);
    const T* w = static_cast<const T*>(a.weight);
    const T* bias = static_cast<const T*>(a.bias);
    T* out = static_cast<T*>(a.out);

    const int64_t Ks = ceil_div(K, KU);                             // packed k steps of the whole K
    const int64_t kc_steps = std::min<int64_t>(Ks, Kern::KC / KU);  // k steps per KC slice
    const int threads = omp_get_max_threads();
    // Rows of x packed at once (bounded memory: <= ~16 MiB of packed x), a multiple of MR.
    const int64_t ms_cap = std::max<int64_t>(MR * 4, ((int64_t(16) << 20) / (Ks * KU * int64_t(sizeof(P)) + 1)) / MR * MR);
    const bool parallel = threads > 1 && M * N * K >= (int64_t(1) << 18);

    for (int64_t m0 = 0; m0 < M; m0 += ms_cap) {
        const int64_t ms = std::min(ms_cap, M - m0);
        const int64_t panels = ceil_div(ms, MR);
        P* apack = scratch(kSlotA).get<P>(size_t(panels * Ks * MR));

        // Tiles: NC columns x MT panels of rows. Shrink until every thread gets a few tiles.
        int64_t nc = std::min<int64_t>(Kern::NC, round_up(N, NR));
        int64_t mt = panels;
        auto tiles = [&] { return ceil_div(N, nc) * ceil_div(panels, mt); };
        const int64_t want = parallel ? int64_t(threads) * 3 : 1;
        while (tiles() < want) {
            if (nc > 4 * NR && (nc >= mt * MR || mt <= 2)) nc = round_up(nc / 2, NR);
            else if (mt > 2) mt = ceil_div(mt, 2);
            else break;
        }
        const int64_t n_tiles = ceil_div(N, nc), m_tiles = ceil_div(panels, mt), total_tiles = n_tiles * m_tiles;
        std::atomic<int64_t> next_tile{0};

        ErrorSlot err;
#pragma omp parallel if (parallel)
        {
            // Allocate first; every thread then enters every worksharing loop (skipping the work if its
            // allocation failed), so an exception can never leave a thread waiting at a barrier.
            P* bpack = nullptr;
            float* cbuf = nullptr;
            const int64_t ldc = nc;
            err.run([&] {
                bpack = scratch(kSlotB).get<P>(size_t(nc * kc_steps));
                cbuf = scratch(kSlotC).get<float>(size_t(mt * MR * ldc));
            });
            const bool ok = bpack && cbuf;
#pragma omp for schedule(static)
            for (int64_t p = 0; p < panels; ++p) {
                if (!ok) continue;
                const int64_t r0 = m0 + p * MR;
                Kern::pack_a(x + r0 * K, K, int(std::min<int64_t>(MR, M - r0)), K, apack + p * Ks * MR);
            }
            // (implicit barrier: apack is complete)
            // Tiles are claimed one at a time from a shared counter (other processes may hold a core),
            // and the next one is claimed before the last slice of the current one, so that slice can
            // prefetch the next tile's first weight slice.
            int64_t t = ok ? next_tile.fetch_add(1, std::memory_order_relaxed) : total_tiles;
            while (t < total_tiles) {
                int64_t t_next = total_tiles;
                const int64_t jt = t / m_tiles, it = t % m_tiles;
                const int64_t n0 = jt * nc, ncols = std::min(nc, N - n0);
                const int64_t p0 = it * mt, np = std::min(mt, panels - p0);
                const int64_t jpanels = ceil_div(ncols, NR);
                for (int64_t s0 = 0; s0 < Ks; s0 += kc_steps) {
                    const int64_t ks = std::min(kc_steps, Ks - s0);
                    const int64_t k0 = s0 * KU, kc = std::min(ks * KU, K - k0);
                    for (int64_t jp = 0; jp < jpanels; ++jp) {
                        const int64_t r = n0 + jp * NR;
                        Kern::pack_b(w + r * K + k0, K, int(std::min<int64_t>(NR, N - r)), kc,
                                     bpack + jp * ks * NR);
                    }
                    // While this slice computes, pull the weights of the next slice (or of the next tile's
                    // first slice) towards L2, spread over the micro-kernel calls: packing then reads from
                    // cache instead of waiting on DRAM.
                    RowPrefetcher next;
                    if (s0 + ks < Ks) {
                        const int64_t next_k0 = k0 + kc, next_kc = std::min(kc_steps * KU, K - next_k0);
                        next = RowPrefetcher(w + n0 * K + next_k0, K * int64_t(sizeof(T)), ncols,
                                             next_kc * int64_t(sizeof(T)), np * jpanels);
                    } else {
                        t_next = next_tile.fetch_add(1, std::memory_order_relaxed);
                        if (t_next < total_tiles) {
                            const int64_t next_n0 = (t_next / m_tiles) * nc;
                            next = RowPrefetcher(w + next_n0 * K, K * int64_t(sizeof(T)), std::min(nc, N - next_n0),
                                                 std::min(kc_steps * KU, K) * int64_t(sizeof(T)), np * jpanels);
                        }
                    }
                    for (int64_t ip = 0; ip < np; ++ip) {
                        const P* ap = apack + ((p0 + ip) * Ks + s0) * MR;
                        for (int64_t jp = 0; jp < jpanels; ++jp) {
                            next.step();
                            Kern::micro(ks, ap, bpack + jp * ks * NR, cbuf + ip * MR * ldc + jp * NR, ldc, s0 > 0);
                        }
                    }
                }
                const int64_t rows = std::min(np * MR, ms - p0 * MR);
                for (int64_t i = 0; i < rows; ++i) {
                    const int64_t row = m0 + p0 * MR + i;
                    store_row<V>(out + row * N + n0, cbuf + i * ldc, bias ? bias + n0 : nullptr, ncols);
                }
                t = t_next;
            }
        }
        err.rethrow();
    }
}

}  // namespace llaisys::cpu::LLAISYS_ISA
